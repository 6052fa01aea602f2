"""The Target protocol: what the trial needs from wherever the server runs."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Literal, Protocol

from pydantic import BaseModel, Field

from flagtrial.launch.spec import LaunchSpec

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
        """Held for a whole trial; a second holder gets LockHeldError naming the first."""
        ...

    async def break_lock(self) -> str | None:
        """Break the trial lock of a stuck holder; returns who held it (None: nobody)."""
        ...

    async def host_facts(self) -> HostFacts: ...

    async def aclose(self) -> None:
        """Release connections; the server itself keeps running."""
        ...

    async def run(self, argv: list[str], timeout_s: float = 30.0) -> tuple[int, str]:
        """Run a command on the server's host; returns (exit code, stdout and stderr)."""
        ...
