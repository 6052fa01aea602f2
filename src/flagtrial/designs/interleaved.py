"""Interleaved restart blocks: baseline, candidate, baseline, candidate ...; the primary
metric's paired log differences are looked at after the planned numbers of pairs, with the
error rate spent over those looks (flagtrial.spending: stopping at any look, or at a bound
between looks, keeps it). The guardrail metrics are watched after every block with the
confidence sequence (stats.anytime_interval, valid however often it is looked at)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from flagtrial import spending, stats
from flagtrial.designs.base import Arm, Block
from flagtrial.reasons import Code, Reason, Value
from flagtrial.settings import Policy

if TYPE_CHECKING:
    from flagtrial.judge import Effect
    from flagtrial.sequential import Continue, Sequential, Stop


@dataclass(frozen=True)
class Interleaved:
    kind: Literal["interleaved"] = field(default="interleaved", init=False)
    runs_per_block: int  # runs per restart block
    why: str
    # wall seconds a restart block was expected to cost when the design was chosen: with
    # max_seconds it bounds the pairs the looks are planned over (None: max_runs alone)
    block_s: float | None = None

    def looks(self, policy: Policy) -> spending.Looks:
        return spending.plan(horizon(policy, self.runs_per_block, self.block_s),
                             1.0 - policy.confidence)  # fmt: skip

    def next(self, seq: Sequential, block: Block) -> Continue | Stop:
        k = self.runs_per_block
        if block.passes < k:
            return seq.measure(block, f"block {block.index + 1}, run {block.passes + 1}/{k}")
        policy = seq.policy
        pairs = self.pairs(seq, policy.primary_metric)
        looks = self.looks(policy)
        looked = looks.is_look(len(pairs))
        interval = self._primary(pairs, looks) if looked else None
        stop = seq.stop_reason(interval, self._after(looks, len(pairs)))
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
        elif len(pairs) >= looks.horizon:  # the bounds came out looser than planned
            bound = Reason(
                code=Code.BOUND_LOOKS,
                values={"looks": len(looks.at), "pairs": looks.horizon, **seq.spent()},
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
        """The primary metric at the primary level from the planned looks (the stop is the
        last look); the guardrail metrics from the confidence sequence they were watched by."""
        if metric == seq.policy.primary_metric and level == seq.level:
            return self._primary(self.pairs(seq, metric, level), self.looks(seq.policy))
        return self.interval_now(seq, metric, level)

    def interval_now(self, seq: Sequential, metric: str, level: int) -> stats.Interval | None:
        pairs = self.pairs(seq, metric, level)
        return stats.anytime_interval(pairs, seq.policy.confidence) if pairs else None

    @staticmethod
    def _primary(pairs: list[float], looks: spending.Looks) -> stats.Interval | None:
        if not pairs:
            return None
        return stats.paired_interval(pairs, looks.critical(len(pairs)))

    @staticmethod
    def _after(looks: spending.Looks, pairs: int) -> dict[str, Value]:
        if not looks.is_look(pairs):
            return {"after": pairs, "unit": "clean pairs"}
        look = looks.at.index(pairs) + 1
        return {"after": pairs, "unit": f"clean pairs (look {look} of {len(looks.at)})"}

    def notes(self, seq: Sequential, effects: list[Effect]) -> list[Reason]:
        policy = seq.policy
        primary = next((e for e in effects if e.metric == policy.primary_metric
                        and e.concurrency == seq.level), None)  # fmt: skip
        if primary is not None:
            return self._more_load(seq, primary)
        n = len(self.pairs(seq, policy.primary_metric))
        least = self.looks(policy).at[0]
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

        alpha = 1.0 - policy.confidence

        def critical(m: int) -> float:  # at the last look of a trial planned over m pairs
            return spending.plan(m, alpha).critical(m, paths=spending.ADVICE_PATHS) or math.inf

        needed = stats.pairs_to_settle(pairs, critical, settles, limit)
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


def horizon(policy: Policy, runs_per_block: int, block_s: float | None) -> int:
    """The pairs a trial gets within its bounds at `runs_per_block` and (when known) `block_s`
    wall seconds a restart block: the first, unpaired block taken out."""
    pairs = policy.max_runs // runs_per_block - 1
    if block_s is not None and block_s > 0:
        pairs = min(pairs, int((policy.max_seconds - block_s) // (2 * block_s)))
    return max(pairs, 0)
