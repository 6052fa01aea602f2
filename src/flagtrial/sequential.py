"""The sequential decision: measure until the interval decides, within bounds in runs and time.

Driven run by run: `decision()` says what to measure (which arm, whether to restart into it
first, whether to warm up), the driver runs one run at every concurrency level and passes
each to `observe()`, and so on until `decision()` returns a Stop. The first block runs on
the server as found (the known-good). The primary metric at the primary level decides; p99
TTFT and the error rate are guardrails that can stop the trial early too. Disturbed runs
(flagtrial.hygiene) are set aside with their reason, and a block left without a clean run
is measured again.

Designs (flagtrial.designs, one file each): interleaved restart blocks, or before-after with
a re-check, chosen by what a restart costs against a run once the first block, the same in
every design, is measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from flagtrial import stats
from flagtrial.designs import Arm, Block, Design, Phase, Run, choose_design
from flagtrial.facts import FactsDiff
from flagtrial.guardrails import MEASURED, METRICS, PRIMARY, Evidence
from flagtrial.judge import Effect, Verdict, decide, good_requests, metric_values
from flagtrial.load.client import RequestRecord
from flagtrial.load.summary import RunSummary
from flagtrial.reasons import Code, Reason, Value
from flagtrial.settings import Policy

__all__ = ["Arm", "Continue", "Sequential", "Stop"]

# Runs needed before "too busy to measure" may be said: enough that one foreign burst of
# 20 s (four 5-s runs) cannot end a trial alone.
MIN_RUNS_FOR_BUSY = 10
_SHOWS = {"gain": "a gain", "harm": "a harm", "equivalent": "no effect beyond the margins"}


@dataclass(frozen=True)
class Continue:
    """Measure one run at every level on `arm`; restart into it first when `restart`."""

    arm: Arm
    restart: bool
    warmup: bool
    step: str
    block: int  # restart block the run belongs to, numbered from 0


@dataclass(frozen=True)
class Stop:
    """The measurement is over; `verdict()` turns it into KEEP, REVERT or INCONCLUSIVE."""

    why: Reason
    effects: list[Effect]
    notes: list[Reason]
    baseline: dict[int, list[RunSummary]]  # clean runs only
    candidate: dict[int, list[RunSummary]]
    installed: Arm  # what the server runs now
    seconds: float

    def verdict(self, policy: Policy, diff: FactsDiff) -> Verdict:
        return decide(
            policy, diff, self.effects, self.baseline, self.candidate, [self.why, *self.notes]
        )


class Sequential:
    """One trial's measurement plan and stopping rule; see the module docstring. What the
    trial has measured is kept here; the plan after the first block is the design's."""

    def __init__(
        self,
        policy: Policy,
        levels: Sequence[int],
        *,
        restart_s: float | None = None,
        design: Design | None = None,
    ) -> None:
        """`design`: the one to follow from the start (a simulation or a test); without it,
        choose_design picks one when the first block is measured, from its run time and
        `restart_s` (the known-good's last restart, None when unknown)."""
        self.policy = policy
        self.levels = sorted(levels)
        self.level = policy.primary_concurrency or max(levels)
        if self.level not in self.levels:
            raise ValueError(f"primary concurrency {self.level} is not a workload level")
        self.design = design
        self.restart_s = restart_s
        self.clock_s = 0.0
        self.runs: list[Run] = []
        self.blocks: list[Block] = []
        # (level, metric) -> block -> log values of its clean runs, kept as runs arrive
        self.logs: dict[tuple[int, str], dict[int, list[float]]] = {}
        self.stopped: Stop | None = None
        # a guardrail breach read from the facts that fixes the verdict (breached())
        self.forced: str | None = None

    # --- driving -------------------------------------------------------------------------

    def observe(
        self,
        arm: Arm,
        level: int,
        summary: RunSummary,
        *,
        records: Sequence[RequestRecord] | None = None,
        disturbed: str | None = None,
        elapsed_s: float | None = None,
    ) -> None:
        """One run at one level. `records` are needed for goodput; `disturbed` is hygiene's
        reason to set the run aside (counted anyway when the policy's set_aside_disturbed is
        false); `elapsed_s` is the wall time since the last observe, restart and warm-up
        included (default: the run's own duration)."""
        block = self.blocks[-1] if self.blocks else None
        if block is None or arm != block.arm or level not in block.pending:
            raise ValueError(f"not asked for: {arm} c={level}")
        block.pending.discard(level)
        if not block.pending:
            block.passes += 1
        self.clock_s += summary.duration_s if elapsed_s is None else elapsed_s
        values = metric_values(self.policy, summary, records)
        if records is not None:  # for the SLO each arm is reported to meet (guardrails.Slo)
            p = self.policy
            good = good_requests(records, p.goodput_ttft_max_s, p.goodput_itl_max_s)
            summary = summary.model_copy(update={"n_good": good})
        flagged = disturbed
        if not self.policy.set_aside_disturbed:
            disturbed = None
        self.runs.append(
            Run(arm, block.index, level, summary, values, disturbed, self.clock_s, flagged)
        )
        if disturbed is None:
            for metric, value in values.items():
                by_block = self.logs.setdefault((level, metric), {})
                by_block.setdefault(block.index, []).append(math.log(value))
        if self.design is None and not block.pending:
            # The first block is measured: its run time against a restart's picks the design.
            self.design = choose_design(self.policy, self.restart_s, self.clock_s)

    def breached(self, guardrail: str) -> None:
        """A guardrail breach read from the server's facts (e.g. capacity) fixes the verdict
        as REVERT: measure only until the effect has an interval to show."""
        self.forced = guardrail

    def decision(self) -> Continue | Stop:
        """What to do now: measure more (Continue) or stop (Stop, final once returned)."""
        if self.stopped is not None:
            return self.stopped
        if not self.blocks:
            return self.measure(self.new_block("baseline", "before"), "known-good as found")
        block = self.blocks[-1]
        if block.pending:
            raise ValueError(f"observe every level first: missing c={sorted(block.pending)}")
        return self.chosen.next(self, block)

    @property
    def chosen(self) -> Design:
        """The design, once chosen (after the first block)."""
        if self.design is None:
            raise ValueError("no design before the first block is measured")
        return self.design

    # --- for the designs -----------------------------------------------------------------

    def stop_reason(self, primary: stats.Interval | None, after: dict[str, Value]) -> Reason | None:
        """Why to stop now, or None: too busy, a guardrail breached, or the primary decided.
        `after`: how many looks the interval rests on, and of what."""
        p = self.policy
        busy = self.busy()
        if busy:
            return busy
        ttft = self.chosen.interval_now(self, "ttft_p99", self.level)
        evidence = Evidence(
            level=self.level,
            effects=[] if ttft is None else [self._effect("ttft_p99", self.level, ttft)],
            baseline=self._clean_runs("baseline"),
            candidate=self._clean_runs("candidate"),
        )
        for rule in MEASURED:
            breach = next((r for r in rule.check(p, evidence) if r.breach), None)
            if breach:
                return Reason(code=rule.stop, values={**breach.values, **after})
        if primary is None:
            return None
        _, lo, hi = primary.pct
        if self.forced and math.isfinite(lo) and math.isfinite(hi):
            return Reason(
                code=Code.STOP_FORCED, values={"forced": self.forced, **after, **self.spent()}
            )
        found = PRIMARY.classify(p, lo, hi)
        if found == "unresolved":
            return None
        return Reason(
            code=Code.STOP_DECIDED,
            values={"finding": found, "shows": _SHOWS[found], **after, **self.spent()},
        )

    def busy(self) -> Reason | None:
        measured = [r for r in self.runs if r.level == self.level]
        bad = [r for r in measured if r.disturbed]
        if len(measured) < MIN_RUNS_FOR_BUSY:
            return None
        if len(bad) <= self.policy.disturbed_max_fraction * len(measured):
            return None
        return Reason(
            code=Code.BUSY,
            values={
                "disturbed": len(bad),
                "runs": len(measured),
                "level": self.level,
                "last": bad[-1].disturbed or "",
            },
        )

    def stop(self, why: Reason, installed: Arm) -> Stop:
        design = self.chosen
        effects = []
        for level in self.levels:
            for metric in METRICS:
                interval = design.interval(self, metric, level)
                if interval is None or not math.isfinite(interval.lo):
                    continue
                effects.append(self._effect(metric, level, interval))
        notes = design.notes(self, effects)
        bad = [r for r in self.runs if r.disturbed]
        if bad:
            first = bad[0]
            notes.append(
                Reason(
                    code=Code.DISTURBED,
                    values={
                        "disturbed": len(bad),
                        "runs": len(self.runs),
                        "arm": first.arm,
                        "level": first.level,
                        "why": first.disturbed or "",
                    },
                )
            )
        counted = sum(1 for r in self.runs if r.flagged and not r.disturbed)
        if counted:
            notes.append(Reason(code=Code.COUNTED_ANYWAY, values={"counted": counted}))
        self.stopped = Stop(
            why=why,
            effects=effects,
            notes=notes,
            baseline=self._clean_runs("baseline"),
            candidate=self._clean_runs("candidate"),
            installed=installed,
            seconds=self.clock_s,
        )
        return self.stopped

    def new_block(self, arm: Arm, phase: Phase) -> Block:
        block = Block(arm, len(self.blocks), phase)
        self.blocks.append(block)
        return block

    def measure(self, block: Block, step: str) -> Continue:
        """Ask for one more run at every level in `block`."""
        block.pending = set(self.levels)
        first = block.passes == 0
        # The first block runs on the server as found (the known-good): no restart.
        return Continue(
            block.arm, restart=first and block.index > 0, warmup=first, step=step, block=block.index
        )

    def count(self, arm: Arm) -> int:
        return sum(1 for r in self.runs if r.arm == arm and r.level == self.level)

    def block_s(self) -> float:
        return self.clock_s / max(len(self.blocks), 1)

    def run_s(self) -> float:
        passes = sum(b.passes for b in self.blocks)
        return self.clock_s / max(passes, 1)

    def seconds_left(self) -> float:
        return self.policy.max_seconds - self.clock_s

    def spent(self) -> dict[str, Value]:
        """What the measurement has cost so far, as reasons.STOPS cite it."""
        return {
            "baseline_runs": self.count("baseline"),
            "candidate_runs": self.count("candidate"),
            "level": self.level,
            "seconds": self.clock_s,
        }

    # --- inside --------------------------------------------------------------------------

    def _effect(self, metric: str, level: int, interval: stats.Interval) -> Effect:
        def geomean(arm: Arm) -> tuple[float, int]:
            v = [
                math.log(r.values[metric])
                for r in self.runs
                if r.arm == arm and r.level == level and not r.disturbed and metric in r.values
            ]
            return (math.exp(float(np.mean(v))) if v else 0.0), len(v)

        base, nb = geomean("baseline")
        cand, nc = geomean("candidate")
        est, lo, hi = interval.pct
        return Effect(
            metric=metric,
            concurrency=level,
            baseline=base,
            candidate=cand,
            pct=est,
            lo_pct=lo,
            hi_pct=hi,
            runs_baseline=nb,
            runs_candidate=nc,
        )

    def _clean_runs(self, arm: Arm) -> dict[int, list[RunSummary]]:
        out: dict[int, list[RunSummary]] = {lvl: [] for lvl in self.levels}
        for r in self.runs:
            if r.arm == arm and not r.disturbed:
                out[r.level].append(r.summary)
        return out
