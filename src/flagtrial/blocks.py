"""Measuring a block of a trial: one run at every workload level on the running arm, each
between two samples of the server machine's foreign load, passed to the procedure."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass

from flagtrial.errors import FlagtrialError
from flagtrial.faults import checkpoint
from flagtrial.hygiene import (
    ForeignLoad,
    LoadSample,
    client_bound,
    disturbed,
    foreign_load,
    sample_target,
)
from flagtrial.load.runner import RunResult, run_level
from flagtrial.load.summary import RunSummary
from flagtrial.plan import Journal
from flagtrial.sequential import Arm, Continue, Sequential
from flagtrial.session import Session


class ServerDiedError(FlagtrialError):
    exit_code = 7


class Blocks:
    """Measuring a block: one run at every workload level on the running arm, each between
    two samples of the server machine's foreign load, passed to the procedure."""

    def __init__(self, s: Session, journal: Journal) -> None:
        self.s = s
        self.journal = journal
        self.runs_done: dict[Arm, int] = {"baseline": 0, "candidate": 0}
        # when the last run ended (observe's elapsed_s); None until the first block starts
        self.clock: float | None = None

    async def measure(self, seq: Sequential, step: Continue) -> None:
        s = self.s
        if self.clock is None:
            # The first run's time starts with its own warm-up. What came before (the gates'
            # wait on the engine's own resolution: tens of seconds for vLLM) is no run's cost:
            # counted, it made runs look as long as a restart and picked interleaved blocks,
            # a restart every few runs, where before-after needs two.
            self.clock = time.monotonic()
        project = s.project
        arm = step.arm
        index = self.runs_done[arm]
        self.runs_done[arm] += 1
        # one sample between two levels' runs serves as the after of one and the before of
        # the next: half the samples (each a round trip on a remote target)
        before = await sample_target(s.target)
        for level in project.workload.concurrency:
            # unique prompts across both arms: no prefix cache can serve one arm's prompts to
            # the other
            seed = (index * 2 + (arm == "candidate")) * 1000 + level
            run = await checked_run(
                s, level, before, warmup=step.warmup, seed=seed,
                what=f"the {arm} measurement (c={level}, run {index + 1})",
            )  # fmt: skip
            before, summary = run.after, run.result.summary
            set_aside = run.why is not None and project.policy.set_aside_disturbed
            now = time.monotonic()
            seq.observe(
                arm,
                level,
                summary,
                records=run.result.records,
                disturbed=run.why,
                elapsed_s=now - self.clock,
            )
            self.clock = now
            s.ledger.add_run(
                self.journal.trial_id, arm, level, index, summary.model_dump(),
                block=step.block, disturbed=run.why,
                foreign=dataclasses.asdict(run.load) if run.load else None,
            )  # fmt: skip
            checkpoint(f"{arm}-run-{index + 1}")
            s.notify(
                "run",
                f"{arm} c={level} run {index + 1} (block {step.block + 1}): "
                f"{summary.output_tok_s:.1f} tok/s, {summary.n_errors} errors"
                + (f"; {'set aside' if set_aside else 'counted'}, {run.why}" if run.why else "")
                + _delayed(summary),
            )


@dataclass(frozen=True)
class CheckedRun:
    """One run at one level, the server checked alive after it, and why it is disturbed
    (foreign load on the server machine, a client that could not keep up), if it is."""

    result: RunResult
    after: LoadSample | None  # the foreign-load sample after it: the next run's before
    load: ForeignLoad | None
    why: str | None


async def checked_run(
    s: Session, level: int, before: LoadSample | None, *, warmup: bool, seed: int, what: str
) -> CheckedRun:
    """Run the project's workload at `level`, between two samples of foreign load."""
    result = await run_level(
        s.project.endpoint, s.project.workload, level, warmup=warmup, seed=seed
    )
    state = await s.target.state()
    if state.status != "running":
        raise ServerDiedError(f"server died during {what}")
    after = await sample_target(s.target)
    own_pid = os.getpid() if s.target.local else None
    load = foreign_load(before, after, state.pid, own_pid) if before and after else None
    foreign = disturbed(load, s.project.policy.foreign_cpu_max_cores) if load else None
    # a run the load client could not keep up with measured the client; both reasons when
    # both hold (foreign load may be what starved the client)
    reasons = [r for r in (foreign, client_bound(result.summary)) if r]
    return CheckedRun(result, after, load, "; ".join(reasons) if reasons else None)


def _delayed(summary: RunSummary) -> str:
    """Open loop: requests that waited for the concurrency cap (the server got less than the
    rate asked, which the run still measures)."""
    if not summary.n_delayed:
        return ""
    if summary.turns > 1:  # a conversation waits once, for its first turn
        return f"; {summary.n_delayed} conversations waited for the concurrency cap"
    return f"; {summary.n_delayed} of {summary.n_requests} requests waited for the concurrency cap"
