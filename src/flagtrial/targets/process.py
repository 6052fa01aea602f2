"""Target `process`: the launch spec runs as a detached child process on this machine (no root).

The server outlives the flagtrial command that started it, so its PID, start time and log are
kept in a state folder; a PID is trusted only when /proc still shows the same start time.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import stat
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

from flagtrial.errors import LockHeldError, SpecError, TargetError
from flagtrial.launch.environment import parse_env_file
from flagtrial.launch.execwords import expand_env, expand_words
from flagtrial.launch.spec import LaunchSpec, decode_spec, encode_spec, spec_sha256
from flagtrial.targets.base import HostFacts, ServerState
from flagtrial.targets.holder import (
    LockHolder,
    held_message,
    holder_lines,
    parse_holder,
    proc_start_ticks,
)
from flagtrial.targets.hostfacts import collect_host_facts
from flagtrial.targets.runner import LocalRunner

STOP_GRACE_S = 10.0
LOCK_WAIT_S = 1.0  # how long a lock held by someone else is waited for


def atomic_write(path: Path, text: str) -> None:
    """Write alongside, fsync, rename, fsync the folder: the old text or the new, never partial.

    The new file gets the old one's mode, owner and group before any byte is written (a 0600
    unit holding secrets is never readable by others, not even as the temporary file); a new
    file gets the umask's mode.
    """
    tmp = path.with_name(f".{path.name}.flagtrial-tmp")
    try:
        old = path.stat()
    except FileNotFoundError:
        old = None
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if old else 0o666)
    try:
        with os.fdopen(fd, "wb") as f:  # bytes: no newline or encoding translation
            if old is not None:
                made = os.fstat(fd)
                if (made.st_uid, made.st_gid) != (old.st_uid, old.st_gid):
                    os.fchown(fd, old.st_uid, old.st_gid)
                os.fchmod(fd, stat.S_IMODE(old.st_mode))
            f.write(encode_spec(text))
            f.flush()
            os.fsync(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class ProcessTarget:
    local = True  # the server is a child process of this machine

    def __init__(self, spec_path: Path, state_dir: Path) -> None:
        self.spec_path = spec_path.resolve()
        self.state_dir = state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.pid_file = state_dir / "server.json"
        self.log_path = state_dir / "server.log"
        self._child: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"process:{self.spec_path}"

    async def read_spec(self) -> LaunchSpec:
        try:
            text = decode_spec(self.spec_path.read_bytes())  # exact bytes, CRLF kept
        except FileNotFoundError as e:
            raise SpecError(f"launch spec {self.spec_path} does not exist") from e
        except OSError as e:
            raise TargetError(f"cannot read {self.spec_path}: {e.strerror}") from e
        kind = "unit" if self.spec_path.suffix in (".service", ".conf") else "command"
        return LaunchSpec(kind=kind, text=text)

    async def install_spec(self, spec: LaunchSpec) -> None:
        try:
            atomic_write(self.spec_path, spec.text)
        except OSError as e:
            raise TargetError(f"cannot install {self.spec_path}: {e.strerror}") from e

    def _recorded(self) -> dict[str, int] | None:
        try:
            recorded: dict[str, int] = json.loads(self.pid_file.read_text())
            return recorded
        except (OSError, ValueError):
            return None

    def _live_pid(self) -> int | None:
        rec = self._recorded()
        if rec and proc_start_ticks(rec["pid"]) == rec["start_ticks"]:
            return rec["pid"]
        return None

    async def stop(self) -> None:
        pid = self._live_pid()
        if pid is None:
            return
        # The server leads its own session: signal the whole group so helpers die with it, and
        # wait for all of them (vLLM's engine core and workers outlive the API server briefly,
        # holding memory a next start needs).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while self._running(pid) and time.monotonic() < deadline:
            self._reap()
            await asyncio.sleep(0.05)
        if self._running(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            while self._running(pid):
                self._reap()
                await asyncio.sleep(0.05)

    def _running(self, pid: int) -> bool:
        return self._live_pid() == pid or bool(self.group_members(pid))

    @staticmethod
    def group_members(pgid: int) -> list[int]:
        """Live (not zombie) processes of a process group."""
        members = []
        for stat_file in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat_file.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
                members.append(int(stat_file.parent.name))
        return members

    def _reap(self) -> None:
        if self._child is not None:
            self._child.poll()

    def _environment(self, spec: LaunchSpec, *, strict: bool = True) -> dict[str, str]:
        """This process's own environment (the server inherits it), then Environment=, then
        the EnvironmentFile= files, which override it as in systemd. `strict`: a file that
        cannot be read and is not marked optional (`-`) is an error, as at the start."""
        env = {**os.environ, **expand_env(spec.env)}
        for entry in spec.environment_files:
            path = Path(entry.lstrip("-"))
            try:
                env.update(parse_env_file(path.read_text()))
            except OSError:
                if strict and not entry.startswith("-"):
                    raise TargetError(f"EnvironmentFile {path} cannot be read") from None
        return env

    async def environment(self, spec: LaunchSpec) -> dict[str, str]:
        # a file that cannot be read is left out here: the restart itself refuses it
        return self._environment(spec, strict=False)

    async def restart(self) -> str:
        spec = await self.read_spec()
        await self.stop()
        env = self._environment(spec)
        argv = expand_words(spec.argv, env, substitute_env=":" not in spec.prefix)
        # With systemd's `@` prefix the first word is the path and the second is argv[0].
        executable, argv = (argv[0], argv[1:]) if "@" in spec.prefix else (argv[0], argv)
        with open(self.log_path, "ab") as log:
            mark = log.tell()
            digest = spec_sha256(spec.text)[:12]
            log.write(f"=== flagtrial start {time.strftime('%FT%T')} spec {digest}\n".encode())
            log.flush()
            try:
                self._child = subprocess.Popen(
                    argv,
                    executable=executable,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=self.spec_path.parent,
                )
            except OSError as e:
                raise TargetError(f"cannot start {executable}: {e.strerror}") from e
        ticks = proc_start_ticks(self._child.pid)
        self.pid_file.write_text(json.dumps({"pid": self._child.pid, "start_ticks": ticks}))
        return str(mark)

    async def state(self) -> ServerState:
        self._reap()
        pid = self._live_pid()
        if pid is not None:
            return ServerState(status="running", pid=pid)
        code = self._child.returncode if self._child is not None else None
        if self._recorded() is None:
            return ServerState(status="stopped")
        return ServerState(status="failed", exit_code=code, detail="process exited")

    async def logs_since(self, mark: str) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(int(mark))
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def lock_path(self) -> Path:
        return self.state_dir / "trial.lock"

    @staticmethod
    def _holder_of(fd: int) -> LockHolder:
        info, _, ident = os.pread(fd, 4096, 0).decode(errors="replace").partition("\n")
        # a flock is the holder's own: the kernel frees it when the holder dies
        return parse_holder(info, ident, lock_dies_with_holder=True)

    @contextlib.asynccontextmanager
    async def lock(self, holder: str) -> AsyncIterator[None]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # A reader probing the lock holds it for a moment: only a holder that keeps it
            # past the wait is another command.
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise LockHeldError(held_message(self.name, self._holder_of(fd))) from None
                    await asyncio.sleep(0.05)
            os.ftruncate(fd, 0)
            os.pwrite(fd, "\n".join(holder_lines(holder)).encode() + b"\n", 0)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock, also when we are killed

    async def lock_holder(self) -> LockHolder | None:
        try:
            fd = os.open(self.lock_path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            return self._holder_of(fd)
        finally:
            os.close(fd)

    async def break_lock(self, holder: LockHolder) -> None:
        """Nothing to break: a local flock dies with its holder, so none outlives it."""

    async def run(self, argv: list[str], timeout_s: float = 30.0) -> tuple[int, str]:
        r = await LocalRunner().exec(argv, timeout_s=timeout_s, merge_stderr=True)
        return r.returncode, r.output

    async def host_facts(self) -> HostFacts:
        return await collect_host_facts(self.run)

    async def aclose(self) -> None:
        """Nothing to release: the server is detached and outlives this command by design."""
