"""Measuring a block of a trial: one run at every workload level on the running arm, each
between two samples of the server machine's foreign load, passed to the procedure."""

from __future__ import annotations

import dataclasses
import os
import time

from flagtrial.errors import FlagtrialError
from flagtrial.faults import checkpoint
from flagtrial.hygiene import client_bound, disturbed, foreign_load, sample_target
from flagtrial.load.runner import run_level
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
        self.clock = time.monotonic()  # when the last run ended (observe's elapsed_s)

    async def measure(self, seq: Sequential, step: Continue) -> None:
        s = self.s
        project = s.project
        arm = step.arm
        index = self.runs_done[arm]
        self.runs_done[arm] += 1
        # one sample between two levels' runs serves as the after of one and the before of
        # the next: half the samples (each a round trip on a remote target)
        before = await sample_target(s.target)
        for level in project.workload.concurrency:
            result = await run_level(
                project.endpoint,
                project.workload,
                level,
                warmup=step.warmup,
                # unique prompts across both arms: no prefix cache can serve one arm's
                # prompts to the other
                seed=(index * 2 + (arm == "candidate")) * 1000 + level,
            )
            state = await s.target.state()
            if state.status != "running":
                raise ServerDiedError(
                    f"server died during the {arm} measurement (c={level}, run {index + 1})"
                )
            after = await sample_target(s.target)
            own_pid = os.getpid() if s.target.local else None
            load = foreign_load(before, after, state.pid, own_pid) if before and after else None
            before = after
            foreign = disturbed(load, project.policy.foreign_cpu_max_cores) if load else None
            # a run the load client could not keep up with measured the client; both reasons
            # when both hold (foreign load may be what starved the client)
            reasons = [r for r in (foreign, client_bound(result.summary)) if r]
            why = "; ".join(reasons) if reasons else None
            set_aside = why is not None and project.policy.set_aside_disturbed
            now = time.monotonic()
            seq.observe(
                arm,
                level,
                result.summary,
                records=result.records,
                disturbed=why,
                elapsed_s=now - self.clock,
            )
            self.clock = now
            s.ledger.add_run(
                self.journal.trial_id, arm, level, index, result.summary.model_dump(),
                block=step.block, disturbed=why, foreign=dataclasses.asdict(load) if load else None,
            )  # fmt: skip
            checkpoint(f"{arm}-run-{index + 1}")
            s.notify(
                "run",
                f"{arm} c={level} run {index + 1} (block {step.block + 1}): "
                f"{result.summary.output_tok_s:.1f} tok/s, {result.summary.n_errors} errors"
                + (f"; {'set aside' if set_aside else 'counted'}, {why}" if why else "")
                + _delayed(result.summary),
            )


def _delayed(summary: RunSummary) -> str:
    """Open loop: requests that waited for the concurrency cap (the server got less than the
    rate asked, which the run still measures)."""
    if not summary.n_delayed:
        return ""
    if summary.turns > 1:  # a conversation waits once, for its first turn
        return f"; {summary.n_delayed} conversations waited for the concurrency cap"
    return f"; {summary.n_delayed} of {summary.n_requests} requests waited for the concurrency cap"
