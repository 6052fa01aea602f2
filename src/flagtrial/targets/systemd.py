"""Target `systemd`: the server is a systemd unit, driven with systemctl and journalctl.

Every host command goes through a Runner (runner.py: a local subprocess, or an SSH
connection in ssh.py), so the systemd logic exists once. Commands are argv lists, never shell
text: a runner that needs a command line builds it with shlex.join.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator

from flagtrial.errors import LockHeldError, SpecError, TargetError
from flagtrial.launch.environment import parse_env_file
from flagtrial.launch.spec import LaunchSpec, decode_spec, encode_spec, parse_unit
from flagtrial.targets.base import HostFacts, ServerState, ServerStatus
from flagtrial.targets.holder import LockHolder, held_message, holder_lines, parse_holder
from flagtrial.targets.hostfacts import collect_host_facts
from flagtrial.targets.runner import (
    Completed,
    ConnectionDropped,
    Held,
    LocalRunner,
    Runner,
    first_line,
)

LOCK_DIR = "/run/flagtrial"
LOCK_BUSY = 75  # flock -E: tells "held by someone else" from any other failure
POLL_S = 0.1
STATE_PROPS = (
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "MainPID",
    "NRestarts",
    "ExecMainCode",
    "ExecMainStatus",
)
CLD_EXITED = "1"  # ExecMainCode: the main process exited (else it was killed by a signal)
START_LIMIT_LINE = "Start request repeated too quickly"

# systemd's unit name characters; a leading '-' would read as a systemctl option.
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\@][A-Za-z0-9:_.\\@-]*")

# Runs on the host as `sh -c INSTALL_SCRIPT sh PATH` with the new text on stdin. Values reach
# it only as positional arguments, never inside the script. Each step runs only if the one
# before succeeded: a failed write leaves the old file and nothing reloaded. The temporary
# file takes the unit's mode, owner and group before the text goes in, so a 0600 unit's
# secrets are never in a file others can read.
INSTALL_SCRIPT = r"""set -eu
dst=$(readlink -m -- "$1")  # a linked unit: replace the file the link points to
tmp="$dst.flagtrial-tmp"
trap 'rm -f -- "$tmp"' EXIT
mkdir -p -- "$(dirname -- "$dst")"
if [ -e "$dst" ]; then
  rm -f -- "$tmp"
  (umask 077 && : >"$tmp")
  chown --reference="$dst" -- "$tmp"
  chmod --reference="$dst" -- "$tmp"
fi
cat >"$tmp"
sync -- "$tmp"
mv -f -- "$tmp" "$dst"
sync -- "$(dirname -- "$dst")"
systemctl daemon-reload
"""

# `flock -c` keeps the lock while `cat` waits on stdin: closing our end, or losing the
# connection or the process that holds it, releases the lock (a dead holder never keeps it,
# unless the host never learns that the connection is gone). A lock held by someone else is
# waited for a second: a reader probing it holds it for a moment. Errors go to stdout, so the
# line read in place of "locked" says what went wrong.
LOCK_SCRIPT = (
    'exec 2>&1; mkdir -p -- "$(dirname -- "$1")" && '
    'exec flock -w 1 -E 75 -- "$1" sh -c "$2" sh "$3" "$4" "$5"'
)
# The holder file: who holds the lock, the PID that keeps the flock (`exec cat` keeps $$), and
# the holder's `HOST PID START` (flagtrial.targets.holder), which tells whether it still runs.
HOLD_SCRIPT = 'printf "%s\\n%s\\n%s\\n" "$2" "$$" "$3" >"$1"; echo locked; exec cat'
# Exit 3: the lock is free; 0: it is held, and the holder file follows.
PROBE_SCRIPT = (
    '[ -e "$1" ] || exit 3; flock -n -s -E 75 -- "$1" true; rc=$?; '
    '[ "$rc" = 0 ] && exit 3; [ "$rc" = 75 ] || exit "$rc"; cat -- "$2" 2>/dev/null; exit 0'
)
# Kills the process keeping the lock, only while the holder file still names the holder that
# was found gone ($3): never a holder that took the lock since. Exit 3: the lock was free.
BREAK_SCRIPT = (
    'flock -n -E 75 -- "$1" true; [ "$?" = 75 ] || exit 3; '
    '[ "$(sed -n 3p -- "$2")" = "$3" ] || exit 4; kill -KILL "$(sed -n 2p -- "$2")"'
)
BREAK_WAIT_S = 10.0


def _holder(holder_file: bytes) -> LockHolder:
    """The holder named by a holder file: its first and third lines (the second is the PID on
    the host that keeps the lock, which outlives a holder whose connection the host did not
    see break)."""
    lines = [*holder_file.decode(errors="replace").splitlines(), "", "", ""]
    return parse_holder(lines[0], lines[2], lock_dies_with_holder=False)


def _status(props: dict[str, str]) -> ServerStatus:
    active = props.get("ActiveState", "")
    if active in ("active", "reloading"):
        return "running"
    # activating covers auto-restart; deactivating is the old instance on its way out.
    if active in ("activating", "deactivating"):
        return "starting"
    if active == "failed" or props.get("Result", "success") != "success":
        return "failed"
    return "stopped"


class SystemdTarget:
    """A systemd unit on the host its runner reaches (this machine by default).

    `spec_path` names the file a trial edits: by default the unit's own file
    (FragmentPath); a path ending in `.d/NAME.conf` makes the trial edit that drop-in.
    """

    def __init__(
        self,
        unit: str,
        spec_path: str | None = None,
        *,
        runner: Runner | None = None,
        restart_timeout_s: float = 120.0,
    ) -> None:
        if not _UNIT_NAME.fullmatch(unit):
            raise TargetError(f"invalid systemd unit name {unit!r}")
        if spec_path is not None and not spec_path.startswith("/"):
            raise TargetError(f"spec path {spec_path!r} must be absolute")
        self.unit = unit if unit.endswith(".service") else f"{unit}.service"
        self.spec_path = spec_path
        self.restart_timeout_s = restart_timeout_s
        self._runner: Runner = runner or LocalRunner()
        self._name_prefix = "systemd:"
        self._mark: str | None = None
        self._held: Held | None = None
        self._holder_lines = ("", "")

    @property
    def local(self) -> bool:
        return self._runner.local

    @property
    def name(self) -> str:
        suffix = f":{self.spec_path}" if self.spec_path else ""
        return f"{self._name_prefix}{self.unit}{suffix}"

    @property
    def lock_path(self) -> str:
        return f"{LOCK_DIR}/{self.unit}.lock"

    @property
    def holder_path(self) -> str:
        return f"{LOCK_DIR}/{self.unit}.holder"

    async def aclose(self) -> None:
        await self._runner.aclose()

    async def _exec(
        self,
        argv: list[str],
        *,
        input: bytes | None = None,
        timeout_s: float = 30.0,
        merge_stderr: bool = False,
    ) -> Completed:
        """Run on the host; a dropped connection is reopened once (and a lock it held retaken)."""
        try:
            await self._keep_lock()
            return await self._runner.exec(
                argv, input=input, timeout_s=timeout_s, merge_stderr=merge_stderr
            )
        except ConnectionDropped:
            await self._keep_lock()
            return await self._runner.exec(
                argv, input=input, timeout_s=timeout_s, merge_stderr=merge_stderr
            )

    async def _check(
        self, argv: list[str], what: str, *, input: bytes | None = None, timeout_s: float = 30.0
    ) -> bytes:
        r = await self._exec(argv, input=input, timeout_s=timeout_s)
        if r.returncode != 0:
            why = first_line(r.stderr or r.stdout, f"exit {r.returncode}")
            raise TargetError(f"{what} on {self._runner.where} failed: {why}")
        return r.stdout

    async def _show(self, props: tuple[str, ...]) -> dict[str, str]:
        argv = ["systemctl", "show", "-p", ",".join(props), "--", self.unit]
        out = await self._check(argv, f"systemctl show {self.unit}")
        return dict(
            line.split("=", 1) for line in out.decode(errors="replace").splitlines() if "=" in line
        )

    async def _resolve_spec_path(self) -> str:
        if self.spec_path:
            return self.spec_path
        props = await self._show(("LoadState", "FragmentPath"))
        if props.get("LoadState") == "not-found" or not props.get("FragmentPath"):
            raise TargetError(f"unit {self.unit} not found on {self._runner.where}")
        return props["FragmentPath"]

    @staticmethod
    def _is_dropin(path: str) -> bool:
        parent, _, name = path.rpartition("/")
        return parent.endswith(".d") and name.endswith(".conf")

    async def read_spec(self) -> LaunchSpec:
        path = await self._resolve_spec_path()
        r = await self._exec(["cat", "--", path])
        if r.returncode != 0:
            why = first_line(r.stderr, f"exit {r.returncode}")
            if "No such file" in why:
                raise SpecError(f"launch spec {path} does not exist on {self._runner.where}")
            raise TargetError(f"cannot read {path} on {self._runner.where}: {why}")
        # Any bytes round-trip, so an install writes back exactly what was read.
        return parse_unit(decode_spec(r.stdout), dropin=self._is_dropin(path))

    async def install_spec(self, spec: LaunchSpec) -> None:
        path = await self._resolve_spec_path()
        await self._check(
            ["sh", "-c", INSTALL_SCRIPT, "sh", path],
            f"installing {path}",
            input=encode_spec(spec.text),
            timeout_s=60.0,
        )

    async def _journal_cursor(self) -> str:
        out = await self._check(
            ["journalctl", "-n", "0", "--show-cursor", "-q", "--no-pager"],
            "journalctl --show-cursor",
        )
        for line in out.decode(errors="replace").splitlines():
            if line.startswith("-- cursor: "):
                return line.removeprefix("-- cursor: ").strip()
        raise TargetError(f"the journal on {self._runner.where} gave no cursor")

    async def log_mark(self) -> str:
        """A mark for `logs_since` taken now, for a restart someone else runs (Ansible)."""
        mark = self._mark = await self._journal_cursor()
        return mark

    async def restart(self) -> str:
        # reset-failed clears the start limit and NRestarts, so a unit that failed or looped
        # before starts again and restart_loop counts this start only. It fails harmlessly
        # on a unit that is not failed.
        await self._exec(["systemctl", "reset-failed", "--", self.unit])
        mark = await self._journal_cursor()
        before = await self._show(("InvocationID",))
        # --no-block: a start that fails or never becomes ready cannot hang us.
        await self._check(
            ["systemctl", "restart", "--no-block", "--", self.unit],
            f"systemctl restart {self.unit}",
        )
        self._mark = mark
        # The queued job runs at systemd's idle priority, so a query may be answered before
        # it starts: until then state() would report the old instance running, and a
        # readiness check would pass on the old server. Wait until the job has begun.
        deadline = time.monotonic() + self.restart_timeout_s
        while True:
            now = await self._show(("InvocationID", "ActiveState"))
            if now.get("InvocationID") != before.get("InvocationID") or now.get(
                "ActiveState"
            ) not in ("active", "reloading"):
                return mark
            if time.monotonic() > deadline:
                raise TargetError(
                    f"{self.unit} on {self._runner.where} did not begin restarting within "
                    f"{self.restart_timeout_s:g}s"
                )
            await asyncio.sleep(POLL_S)

    async def state(self) -> ServerState:
        props = await self._show(STATE_PROPS)
        if props.get("LoadState") == "not-found":
            return ServerState(status="stopped", detail=f"unit {self.unit} not found")
        restarts = int(props.get("NRestarts") or 0)
        status = _status(props)
        pid = int(props.get("MainPID") or 0) or None
        exit_code = None
        code, main_status = props.get("ExecMainCode", "0"), props.get("ExecMainStatus", "0")
        if status != "running" and code == CLD_EXITED:
            exit_code = int(main_status)
        detail = f"{props.get('ActiveState')}/{props.get('SubState')} result={props.get('Result')}"
        if code not in ("0", CLD_EXITED):
            detail += f", killed by signal {main_status}"
        # The start limit shows only in the journal: Result keeps the last exit's reason.
        loop = restarts > 2 or props.get("Result") == "start-limit-hit"
        if status == "failed" and not loop and self._mark is not None:
            loop = START_LIMIT_LINE in await self.logs_since(self._mark)
        return ServerState(
            status=status,
            pid=pid,
            exit_code=exit_code,
            restarts=restarts,
            restart_loop=loop,
            detail=detail,
        )

    async def logs_since(self, mark: str) -> str:
        out = await self._check(
            [
                "journalctl",
                "-u",
                self.unit,
                f"--after-cursor={mark}",
                "-o",
                "cat",
                "-q",
                "--no-pager",
            ],
            f"journalctl -u {self.unit}",
        )
        return out.decode(errors="replace")

    async def _take_lock(self, lines: tuple[str, str]) -> Held:
        held = await self._runner.hold(
            ["sh", "-c", LOCK_SCRIPT, "sh", self.lock_path, HOLD_SCRIPT, self.holder_path, *lines]
        )
        try:
            async with asyncio.timeout(30.0):
                line = await held.readline()
        except TimeoutError:
            await held.release()
            raise TargetError(
                f"taking the lock {self.lock_path} on {self._runner.where} timed out"
            ) from None
        if line == "locked":
            return held
        rc = await held.wait()
        if rc == LOCK_BUSY:
            r = await self._runner.exec(["cat", "--", self.holder_path])
            raise LockHeldError(held_message(self.name, _holder(r.stdout)))
        raise TargetError(
            f"cannot take the lock {self.lock_path} on {self._runner.where}: {line or f'exit {rc}'}"
        )

    async def _keep_lock(self) -> None:
        """After a dropped connection the host released our lock: take it again, or fail."""
        if self._held is not None and not self._held.alive():
            self._held = None
            self._held = await self._take_lock(self._holder_lines)

    @contextlib.asynccontextmanager
    async def lock(self, holder: str) -> AsyncIterator[None]:
        lines = holder_lines(holder)
        self._held = await self._take_lock(lines)
        self._holder_lines = lines
        try:
            yield
        finally:
            held, self._held = self._held, None
            if held is not None and held.alive():
                with contextlib.suppress(Exception):
                    await held.release()

    async def lock_holder(self) -> LockHolder | None:
        r = await self._exec(["sh", "-c", PROBE_SCRIPT, "sh", self.lock_path, self.holder_path])
        if r.returncode == 3:
            return None
        if r.returncode != 0:
            why = first_line(r.stderr or r.stdout, f"exit {r.returncode}")
            where = self._runner.where
            raise TargetError(f"cannot read the lock {self.lock_path} on {where}: {why}")
        return _holder(r.stdout)

    async def break_lock(self, holder: LockHolder) -> None:
        """Kill the process on the host that keeps the lock of `holder`, gone or stopped (the
        host may not have noticed its connection break), and wait until the lock is free."""
        r = await self._exec(
            ["sh", "-c", BREAK_SCRIPT, "sh", self.lock_path, self.holder_path, holder.ident]
        )
        if r.returncode == 4:
            raise LockHeldError(f"{self.name}: another holder took the lock meanwhile")
        if r.returncode not in (0, 3):
            raise TargetError(f"cannot break the lock {self.lock_path} on {self._runner.where}")
        deadline = time.monotonic() + BREAK_WAIT_S
        while await self.lock_holder() is not None:
            if time.monotonic() > deadline:
                raise TargetError(f"the lock {self.lock_path} on {self._runner.where} stays held")
            await asyncio.sleep(POLL_S)

    async def run(self, argv: list[str], timeout_s: float = 30.0) -> tuple[int, str]:
        r = await self._exec(argv, timeout_s=timeout_s, merge_stderr=True)
        return r.returncode, r.output

    async def host_facts(self) -> HostFacts:
        return await collect_host_facts(self.run)

    async def environment(self, spec: LaunchSpec) -> dict[str, str]:
        """The variables the unit sets: Environment=, then its EnvironmentFile= files read on
        the host, which override it as in systemd (one that cannot be read is left out). The
        manager's own environment (`systemctl set-environment`) is not read."""
        env = dict(spec.env)
        for entry in spec.environment_files:
            rc, text = await self.run(["cat", "--", entry.lstrip("-")])
            if rc == 0:
                env.update(parse_env_file(text))
        return env
