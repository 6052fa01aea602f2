"""How a target runs commands on its host: the Runner protocol (a command to completion, or
one held alive until released) and LocalRunner, this machine's subprocesses. SystemdTarget
(systemd.py) drives systemd through any Runner; ssh.py's runner is an SSH connection.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from flagtrial.errors import TargetError


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: bytes
    stderr: bytes  # empty when stderr was merged into stdout

    @property
    def output(self) -> str:
        """All the command printed (and why it could not run, for 127 and 124)."""
        return (self.stdout + self.stderr).decode(errors="replace")


class Held(Protocol):
    """A long-running command on the host, alive until released."""

    async def readline(self) -> str: ...

    def alive(self) -> bool: ...

    async def wait(self) -> int: ...

    async def release(self) -> None: ...


class Runner(Protocol):
    where: str  # the host, for messages: "this machine", "root@10.200.1.2"
    local: bool  # runs on the machine flagtrial runs on

    async def exec(
        self,
        argv: list[str],
        *,
        input: bytes | None = None,
        timeout_s: float = 30.0,
        merge_stderr: bool = False,
    ) -> Completed:
        """Run argv to completion; exit code 124 when it ran past timeout_s."""
        ...

    async def hold(self, argv: list[str]) -> Held: ...

    async def aclose(self) -> None: ...


class ConnectionDropped(TargetError):
    """The runner's connection to the host broke; the next call opens a new one."""


def first_line(data: bytes, default: str = "") -> str:
    for line in data.decode(errors="replace").splitlines():
        if line.strip():
            return line.strip()
    return default


class _LocalHeld:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def readline(self) -> str:
        assert self.proc.stdout is not None
        return (await self.proc.stdout.readline()).decode(errors="replace").strip()

    def alive(self) -> bool:
        return self.proc.returncode is None

    async def wait(self) -> int:
        return await self.proc.wait()

    async def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            async with asyncio.timeout(5.0):
                await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


class LocalRunner:
    where = "this machine"
    local = True

    async def exec(
        self,
        argv: list[str],
        *,
        input: bytes | None = None,
        timeout_s: float = 30.0,
        merge_stderr: bool = False,
    ) -> Completed:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE,
            )
        except OSError as e:
            return Completed(127, b"", f"{argv[0]}: {e.strerror}".encode())
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a Ctrl-C that
            # lands as the command ends
            async with asyncio.timeout(timeout_s):
                out, err = await proc.communicate(input)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return Completed(124, b"", f"{argv[0]}: timed out after {timeout_s:g}s".encode())
        return Completed(proc.returncode or 0, out, err or b"")

    async def hold(self, argv: list[str]) -> Held:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
        except OSError as e:
            raise TargetError(f"cannot run {argv[0]}: {e.strerror}") from e
        return _LocalHeld(proc)

    async def aclose(self) -> None:
        return None
