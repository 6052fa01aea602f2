"""The Target protocol: what the trial needs from wherever the server runs."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Literal, Protocol

from pydantic import BaseModel, Field

from flagtrial.launch.spec import LaunchSpec
from flagtrial.targets.holder import LockHolder

ServerStatus = Literal["running", "starting", "failed", "stopped"]


class ServerState(BaseModel):
    """The server's state as the target's supervisor sees it (process table, systemd)."""

    status: ServerStatus
    pid: int | None = None
    exit_code: int | None = None
    restarts: int = 0
    restart_loop: bool = False
    detail: str = ""


class Gpu(BaseModel):
    name: str
    compute_cap: str
    memory_total: str
    driver_version: str


class HostFacts(BaseModel):
    hostname: str
    kernel: str
    cpus: int
    gpus: list[Gpu] = Field(default_factory=list)


class Target(Protocol):
    """One adapter per place a server runs (process, systemd, ssh)."""

    @property
    def name(self) -> str:
        """A stable identifier for the ledger, e.g. `process:/srv/llama.service`."""
        ...

    @property
    def local(self) -> bool:
        """True when the server runs on the machine flagtrial runs on."""
        ...

    async def read_spec(self) -> LaunchSpec:
        """The launch spec as installed now."""
        ...

    async def install_spec(self, spec: LaunchSpec) -> None:
        """Replace the installed spec atomically: the old text or the new, never partial."""
        ...

    async def restart(self) -> str:
        """Restart the server on the installed spec; returns a mark for `logs_since`."""
        ...

    async def state(self) -> ServerState: ...

    async def logs_since(self, mark: str) -> str:
        """The server's log written after `mark`."""
        ...

    def lock(self, holder: str) -> AbstractAsyncContextManager[None]:
        """Held for the whole life of any command that may install, restart or recover (one
        writer per target); a second holder gets LockHeldError naming the first. The lock is
        freed when its holder dies, so a held lock means a live holder, except where a remote
        host has not yet noticed a broken connection (`lock_holder` tells)."""
        ...

    async def lock_holder(self) -> LockHolder | None:
        """Who holds the lock now, and whether it still runs; None when the lock is free, so
        any earlier holder is gone and a trial journal it left open is unfinished. Reads only:
        never takes the lock for longer than a moment."""
        ...

    async def break_lock(self, holder: LockHolder) -> None:
        """Free the lock `holder` keeps although it is gone (or has been stopped): kills what
        keeps it on the host. Never call it for a holder that still runs."""
        ...

    async def host_facts(self) -> HostFacts: ...

    async def environment(self, spec: LaunchSpec) -> dict[str, str]:
        """The environment variables the server would start with under `spec`, as far as
        they can be read (what the source gate analysis reads environment variables as)."""
        ...

    async def aclose(self) -> None:
        """Release connections; the server itself keeps running."""
        ...

    async def run(self, argv: list[str], timeout_s: float = 30.0) -> tuple[int, str]:
        """Run a command on the server's host; returns (exit code, stdout and stderr)."""
        ...
