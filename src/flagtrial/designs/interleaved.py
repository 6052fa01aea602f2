"""Interleaved restart blocks: baseline, candidate, baseline, candidate ...; after each block
the confidence sequence of the paired log differences is looked at (stats.anytime_interval:
valid at every look, so stopping early costs no error control)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from flagtrial import stats
from flagtrial.designs.base import Arm, Block
from flagtrial.reasons import Code, Reason

if TYPE_CHECKING:
    from flagtrial.judge import Effect
    from flagtrial.sequential import Continue, Sequential, Stop


@dataclass(frozen=True)
class Interleaved:
    kind: Literal["interleaved"] = field(default="interleaved", init=False)
    runs_per_block: int  # runs per restart block
    why: str

    def next(self, seq: Sequential, block: Block) -> Continue | Stop:
        k = self.runs_per_block
        if block.passes < k:
            return seq.measure(block, f"block {block.index + 1}, run {block.passes + 1}/{k}")
        policy = seq.policy
        pairs = self.pairs(seq, policy.primary_metric)
        interval = stats.anytime_interval(pairs, policy.confidence)
        stop = seq.stop_reason(interval, {"after": len(pairs), "unit": "clean pairs"})
        if stop:
            return seq.stop(stop, installed=block.arm)
        # A block without a clean run at the primary level is measured again, so a
        # disturbed run costs one block, not a pair. The first block (the server as found,
        # not restarted) is never paired: every paired block starts with a restart.
        again = block.index not in self._block_means(seq, policy.primary_metric, seq.level)
        other: Arm = "candidate" if block.arm == "baseline" else "baseline"
        arm = block.arm if again or block.index == 0 else other
        bound = None
        if seq.count(arm) + k > policy.max_runs:
            bound = Reason(
                code=Code.BOUND_RUNS, values={"max_runs": policy.max_runs, **seq.spent()}
            )
        # Stop rather than start a pair that cannot finish within the time bound.
        elif seq.seconds_left() < (1 if arm == "candidate" else 2) * seq.block_s():
            bound = Reason(
                code=Code.BOUND_SECONDS,
                values={"max_seconds": policy.max_seconds, **seq.spent()},
            )
        if bound and seq.count("candidate") == 0:
            # No bound ends a trial before the candidate ran: its facts and one block of
            # runs are worth the overrun.
            arm, again = "candidate", False
        elif bound:
            return seq.stop(bound, installed=block.arm)
        new = seq.new_block(arm, "interleaved")
        why = ", again: the last was disturbed" if again and block.index > 0 else ""
        return seq.measure(new, f"{arm} block {new.index + 1}{why}")

    def interval(self, seq: Sequential, metric: str, level: int) -> stats.Interval | None:
        pairs = self.pairs(seq, metric, level)
        return stats.anytime_interval(pairs, seq.policy.confidence) if pairs else None

    interval_now = interval

    def notes(self, seq: Sequential, effects: list[Effect]) -> list[Reason]:
        policy = seq.policy
        primary = next((e for e in effects if e.metric == policy.primary_metric
                        and e.concurrency == seq.level), None)  # fmt: skip
        if primary is not None:
            return self._more_load(seq, primary)
        n = len(self.pairs(seq, policy.primary_metric))
        alpha = 1 - policy.confidence
        least = next(m for m in range(2, 999) if stats.anytime_multiplier(m, alpha) < math.inf)
        return [
            Reason(code=Code.TOO_FEW_PAIRS, values={"pairs": n, "level": seq.level, "least": least})
        ]

    def _more_load(self, seq: Sequential, primary: Effect) -> list[Reason]:
        """After an unresolved interval: how many more pairs would likely settle it."""
        from flagtrial.guardrails import PRIMARY  # the rules import the statistics

        policy = seq.policy
        if seq.forced or PRIMARY.classify(policy, primary.lo_pct, primary.hi_pct) != "unresolved":
            return []  # decided, by the interval or by a breach the facts showed
        pairs = self.pairs(seq, policy.primary_metric)
        limit = 10 * max(policy.max_runs, len(pairs))

        def settles(i: stats.Interval) -> bool:
            _, lo, hi = i.pct
            return PRIMARY.classify(policy, lo, hi) != "unresolved"

        needed = stats.pairs_to_settle(pairs, policy.confidence, settles, limit)
        if needed is None:
            pct = stats.to_pct(sum(pairs) / len(pairs)) if pairs else 0.0
            return [Reason(code=Code.MORE_LOAD_NO, values={"limit": limit, "pct": pct})]
        more = needed - len(pairs)
        seconds = more * 2 * seq.block_s()  # a pair is two restart blocks
        return [
            Reason(
                code=Code.MORE_LOAD, values={"more": more, "level": seq.level, "seconds": seconds}
            )
        ]

    def pairs(self, seq: Sequential, metric: str, level: int | None = None) -> list[float]:
        """Log differences candidate - baseline of each baseline block followed by a candidate
        block, among the blocks with a clean value at `level`."""
        means = self._block_means(seq, metric, seq.level if level is None else level)
        ordered = [(seq.blocks[b].arm, m) for b, m in sorted(means.items())]
        out = []
        i = 0
        while i + 1 < len(ordered):
            if ordered[i][0] == "baseline" and ordered[i + 1][0] == "candidate":
                out.append(ordered[i + 1][1] - ordered[i][1])
                i += 2
            else:
                i += 1
        return out

    @staticmethod
    def _block_means(seq: Sequential, metric: str, level: int) -> dict[int, float]:
        """Block -> mean log value of its clean runs, the unpaired first block left out."""
        by_block = seq.logs.get((level, metric), {})
        return {b: sum(v) / len(v) for b, v in by_block.items() if b >= 1}
