"""Before-after: baseline runs on the running server, then candidate runs (looked at after
each, the drift still a bias bound), then a short baseline re-check after restoring it,
which measures the drift and decides (stats.before_after_interval, Bonferroni over looks)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from flagtrial import stats
from flagtrial.designs.base import Block, Phase
from flagtrial.reasons import Code, Reason

if TYPE_CHECKING:
    from flagtrial.judge import Effect
    from flagtrial.sequential import Continue, Sequential, Stop


@dataclass(frozen=True)
class BeforeAfter:
    kind: Literal["before-after"] = field(default="before-after", init=False)
    runs_per_block: int  # the policy's runs: known-good runs before the candidate's
    why: str

    def next(self, seq: Sequential, block: Block) -> Continue | Stop:
        p = seq.policy
        busy = seq.busy()
        if busy:
            return seq.stop(busy, installed=block.arm)
        if block.phase == "before":
            if _clean(seq, "before") < p.runs and seq.count("baseline") < p.max_runs:
                return seq.measure(block, f"known-good, before, run {block.passes + 1}")
            new = seq.new_block("candidate", "after")
            return seq.measure(new, "candidate, run 1")
        if block.phase == "after":
            looks = _looks(seq)
            interval = (
                self._interval(seq, p.primary_metric, seq.level, with_recheck=False, looks=looks)
                if _clean(seq, "after") >= 2
                else None
            )
            stop = seq.stop_reason(
                interval, {"after": _clean(seq, "after"), "unit": "candidate runs"}
            )
            within = seq.count("candidate") < looks - 1 and seq.seconds_left() >= seq.run_s()
            if stop is None and within:
                return seq.measure(block, f"candidate, run {block.passes + 1}")
            new = seq.new_block("baseline", "recheck")
            new.interim = interval
            new.opened_by = stop or Reason(
                code=Code.BOUND_BEFORE_AFTER,
                values={"candidate_max": looks - 1, "max_seconds": p.max_seconds, **seq.spent()},
            )
            return seq.measure(new, "known-good re-check, run 1")
        if _clean(seq, "recheck") < p.recheck_runs and block.passes < 2 * p.recheck_runs:
            return seq.measure(block, f"known-good re-check, run {block.passes + 1}")
        assert block.opened_by is not None  # set when the re-check began
        return seq.stop(block.opened_by, installed="baseline")

    def interval(self, seq: Sequential, metric: str, level: int) -> stats.Interval | None:
        return self._interval(seq, metric, level, with_recheck=True, looks=_looks(seq))

    def interval_now(self, seq: Sequential, metric: str, level: int) -> stats.Interval | None:
        return None  # p99 TTFT's interval needs the re-check

    def notes(self, seq: Sequential, effects: list[Effect]) -> list[Reason]:
        notes = []
        interim = self.interim(seq)
        if interim is not None:
            est, lo, hi = interim.pct
            values = {"drift_pct_per_hour": seq.policy.drift_pct_per_hour, "pct": est}
            notes.append(Reason(code=Code.INTERIM, values={**values, "lo_pct": lo, "hi_pct": hi}))
        metric = seq.policy.primary_metric
        before = _segment(seq, "before", metric, seq.level)
        recheck = _segment(seq, "recheck", metric, seq.level)
        if before is not None and recheck is not None:
            minutes = (recheck.at_s - before.at_s) / 60
            drift = {"pct": stats.to_pct(recheck.mean - before.mean), "minutes": minutes}
            notes.append(Reason(code=Code.DRIFT, values=drift))
        return notes

    @staticmethod
    def interim(seq: Sequential) -> stats.Interval | None:
        """The interval that ended the candidate phase (None before the re-check)."""
        return next((b.interim for b in seq.blocks if b.phase == "recheck"), None)

    def _interval(
        self, seq: Sequential, metric: str, level: int, *, with_recheck: bool, looks: int
    ) -> stats.Interval | None:
        before = _segment(seq, "before", metric, level)
        after = _segment(seq, "after", metric, level)
        recheck = _segment(seq, "recheck", metric, level) if with_recheck else None
        if before is None or after is None or (with_recheck and recheck is None):
            return None
        p = seq.policy
        return stats.before_after_interval(
            before,
            after,
            recheck,
            p.confidence,
            looks,
            p.autocorrelation,
            stats.to_log(p.drift_pct_per_hour) / 3600.0,
        )


def _looks(seq: Sequential) -> int:
    """Planned looks, one per candidate run and the final one. Candidate runs stop at twice
    the known-good's: beyond that the known-good's own runs bound the interval and more
    candidate runs barely narrow it."""
    return min(seq.policy.max_runs, 2 * max(_clean(seq, "before"), 2)) + 1


def _clean(seq: Sequential, phase: Phase) -> int:
    blocks = {b.index for b in seq.blocks if b.phase == phase}
    return sum(
        1 for r in seq.runs if r.block in blocks and r.level == seq.level and not r.disturbed
    )


def _segment(seq: Sequential, phase: Phase, metric: str, level: int) -> stats.Segment | None:
    blocks = {b.index for b in seq.blocks if b.phase == phase}
    runs = [
        r
        for r in seq.runs
        if r.block in blocks and r.level == level and r.disturbed is None and metric in r.values
    ]
    if not runs:
        return None
    return stats.Segment(
        tuple(math.log(r.values[metric]) for r in runs),
        float(np.mean([r.at_s - r.summary.duration_s / 2 for r in runs])),
    )
