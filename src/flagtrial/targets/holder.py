"""Who holds a target's trial lock, and whether that holder still runs.

A holder leaves two lines where its lock is kept: what it is, for people (`flagtrial trial
(pid N on HOST)`), and `HOST PID START` for flagtrial, START being the holder's start time in
clock ticks since boot, so that a PID reused by another process is never taken for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

POLL_S = 0.1


def proc_start_ticks(pid: int) -> int | None:
    """Start time of a PID in clock ticks since boot; None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


@dataclass(frozen=True)
class LockHolder:
    info: str  # for people: "flagtrial trial (pid 123 on laptop-1)"
    host: str | None = None
    pid: int | None = None
    start_ticks: int | None = None
    # True: it runs; False: it is gone and only its lock is left; None: it runs (or ran) on
    # another machine, which flagtrial cannot look into.
    alive: bool | None = None

    @property
    def ident(self) -> str:
        """The second line the holder wrote, "" when it wrote none."""
        return f"{self.host} {self.pid} {self.start_ticks}" if self.host else ""

    @property
    def ours(self) -> bool:
        return self.host == socket.gethostname() and self.pid == os.getpid()


def holder_lines(command: str) -> tuple[str, str]:
    """The two lines this process leaves as the holder of a lock, for `command`."""
    pid, host = os.getpid(), socket.gethostname()
    return f"{command} (pid {pid} on {host})", f"{host} {pid} {proc_start_ticks(pid)}"


def parse_holder(info: str, ident: str, *, lock_dies_with_holder: bool) -> LockHolder:
    """The holder of a lock that is held, from the lines it left. `lock_dies_with_holder`: the
    lock is a flock of the holder's own process, so a held lock proves the holder runs."""
    info = info.strip() or "an unknown holder"
    parts = ident.split()
    if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()):
        return LockHolder(info, alive=True if lock_dies_with_holder else None)
    host, pid, ticks = parts[0], int(parts[1]), int(parts[2])
    if lock_dies_with_holder:
        alive: bool | None = True
    elif host == socket.gethostname():
        alive = proc_start_ticks(pid) == ticks
    else:
        alive = None
    return LockHolder(info, host, pid, ticks, alive)


def held_message(target: str, holder: LockHolder) -> str:
    """One line: who holds the lock and what the user can do about it."""
    if holder.alive is False:
        return f"{target} is locked by {holder.info}, which is gone (`flagtrial unlock` frees it)"
    where = "is still running" if holder.alive else "runs on another machine"
    return (
        f"{target} is locked by {holder.info}, which {where} (wait for it, or `flagtrial unlock "
        "--force` to stop it and roll its trial back)"
    )


def _running(holder: LockHolder) -> bool:
    return holder.pid is not None and proc_start_ticks(holder.pid) == holder.start_ticks


async def stop_holder(holder: LockHolder, grace_s: float) -> bool:
    """Stop a holder running on this machine: SIGTERM (and SIGCONT, so that a stopped holder
    wakes to it), which lets a trial roll itself back; SIGKILL when it still runs after
    `grace_s`. Returns True when it had to be killed."""
    assert holder.pid is not None and holder.host == socket.gethostname()
    for sig in (signal.SIGTERM, signal.SIGCONT):
        if _running(holder):
            with contextlib.suppress(ProcessLookupError):
                os.kill(holder.pid, sig)
    deadline = time.monotonic() + grace_s
    while _running(holder) and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
    if not _running(holder):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(holder.pid, signal.SIGKILL)
    while _running(holder):
        await asyncio.sleep(POLL_S)
    return True
