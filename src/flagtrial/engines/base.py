"""The Engine protocol and the readiness wait every engine shares."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable

import httpx

from flagtrial.errors import ServerNotReadyError
from flagtrial.facts import Facts
from flagtrial.faults import checkpoint
from flagtrial.launch.schema import FlagSchema
from flagtrial.load.workload import Workload
from flagtrial.targets.base import Target

POLL_S = 0.1


class Engine(Protocol):
    name: str
    # How far a restored server's capacity facts may differ from the known-good's and still
    # count as the same (engines that size their caches from free GPU memory jitter a little).
    capacity_tolerance_pct: float

    async def is_ready(self, client: httpx.AsyncClient, base_url: str) -> bool:
        """True once the server answers requests (not merely once its port is open)."""
        ...

    async def facts(self, client: httpx.AsyncClient, base_url: str, startup_log: str) -> Facts:
        """What the server reports about itself, from its endpoints and its startup log."""
        ...

    def crash_reason(self, log: str) -> str | None:
        """The log line that explains a failed start, when the engine prints one."""
        ...

    def settings_for_flag(self, canonical_flag: str) -> set[str]:
        """The resolved-settings keys a flag sets (to tell named from implicit changes)."""
        ...

    async def flag_schema(self, target: Target, program: list[str]) -> FlagSchema:
        """The engine's own flag schema, from the program the spec runs (`spec.program`)."""
        ...


@runtime_checkable
class ValueChecker(Protocol):
    """An engine whose own parser can check argument values without starting a server."""

    async def check_values(self, target: Target, program: list[str], args: list[str]) -> None:
        """Raise ChangeError with the engine's own message when it rejects args."""
        ...


@runtime_checkable
class WorkloadSized(Protocol):
    """An engine whose admitted concurrency depends on how long the workload's requests are
    (SGLang reserves each request's prompt and max_tokens in its KV cache)."""

    workload: Workload | None


async def wait_ready(
    engine: Engine, target: Target, base_url: str, mark: str, timeout_s: float
) -> None:
    """Poll readiness and the supervisor together, so a crash ends the wait at once.

    Readiness only counts while the target's own process is alive: a foreign server
    answering on the same port must not pass for ours. (The caller times the whole restart.)
    """
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            checkpoint("waiting")
            state = await target.state()
            if state.status == "failed" or state.restart_loop:
                log = await target.logs_since(mark)
                reason = engine.crash_reason(log) or _last_line(log) or state.detail
                code = f" (exit {state.exit_code})" if state.exit_code is not None else ""
                raise ServerNotReadyError(f"server crashed at start{code}: {reason}")
            if state.status == "running":
                try:
                    ready = await engine.is_ready(client, base_url)
                except httpx.HTTPError:
                    ready = False
                if ready and (await target.state()).status == "running":
                    return
            if time.monotonic() - start > timeout_s:
                raise ServerNotReadyError(f"server not ready at {base_url} within {timeout_s:g}s")
            await asyncio.sleep(POLL_S)


def _last_line(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return lines[-1] if lines else ""
