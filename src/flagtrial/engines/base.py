"""The Engine protocol and the readiness wait every engine shares."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Protocol, runtime_checkable

import httpx

from flagtrial.engines.logfacts import message
from flagtrial.errors import ServerNotReadyError
from flagtrial.facts import Facts
from flagtrial.faults import checkpoint
from flagtrial.launch.schema import FlagSchema
from flagtrial.load.workload import Workload
from flagtrial.targets.base import Target

POLL_S = 0.1
# How often a watched start reads the log: every read is a file read or a journalctl call.
LOG_POLL_S = 1.0

# What a starting server is doing, in the words every engine's table uses.
PhaseName = Literal[
    "starting", "loading weights", "profiling", "KV allocation", "compiling", "warming up", "ready"
]  # fmt: skip


@dataclass(frozen=True)
class Phase:
    """A start phase, entered when the server logs a line `marker` matches."""

    name: PhaseName
    marker: re.Pattern[str]


@dataclass(frozen=True)
class StartProgress:
    """Where a restart stands: seconds since the wait began, the phase, and a server log line
    (the one that entered the phase when it changes, else the log's last; unredacted: whoever
    shows it redacts it). `done` once the wait is over, however it ended."""

    elapsed_s: float
    phase: PhaseName
    last_line: str
    done: bool = False


ProgressFn = Callable[[StartProgress], None]


def line_phase(phases: Sequence[Phase], line: str) -> PhaseName | None:
    return next((p.name for p in phases if p.marker.search(line)), None)


def phase_entries(phases: Sequence[Phase], log: str) -> list[tuple[PhaseName, str]]:
    """Each phase a log enters, in order, with the line that enters it (a phase entered again
    after another counts again)."""
    seen: list[tuple[PhaseName, str]] = []
    for line in log.splitlines():
        name = line_phase(phases, line)
        if name is not None and (not seen or seen[-1][0] != name):
            seen.append((name, line))
    return seen


class Engine(Protocol):
    name: str
    # How far a restored server's capacity facts may differ from the known-good's and still
    # count as the same (engines that size their caches from free GPU memory jitter a little).
    capacity_tolerance_pct: float
    # Which log lines begin each start phase, for the progress shown while a restart runs.
    start_phases: tuple[Phase, ...]
    # The HTTP port the server listens on when its command line names none.
    default_port: int
    # The spellings of its tensor-parallel size flag (none: it has no such flag).
    tp_flags: tuple[str, ...]
    # Whether the gate analysis (flagtrial.gates) reads this engine's source.
    source_gates: bool

    @staticmethod
    def starts(program_parts: set[str]) -> bool:
        """Whether a command line whose program words split into these parts (`llama-server`,
        `sglang`, `launch_server`, ...) starts this engine."""
        ...

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


class StartWatch:
    """Reads a starting server's log as it grows and reports each phase it enters (even one
    entered and left between two reads) with the line that entered it, and on a read that
    finds no new phase, the log's last line. Without a callback it reads nothing."""

    def __init__(
        self, phases: Sequence[Phase], target: Target, mark: str, progress: ProgressFn | None
    ) -> None:
        self.phases, self.target, self.mark, self.progress = phases, target, mark, progress
        self.began = time.monotonic()
        self.read_at = -LOG_POLL_S
        self.scanned = 0  # characters of the log whose whole lines were scanned
        self.phase: PhaseName = "starting"
        self.line = ""

    async def poll(self, *, now: bool = False) -> None:
        if self.progress is None or (not now and time.monotonic() - self.read_at < LOG_POLL_S):
            return
        self.read_at = time.monotonic()
        log = await self.target.logs_since(self.mark)
        # Only whole lines: a line still being written may yet match.
        end = log.rfind("\n", self.scanned) + 1
        entered = phase_entries(self.phases, log[self.scanned : end]) if end else []
        self.scanned = max(self.scanned, end)
        elapsed = self.read_at - self.began
        changes = entered[1:] if entered and entered[0][0] == self.phase else entered
        for name, line in changes:
            self.phase = name
            self.progress(StartProgress(elapsed, name, message(line)))
        self.line = message(_last_line(log))
        if not changes:
            self.progress(StartProgress(elapsed, self.phase, self.line))

    async def __aenter__(self) -> StartWatch:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.progress is None:
            return
        if kind is None:
            await self.poll(now=True)  # the phases logged since the last read
            self.phase = "ready"
        self.progress(StartProgress(time.monotonic() - self.began, self.phase, self.line, True))


@runtime_checkable
class WorkloadSized(Protocol):
    """An engine whose admitted concurrency depends on how long the workload's requests are
    (SGLang reserves each request's prompt and max_tokens in its KV cache)."""

    workload: Workload | None


@runtime_checkable
class ResolvesDefaults(Protocol):
    """An engine whose server leaves some limits unreported, while its own code on the host
    resolves their defaults (vLLM's batch limits, which depend on the platform)."""

    async def with_defaults(self, target: Target, program: list[str], facts: Facts) -> Facts:
        """`facts` with the limits the engine's code resolves added, the binding one named."""
        ...


@runtime_checkable
class LogsLate(Protocol):
    """An engine whose log can trail its readiness: llama.cpp writes its log from a worker
    thread, so on a busy machine /health may answer before the startup lines the facts read
    are written."""

    def startup_logged(self, log: str) -> bool:
        """Whether `log` holds the end of the start (every line the facts read)."""
        ...


async def wait_ready(
    engine: Engine,
    target: Target,
    base_url: str,
    mark: str,
    timeout_s: float,
    progress: ProgressFn | None = None,
) -> None:
    """Poll readiness and the supervisor together, so a crash ends the wait at once.

    Readiness only counts while the target's own process is alive: a foreign server
    answering on the same port must not pass for ours. (The caller times the whole restart.)
    With `progress`, the start's phases and log are reported as they come (StartWatch).
    """
    start = time.monotonic()
    watch = StartWatch(engine.start_phases, target, mark, progress)
    async with httpx.AsyncClient(timeout=2.0) as client, watch:
        while True:
            checkpoint("waiting")
            await watch.poll()
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
