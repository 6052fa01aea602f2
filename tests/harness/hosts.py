"""Real systemd hosts for tests: systemd-nspawn containers on their own network namespace.

`systemd_host(n, shared_dir, workdir)` boots the root that scripts/make-test-root.sh builds
as machine `ft-N` at 10.200.N.2 (this machine is 10.200.N.1 on a veth pair), with its own
systemd, journald and sshd, and `shared_dir` mounted read-only at /opt/shared (and each of
`binds` read-only at its own path: a venv's absolute paths and shebangs work inside as they do
here). Tests reach
it over SSH with the test key and a known_hosts file that holds its real host key, so host
keys are checked strictly. Traffic goes only to that address.

Needs root; `require_root()` skips the test otherwise. A container left by a killed test run
(recorded in /run/flagtrial-test/) is stopped before the same N boots again.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flagtrial.cache import cache_root
from harness.project import write_project_file

REPO = Path(__file__).resolve().parents[2]
CACHE = cache_root()
TEST_KEY = CACHE / "test-ssh" / "id_ed25519"
PID_DIR = Path("/run/flagtrial-test")
BOOT_TIMEOUT_S = 60.0
LLAMA_PORT = 8080


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("systemd-nspawn test hosts need root (CI runs as root)")


def container_root() -> Path:
    """The cached container root, built on first use (about a minute)."""
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "make-test-root.sh")],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def llama_unit(args: str = "-np 4", *, extra_service: str = "", extra_unit: str = "") -> str:
    """A llama.service running the shared llama-server on the shared tiny model."""
    return (
        "[Unit]\n"
        "Description=llama-server (flagtrial test)\n"
        f"{extra_unit}"
        "\n[Service]\n"
        "ExecStart=/opt/shared/llama-server -m /opt/shared/tiny.gguf --host 0.0.0.0 "
        f"--port {LLAMA_PORT} -t 1 -c 2048 {args}\n"
        f"{extra_service}"
    )


@dataclass
class SystemdHost:
    n: int
    nspawn: subprocess.Popen[bytes]
    leader: int  # the container's PID 1, as this machine sees it
    known_hosts: Path
    console_log: Path

    @property
    def name(self) -> str:
        return f"ft-{self.n}"

    @property
    def addr(self) -> str:
        return f"10.200.{self.n}.2"

    @property
    def url(self) -> str:
        return f"ssh://root@{self.addr}"

    @property
    def endpoint(self) -> str:
        return f"http://{self.addr}:{LLAMA_PORT}"

    def sh(
        self, script: str, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a shell script inside the container (not over SSH); args are $1, $2, ..."""
        return subprocess.run(
            ["nsenter", "-t", str(self.leader), "-a", "sh", "-c", script, "sh", *args],
            input=input,
            check=check,
            capture_output=True,
            text=True,
        )

    def read(self, path: str) -> bytes:
        return subprocess.run(
            ["nsenter", "-t", str(self.leader), "-a", "cat", "--", path],
            check=True,
            capture_output=True,
        ).stdout

    def install_unit(self, name: str, text: str) -> None:
        """Write /etc/systemd/system/NAME and reload systemd."""
        self.sh(
            'mkdir -p -- "$(dirname -- "$1")" && cat >"$1" && systemctl daemon-reload',
            f"/etc/systemd/system/{name}",
            input=text,
        )

    def reset_unit(self, name: str) -> None:
        """Stop a unit and forget its failures, so the next test starts clean."""
        self.sh('systemctl stop -- "$1"; systemctl reset-failed -- "$1"; true', name)

    def kill_ssh_sessions(self) -> None:
        """Kill every SSH session's processes (not sshd itself): their clients see the
        connection drop, as when a network or a host end breaks it."""
        self.sh(
            "main=$(systemctl show -p MainPID --value ssh.service); "
            'for p in $(cat /proc/"$main"/task/"$main"/children); do kill -KILL "$p"; done'
        )


def _stop_leftover(name: str) -> None:
    """Stop an nspawn that a killed test run left, by the PID it recorded."""
    pid_file = PID_DIR / f"{name}.pid"
    try:
        pid = int(pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        pid_file.unlink(missing_ok=True)
        return
    if b"systemd-nspawn" in cmdline[0] and name.encode() in cmdline:
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if not Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.05)
    pid_file.unlink(missing_ok=True)


def _remove_network(n: int) -> None:
    _sh("ip", "link", "del", f"vh-ft{n}", check=False)
    _sh("ip", "netns", "del", f"ft-{n}", check=False)


def _make_network(n: int) -> None:
    name, host_if, cont_if = f"ft-{n}", f"vh-ft{n}", f"vc-ft{n}"
    _sh("ip", "netns", "add", name)
    _sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", cont_if)
    _sh("ip", "link", "set", cont_if, "netns", name)
    _sh("ip", "addr", "add", f"10.200.{n}.1/24", "dev", host_if)
    _sh("ip", "link", "set", host_if, "up")
    _sh("ip", "-n", name, "addr", "add", f"10.200.{n}.2/24", "dev", cont_if)
    _sh("ip", "-n", name, "link", "set", cont_if, "up")
    _sh("ip", "-n", name, "link", "set", "lo", "up")


def _wait_leader(nspawn: subprocess.Popen[bytes], deadline: float) -> int:
    """The container's PID 1: nspawn's child once it runs systemd."""
    children = Path(f"/proc/{nspawn.pid}/task/{nspawn.pid}/children")
    while time.monotonic() < deadline:
        if nspawn.poll() is not None:
            raise RuntimeError(f"systemd-nspawn exited with {nspawn.returncode}")
        with contextlib.suppress(OSError):
            for pid in children.read_text().split():
                if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                    return int(pid)
        time.sleep(0.05)
    raise TimeoutError("systemd did not start in the container")


def _wait_booted(leader: int, deadline: float) -> None:
    state = ""
    while time.monotonic() < deadline:
        state = _sh(
            "nsenter", "-t", str(leader), "-a", "systemctl", "is-system-running", check=False
        ).stdout.strip()
        # degraded: some unit we do not need failed; the host is up all the same.
        if state in ("running", "degraded"):
            return
        time.sleep(0.1)
    raise TimeoutError(f"container not booted (is-system-running: {state or 'no answer'})")


def _wait_port(addr: str, port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=1.0) as s:
                if s.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"sshd not listening on {addr}:{port}")


@contextlib.contextmanager
def systemd_host(
    n: int, shared_dir: Path, workdir: Path, binds: Sequence[Path] = ()
) -> Iterator[SystemdHost]:
    """Boot container ft-N; stop it and remove its network afterwards, also on failure."""
    if not 1 <= n <= 254:
        raise ValueError("n must be in 1..254")
    root = container_root()
    name = f"ft-{n}"
    PID_DIR.mkdir(exist_ok=True)
    _stop_leftover(name)
    _remove_network(n)
    console_log = workdir / f"{name}-console.log"
    nspawn: subprocess.Popen[bytes] | None = None
    try:
        _make_network(n)
        with open(console_log, "wb") as log:
            nspawn = subprocess.Popen(
                [
                    "systemd-nspawn",
                    "-D",
                    str(root),
                    "-b",
                    "--register=no",
                    "--keep-unit",
                    "-M",
                    name,
                    f"--network-namespace-path=/run/netns/{name}",
                    "--volatile=overlay",
                    f"--bind-ro={shared_dir}:/opt/shared",
                    *(f"--bind-ro={path}" for path in binds),
                    "--console=read-only",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        (PID_DIR / f"{name}.pid").write_text(str(nspawn.pid))
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        leader = _wait_leader(nspawn, deadline)
        _wait_booted(leader, deadline)
        host_key = _sh(
            "nsenter", "-t", str(leader), "-a", "cat", "/etc/ssh/ssh_host_ed25519_key.pub"
        ).stdout.split()
        known_hosts = workdir / f"{name}-known_hosts"
        known_hosts.write_text(f"10.200.{n}.2 {host_key[0]} {host_key[1]}\n")
        _wait_port(f"10.200.{n}.2", 22, deadline)
        yield SystemdHost(n, nspawn, leader, known_hosts, console_log)
    finally:
        if nspawn is not None:
            # SIGTERM: nspawn asks the container's systemd for a clean poweroff.
            nspawn.terminate()
            try:
                nspawn.wait(timeout=20)
            except subprocess.TimeoutExpired:
                nspawn.kill()
                nspawn.wait()
            (PID_DIR / f"{name}.pid").unlink(missing_ok=True)
        _remove_network(n)


def missing_libraries(root: Path, *trees: Path) -> list[Path]:
    """The system libraries that shared objects under `trees` link to and the container root
    lacks (the interpreter was built against this machine's libsqlite3, vLLM's kernels need
    libnuma): bound from here, they serve every process inside, flagtrial's own included."""
    objects = sorted(str(p) for tree in trees for p in tree.rglob("*.so*") if p.is_file())
    out = subprocess.run(["ldd", *objects], capture_output=True, text=True).stdout
    found = {Path(m) for m in re.findall(r"=> (/\S+) \(", out)}
    return sorted(
        lib
        for lib in found
        if not any(lib.is_relative_to(t) for t in trees)
        and not (root / lib.relative_to("/")).exists()
    )


def shared_dir_with(dest: Path, llama_server: Path, model: Path) -> Path:
    """A folder for /opt/shared: the llama-server binary and the model as tiny.gguf."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(llama_server, dest / "llama-server")
    shutil.copy2(model, dest / "tiny.gguf")
    return dest


@contextlib.contextmanager
def llama_host(
    n: int,
    tmp_path_factory: pytest.TempPathFactory,
    llama_server: Path,
    model: Path,
    binds: Sequence[Path] = (),
) -> Iterator[SystemdHost]:
    """A booted host ft-N with llama-server and `model` (as tiny.gguf) under /opt/shared."""
    require_root()
    shared = shared_dir_with(tmp_path_factory.mktemp("shared"), llama_server, model)
    with systemd_host(n, shared, tmp_path_factory.mktemp("ft-host"), binds) as h:
        yield h


def ssh_project(
    host: SystemdHost,
    path: Path,
    unit_text: str,
    tables: str,
    *,
    unit: str = "llama.service",
    top: str = "",
    endpoint: str | None = None,
    ready_timeout_s: float = 30,
) -> Path:
    """Install `unit` (llama.service) with `unit_text` on the host and write a project file
    for it (strict host keys, the test key, no ~/.ssh/config); `top` adds top-level keys
    (`engine = ...`), `tables` adds [workload], [policy]."""
    host.reset_unit(unit)
    host.install_unit(unit, unit_text)
    return write_project_file(
        path,
        f"{top}\n{tables}",
        target=host.url,
        unit=unit,
        endpoint=endpoint or host.endpoint,
        ready_timeout_s=ready_timeout_s,
        ssh={
            "known_hosts": str(host.known_hosts),
            "identity_file": str(TEST_KEY),
            "ssh_config": "/dev/null",
            "connect_timeout_s": 5,
        },
    )


def host_fixture(n: int) -> Any:
    """The module's `host` fixture: container ft-N booted once for the module, with the real
    llama-server and the tiny model under /opt/shared (`host = host_fixture(N)`)."""

    @pytest.fixture(scope="module")
    def host(
        tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path, tiny_model: Path
    ) -> Iterator[SystemdHost]:
        with llama_host(n, tmp_path_factory, llama_server_bin, tiny_model) as h:
            yield h

    return host
