"""SshTarget (= SystemdTarget over SSH) against a real systemd host: an nspawn container.

One container boots per module (tests/harness/hosts.py); each test uses its own unit names. The
local SystemdTarget runs the same code through a subprocess runner; it is not tested here
because systemd is not PID 1 on this machine (the container is where a systemd runs).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import asyncssh
import httpx
import pytest

from flagtrial.errors import LockHeldError, TargetError
from flagtrial.launch.spec import LaunchSpec
from flagtrial.targets.base import ServerState
from flagtrial.targets.process import ProcessTarget
from flagtrial.targets.ssh import SshTarget
from flagtrial.targets.systemd import LOCK_DIR, START_LIMIT_LINE, SystemdTarget
from harness.hosts import (
    TEST_KEY,
    SystemdHost,
    llama_unit,
    require_root,
    shared_dir_with,
    systemd_host,
)

# What it asserts rests on the server's facts, crashes, bounds and files, never on a
# measured difference: may run beside another module (harness/machine.py).
pytestmark = [pytest.mark.slow, pytest.mark.shares_machine]

N = 11  # this module's container: ft-11 at 10.200.11.2


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path, tiny_model: Path
) -> Path:
    require_root()
    return shared_dir_with(tmp_path_factory.mktemp("shared"), llama_server_bin, tiny_model)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, shared: Path) -> Iterator[SystemdHost]:
    with systemd_host(N, shared, tmp_path_factory.mktemp("ft-host")) as h:
        yield h


def target(host: SystemdHost, unit: str = "llama.service", **kwargs: object) -> SshTarget:
    # ssh_config=[]: the machine's own ~/.ssh/config must not change what the tests do.
    options: dict[str, object] = {
        "known_hosts": host.known_hosts,
        "client_keys": [TEST_KEY],
        "ssh_config": [],
        **kwargs,
    }
    return SshTarget(host.url, unit, **options)  # type: ignore[arg-type]


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())


async def wait_state(
    t: SshTarget, done: Callable[[ServerState], bool], timeout_s: float = 20.0
) -> ServerState:
    deadline = time.monotonic() + timeout_s
    while True:
        state = await t.state()
        if done(state) or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.1)


async def wait_healthy(endpoint: str, timeout_s: float = 30.0) -> httpx.Response:
    """/props once /health answers 200 (only ever the container's address)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() < deadline:
            try:
                if (await client.get(f"{endpoint}/health")).status_code == 200:
                    return await client.get(f"{endpoint}/props")
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{endpoint} not healthy")


def with_flag(spec: LaunchSpec, flag: str, value: str) -> LaunchSpec:
    argv = spec.argv
    argv[argv.index(flag) + 1] = value
    return spec.with_argv(argv)


def test_restart_runs_new_spec_and_logs_only_new_start(host: SystemdHost) -> None:
    host.install_unit("llama.service", llama_unit("-np 4"))

    async def body() -> None:
        t = target(host)
        try:
            assert t.name == f"ssh://root@{host.addr}/llama.service"
            spec = await t.read_spec()
            assert spec.text == llama_unit("-np 4")
            await t.restart()
            state = await wait_state(t, lambda s: s.status == "running")
            assert state.status == "running" and state.pid
            assert (await wait_healthy(host.endpoint)).json()["total_slots"] == 4

            new = with_flag(spec, "-np", "2")
            await t.install_spec(new)
            assert host.read("/etc/systemd/system/llama.service") == new.text.encode()
            assert (
                host.sh("systemctl show -p NeedDaemonReload --value llama.service").stdout.strip()
                == "no"
            )
            mark = await t.restart()
            # restart() returns only once the old instance is gone: never its PID as running.
            after = await t.state()
            assert not (after.status == "running" and after.pid == state.pid)
            assert (await wait_state(t, lambda s: s.status == "running")).status == "running"
            assert (await wait_healthy(host.endpoint)).json()["total_slots"] == 2
            assert (await t.read_spec()).text == new.text
            log = await t.logs_since(mark)
            assert "n_slots = 2" in log
            assert "n_slots = 4" not in log  # the previous start's lines are before the mark
        finally:
            await t.aclose()
            host.reset_unit("llama.service")

    run(body)


def test_install_is_byte_identical_and_atomic(host: SystemdHost) -> None:
    # Big enough that a non-atomic write would be seen half-written by a reader.
    filler = "".join(f"# filler line {i} {'x' * 60}\n" for i in range(4000))
    old = f"[Service]\nExecStart=/bin/sleep 1000\n{filler}"
    host.install_unit("atomic.service", old)
    path = "/etc/systemd/system/atomic.service"

    async def body() -> None:
        t = target(host, "atomic.service")
        reader = subprocess.Popen(
            [
                "nsenter",
                "-t",
                str(host.leader),
                "-a",
                "sh",
                "-c",
                'while [ ! -e /tmp/stop-reader ]; do cat "$1" | md5sum; done',
                "sh",
                path,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            spec = await t.read_spec()
            assert spec.text == old
            # A non-ASCII byte and a missing final newline must survive the trip exactly.
            new = LaunchSpec(
                kind="unit",
                text=spec.text.replace("sleep 1000", "sleep 2000")
                + "# café, no newline at the end",
            )
            for i in range(8):
                await t.install_spec(new if i % 2 == 0 else spec)
            await t.install_spec(new)
            assert host.read(path) == new.text.encode()
            assert host.sh('ls -a "$1"', "/etc/systemd/system").stdout.count("flagtrial-tmp") == 0
        finally:
            host.sh("touch /tmp/stop-reader")
            out, _ = reader.communicate(timeout=10)
            host.sh("rm -f /tmp/stop-reader")
            await t.aclose()
        seen = {line.split()[0] for line in out.splitlines()}
        md5 = {hashlib.md5(text.encode()).hexdigest() for text in (old, new.text)}
        assert seen and seen <= md5, "a reader saw a file that was neither the old nor the new"

    run(body)


def test_failed_install_raises_and_leaves_old_file(host: SystemdHost, shared: Path) -> None:
    # /opt/shared is a read-only mount inside the container: the write itself fails.
    unit_text = "[Service]\nExecStart=/bin/true\n"
    (shared / "ro.service").write_text(unit_text)

    async def body() -> None:
        t = target(host, "ro.service", spec_path="/opt/shared/ro.service")
        try:
            spec = await t.read_spec()
            with pytest.raises(TargetError, match="Read-only file system"):
                await t.install_spec(LaunchSpec(kind="unit", text=spec.text + "# more\n"))
            assert host.read("/opt/shared/ro.service") == unit_text.encode()
        finally:
            await t.aclose()

    run(body)


def test_dropin_is_read_and_installed_instead_of_unit(host: SystemdHost) -> None:
    host.install_unit("llama.service", llama_unit("-np 4"))
    dropin = "/etc/systemd/system/llama.service.d/flagtrial.conf"
    host.install_unit(
        "llama.service.d/flagtrial.conf",
        (
            "[Service]\nExecStart=\nExecStart=/opt/shared/llama-server -m /opt/shared/tiny.gguf "
            "--host 0.0.0.0 --port 8080 -t 1 -c 2048 -np 3\n"
        ),
    )

    async def body() -> None:
        t = target(host, spec_path=dropin)
        try:
            spec = await t.read_spec()
            assert spec.dropin and spec.argv[-2:] == ["-np", "3"]
            await t.install_spec(with_flag(spec, "-np", "2"))
            await t.restart()
            assert (await wait_healthy(host.endpoint)).json()["total_slots"] == 2
            assert host.read("/etc/systemd/system/llama.service") == llama_unit("-np 4").encode()
        finally:
            await t.aclose()
            host.sh('rm -rf "$1" && systemctl daemon-reload', f"{dropin}/..")
            host.reset_unit("llama.service")

    run(body)


def crash_unit(extra_service: str = "", extra_unit: str = "") -> str:
    return (
        f"[Unit]\n{extra_unit}\n[Service]\n"
        "ExecStart=/opt/shared/llama-server -m /opt/shared/missing.gguf --port 8081 -t 1\n"
        f"{extra_service}"
    )


def test_server_that_exits_at_start_is_failed(host: SystemdHost) -> None:
    host.install_unit("crash.service", crash_unit())

    async def body() -> None:
        t = target(host, "crash.service")
        try:
            mark = await t.restart()
            state = await wait_state(t, lambda s: s.status == "failed")
            assert state.status == "failed" and state.exit_code == 1
            assert not state.restart_loop
            assert "failed to load model" in await t.logs_since(mark)
        finally:
            await t.aclose()
            host.reset_unit("crash.service")

    run(body)


def test_restart_loop_is_seen_and_a_fixed_spec_starts_after_it(host: SystemdHost) -> None:
    host.install_unit(
        "loop.service",
        crash_unit(
            "Restart=on-failure\nRestartSec=100ms\n",
            "StartLimitIntervalSec=60\nStartLimitBurst=2\n",
        ),
    )

    async def body() -> None:
        t = target(host, "loop.service")
        try:
            mark = await t.restart()
            state = await wait_state(t, lambda s: s.status == "failed")
            # Burst 2 stops after 2 restarts: only the journal's start-limit line tells.
            assert state.status == "failed" and state.restart_loop and state.exit_code == 1
            assert START_LIMIT_LINE in await t.logs_since(mark)
            # The start limit must not block the next trial's restart (reset-failed).
            spec = await t.read_spec()
            await t.install_spec(with_flag(spec, "-m", "/opt/shared/tiny.gguf"))
            await t.restart()
            state = await wait_state(t, lambda s: s.status == "running")
            assert state.status == "running" and not state.restart_loop
        finally:
            await t.aclose()
            host.reset_unit("loop.service")

    run(body)


def test_changed_host_key_is_refused(host: SystemdHost, tmp_path: Path) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"{host.addr} {other}")

    async def body() -> None:
        for accept_new in (False, True):  # accept_new never covers a changed key
            t = target(host, known_hosts=known_hosts, accept_new_host_key=accept_new)
            with pytest.raises(TargetError, match=r"host key for .* changed.*refusing"):
                await t.run(["true"])
            await t.aclose()
        assert known_hosts.read_text() == f"{host.addr} {other}"

    run(body)


def test_unknown_host_needs_accept_new(host: SystemdHost, tmp_path: Path) -> None:
    known_hosts = tmp_path / "ssh" / "known_hosts"

    async def body() -> None:
        t = target(host, known_hosts=known_hosts)
        with pytest.raises(TargetError, match="unknown"):
            await t.run(["true"])
        await t.aclose()
        assert not known_hosts.exists()
        t = target(host, known_hosts=known_hosts, accept_new_host_key=True)
        assert await t.run(["echo", "hi"]) == (0, "hi\n")
        await t.aclose()
        # It appended the key it was offered, which now verifies strictly.
        assert known_hosts.read_text().startswith(f"{host.addr} ")
        t = target(host, known_hosts=known_hosts)
        assert (await t.run(["true"]))[0] == 0
        await t.aclose()

    run(body)


def test_unreachable_host_fails_fast_with_one_line(host: SystemdHost) -> None:
    async def body() -> None:
        for url, timeout in (
            (f"ssh://root@{host.addr}:2", 10.0),  # nothing listens there
            (f"ssh://root@10.200.{N}.3", 2.0),
        ):  # no such host on the veth
            t = SshTarget(
                url,
                "llama.service",
                known_hosts=host.known_hosts,
                client_keys=[TEST_KEY],
                ssh_config=[],
                connect_timeout_s=timeout,
            )
            start = time.monotonic()
            with pytest.raises(TargetError) as info:
                await t.state()
            # fast: within its timeout, with room for a busy machine's scheduling
            assert time.monotonic() - start < timeout + 5.0
            assert "\n" not in str(info.value) and str(info.value)

    run(body)


def test_held_lock_is_refused_naming_the_holder(host: SystemdHost) -> None:
    async def body() -> None:
        a, b = target(host), target(host)
        try:
            async with a.lock("trial 7 of alice"):
                with pytest.raises(LockHeldError, match="trial 7 of alice"):
                    async with b.lock("bob"):
                        pass
            async with b.lock("bob"):
                pass
        finally:
            await a.aclose()
            await b.aclose()

    run(body)


HOLDER = """
import asyncio, sys
from pathlib import Path
from flagtrial.targets.ssh import SshTarget

async def main() -> None:
    t = SshTarget(sys.argv[1], "llama.service", known_hosts=Path(sys.argv[2]),
                  client_keys=[Path(sys.argv[3])], ssh_config=[])
    async with t.lock("doomed holder"):
        print("held", flush=True)
        await asyncio.sleep(600)

asyncio.run(main())
"""


def test_lock_is_released_when_the_holder_dies(host: SystemdHost) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, host.url, str(host.known_hosts), str(TEST_KEY)],
        stdout=subprocess.PIPE,
        text=True,
    )

    async def body() -> None:
        t = target(host)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            with pytest.raises(LockHeldError, match="doomed holder"):
                async with t.lock("successor"):
                    pass
            holder.kill()  # no clean release: only the dropped connection frees the lock
            holder.wait()
            deadline = time.monotonic() + 10.0
            while True:
                try:
                    async with t.lock("successor"):
                        return
                except LockHeldError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
        finally:
            await t.aclose()

    try:
        run(body)
    finally:
        holder.kill()
        holder.wait()


def test_dropped_connection_is_reopened_and_the_lock_retaken(host: SystemdHost) -> None:
    async def body() -> None:
        t, other = target(host), target(host)
        try:
            # Dropped under a running command: the command runs again on a new connection.
            job = asyncio.create_task(t.run(["sh", "-c", "sleep 1; echo done"]))
            await asyncio.sleep(0.5)
            await asyncio.to_thread(host.kill_ssh_sessions)
            assert await job == (0, "done\n")
            # Dropped while holding the lock: the host freed it, the next call takes it again.
            async with t.lock("keeper"):
                await asyncio.to_thread(host.kill_ssh_sessions)
                await asyncio.sleep(0.3)
                assert await t.run(["echo", "back"]) == (0, "back\n")
                with pytest.raises(LockHeldError, match="keeper"):
                    async with other.lock("intruder"):
                        pass
        finally:
            await t.aclose()
            await other.aclose()

    run(body)


HOSTILE = [
    "$(touch /tmp/pwned)",
    "`touch /tmp/pwned`",
    "; touch /tmp/pwned",
    "' ; touch /tmp/pwned; '",
    '"; touch /tmp/pwned; "',
    "a\nb && touch /tmp/pwned",
]


def test_hostile_values_are_never_interpreted(host: SystemdHost) -> None:
    async def body() -> None:
        t = target(host)
        try:
            for value in HOSTILE:
                assert await t.run(["echo", value]) == (0, value + "\n")
            assert await t.run(["cat"], timeout_s=5) == (0, "")  # stdin is at EOF, no hang
            async with t.lock("$(touch /tmp/pwned)"):
                with pytest.raises(LockHeldError, match=r"\$\(touch /tmp/pwned\)"):
                    async with target(host).lock("x"):
                        pass
        finally:
            await t.aclose()
        assert host.sh("test -e /tmp/pwned", check=False).returncode == 1

    run(body)


def test_host_facts_report_no_gpu(host: SystemdHost) -> None:
    async def body() -> None:
        t = target(host)
        try:
            facts = await t.host_facts()
        finally:
            await t.aclose()
        assert facts.hostname == host.name and facts.cpus >= 1 and facts.gpus == []
        assert facts.kernel

    run(body)


def test_ssh_config_alias_and_proxy_jump(host: SystemdHost, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host ft-direct\n  HostName {host.addr}\n  User root\n  IdentityFile {TEST_KEY}\n"
        f"  UserKnownHostsFile {host.known_hosts}\n"
        f"Host ft-jumped\n  HostName {host.addr}\n  User root\n  IdentityFile {TEST_KEY}\n"
        "  ProxyJump ft-direct\n"
    )

    async def client_addr(alias: str) -> str:
        t = SshTarget(
            f"ssh://{alias}", "llama.service", known_hosts=host.known_hosts, ssh_config=[config]
        )
        try:
            rc, out = await t.run(["sh", "-c", 'echo "$SSH_CONNECTION"'])
        finally:
            await t.aclose()
        assert rc == 0
        return out.split()[0]

    async def body() -> None:
        assert await client_addr("ft-direct") == f"10.200.{N}.1"
        # Through the jump host (the container itself), the session comes from inside it.
        assert await client_addr("ft-jumped") == host.addr

    run(body)


def test_local_target_runs_and_locks_without_systemd(tmp_path: Path) -> None:
    """The local runner's half of SystemdTarget, on this machine where systemd is not PID 1."""
    require_root()  # the lock lives under /run
    unit = f"flagtrial-test-{os.getpid()}.service"
    pwned = tmp_path / "pwned"

    async def body() -> None:
        a, b = SystemdTarget(unit), SystemdTarget(unit)
        assert a.name == f"systemd:{unit}"
        async with a.lock("local alice"):
            with pytest.raises(LockHeldError, match="local alice"):
                async with b.lock("bob"):
                    pass
        async with b.lock("bob"):
            pass
        for value in (f"$(touch {pwned})", f"; touch {pwned}"):
            assert await a.run(["echo", value]) == (0, value + "\n")
        assert (await a.host_facts()).cpus >= 1
        # Without a systemd to ask, systemctl's refusal is a one-line TargetError.
        with pytest.raises(TargetError, match="systemctl show"):
            await a.state()

    try:
        run(body)
    finally:
        for suffix in (".lock", ".holder"):
            Path(f"{LOCK_DIR}/{unit}{suffix}").unlink(missing_ok=True)
    assert not pwned.exists()


def env_unit(env_file: str) -> str:
    """A unit that prints the two variables it starts with, then idles."""
    return (
        "[Unit]\nDescription=flagtrial environment test\n\n[Service]\n"
        "Environment=FT_X=unit FT_Y=unit\n"
        f"EnvironmentFile={env_file}\nEnvironmentFile=-/nonexistent/ft-env\n"
        "ExecStart=/bin/sh -c 'echo FT_X=$$FT_X FT_Y=$$FT_Y; exec sleep 600'\n"
    )


async def logged(t: SshTarget | ProcessTarget, mark: str, text: str) -> str:
    """The log since `mark` once it holds `text` (or after 10 s)."""
    deadline = time.monotonic() + 10
    while text not in (log := await t.logs_since(mark)) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return log


def test_both_targets_read_the_environment_systemd_starts_a_unit_with(
    host: SystemdHost, tmp_path: Path
) -> None:
    """A variable set by Environment= and by an EnvironmentFile= gets the file's value
    (systemd.exec: settings from the files override Environment=); a missing optional file
    is skipped. The SSH target reads the environment (what the gate analysis gets) as
    systemd then starts the unit with, and so does the process target, which starts its
    server with it too."""
    host.sh("printf 'FT_X=file\\n' > /etc/ft-env")
    host.install_unit("ftenv.service", env_unit("/etc/ft-env"))
    local_file = tmp_path / "ft-env"
    local_file.write_text("FT_X=file\n")
    local_unit = tmp_path / "ftenv.service"
    local_unit.write_text(env_unit(str(local_file)))
    seen = "FT_X=file FT_Y=unit"

    async def body() -> None:
        t = target(host, "ftenv.service")
        local = ProcessTarget(local_unit, tmp_path / "state")
        try:
            env = await t.environment(await t.read_spec())
            assert (env["FT_X"], env["FT_Y"]) == ("file", "unit")
            mark = await t.restart()
            assert (await wait_state(t, lambda s: s.status == "running")).status == "running"
            assert seen in await logged(t, mark, seen)  # what systemd gave the unit

            env = await local.environment(await local.read_spec())
            assert (env["FT_X"], env["FT_Y"]) == ("file", "unit")
            assert seen in await logged(local, await local.restart(), seen)
        finally:
            await local.stop()
            await t.aclose()
            host.reset_unit("ftenv.service")

    run(body)
