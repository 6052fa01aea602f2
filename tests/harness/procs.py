"""What /proc says of a process: its state, its command line, whether it is gone."""

from __future__ import annotations

from pathlib import Path


def state(pid: int) -> str | None:
    """A process's state letter (Z: a zombie, gone but not yet reaped), None once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def gone(pids: list[int]) -> bool:
    return all(state(pid) in (None, "Z") for pid in pids)
