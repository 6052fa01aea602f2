"""The sequential decision: measure until the interval decides, within bounds in runs and time.

Driven run by run: `decision()` says what to measure (which arm, whether to restart into it
first, whether to warm up), the driver runs one run at every concurrency level and passes
each to `observe()`, and so on until `decision()` returns a Stop. The first block runs on
the server as found (the known-good). The primary metric at the primary level decides; p99
TTFT and the error rate are guardrails that can stop the trial early too. Disturbed runs
(flagtrial.hygiene) are set aside with their reason, and a block left without a clean run
is measured again.

Designs (`choose_design`), by what a restart costs against a run:
- interleaved: restart blocks baseline, candidate, baseline, candidate ...; after each
  block the confidence sequence of the paired log differences is looked at
  (stats.anytime_interval: valid at every look, so stopping early costs no error control);
- before-after: baseline runs on the running server, then candidate runs (looked at after
  each, the drift still a bias bound), then a short baseline re-check after restoring it,
  which measures the drift and decides (stats.before_after_interval, Bonferroni over looks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from flagtrial import stats
from flagtrial.facts import FactsDiff
from flagtrial.guardrails import MEASURED, METRICS, PRIMARY, Evidence
from flagtrial.judge import Effect, Verdict, decide, goodput
from flagtrial.load.client import RequestRecord
from flagtrial.load.summary import RunSummary
from flagtrial.reasons import Code, Reason, Value
from flagtrial.settings import Policy

Arm = Literal["baseline", "candidate"]
DesignKind = Literal["interleaved", "before-after"]
Phase = Literal["interleaved", "before", "after", "recheck"]

# Longest restart block worth interleaving: beyond it, blocks are too few for pairs to help.
MAX_RUNS_PER_BLOCK = 4
# Runs needed before "too busy to measure" may be said: enough that one foreign burst of
# 20 s (four 5-s runs) cannot end a trial alone.
MIN_RUNS_FOR_BUSY = 10
_SHOWS = {"gain": "a gain", "harm": "a harm", "equivalent": "no effect beyond the margins"}


@dataclass(frozen=True)
class Design:
    kind: DesignKind
    runs_per_block: int  # interleaved: runs per restart block
    why: str


def choose_design(policy: Policy, restart_s: float | None, run_s: float) -> Design:
    """Interleave when a restart (and its warm-up) costs at most `restart_overhead_max` of a
    block of at most MAX_RUNS_PER_BLOCK runs; otherwise before-after. An unknown restart
    cost counts as expensive."""
    # Overhead of a block of k runs: restart / (restart + k run) <= restart_overhead_max.
    o = policy.restart_overhead_max
    if restart_s is None:
        k, cost = MAX_RUNS_PER_BLOCK + 1, f"restart time unknown, run {run_s:.1f}s"
    else:
        k = max(1, math.ceil(restart_s * (1 - o) / (o * max(run_s, 1e-9))))
        cost = f"restart {restart_s:.1f}s, run {run_s:.1f}s"
    if policy.protocol == "before-after" or (policy.protocol == "auto" and k > MAX_RUNS_PER_BLOCK):
        return Design("before-after", policy.runs, f"before-after ({cost})")
    k = min(k, MAX_RUNS_PER_BLOCK)
    return Design("interleaved", k, f"interleaved blocks of {k} run(s) ({cost})")


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


@dataclass
class _Run:
    arm: Arm
    block: int
    level: int
    summary: RunSummary
    values: dict[str, float]
    disturbed: str | None  # why the run is set aside; None: it counts
    at_s: float
    flagged: str | None = None  # hygiene's reason, set aside or not (set_aside_disturbed)


@dataclass
class _Block:
    arm: Arm
    index: int
    phase: Phase
    passes: int = 0
    pending: set[int] = field(default_factory=set)


class Sequential:
    """One trial's measurement plan and stopping rule; see the module docstring."""

    def __init__(self, policy: Policy, levels: Sequence[int], design: Design | None) -> None:
        """`design` may be None until the first block (the same in both designs: the
        known-good as found, warmed up) is measured: its run time feeds `choose_design`;
        assign `design` before the next `decision()`."""
        self.policy = policy
        self.levels = sorted(levels)
        self.level = policy.primary_concurrency or max(levels)
        if self.level not in self.levels:
            raise ValueError(f"primary concurrency {self.level} is not a workload level")
        self.design = design
        self.clock_s = 0.0
        self.runs: list[_Run] = []
        self.blocks: list[_Block] = []
        # (level, metric) -> block -> log values of its clean runs, kept as runs arrive
        self.logs: dict[tuple[int, str], dict[int, list[float]]] = {}
        self.stopped: Stop | None = None
        self.interim: stats.Interval | None = None  # before-after: what ended the B phase
        self.phase_why: Reason | None = None
        # A guardrail breach read from the server's facts (e.g. capacity) that already fixes
        # the verdict as REVERT: measure only until the effect has an interval to show.
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
        values: dict[str, float] = {}
        for metric in METRICS:
            if metric == "goodput":
                if records is None:
                    continue
                value: float | None = goodput(
                    records, self.policy.goodput_ttft_max_s, self.policy.goodput_itl_max_s
                )
            else:
                value = getattr(summary, metric)
            if value is not None and value > 0:
                values[metric] = float(value)
        flagged = disturbed
        if not self.policy.set_aside_disturbed:
            disturbed = None
        self.runs.append(
            _Run(arm, block.index, level, summary, values, disturbed, self.clock_s, flagged)
        )
        if disturbed is None:
            for metric, value in values.items():
                by_block = self.logs.setdefault((level, metric), {})
                by_block.setdefault(block.index, []).append(math.log(value))

    def decision(self) -> Continue | Stop:
        """What to do now: measure more (Continue) or stop (Stop, final once returned)."""
        if self.stopped is not None:
            return self.stopped
        block = self.blocks[-1] if self.blocks else None
        if block is not None and block.pending:
            raise ValueError(f"observe every level first: missing c={sorted(block.pending)}")
        if self.design is None:
            if block is not None:
                raise ValueError("assign a design after the first block")
            return self._continue(self._new_block("baseline", "before"), "known-good as found")
        if block is not None and block.phase == "before" and self.design.kind == "interleaved":
            block.phase = "interleaved"
        if self.design.kind == "interleaved":
            return self._next_interleaved(block)
        return self._next_before_after(block)

    # --- interleaved ---------------------------------------------------------------------

    def _next_interleaved(self, block: _Block | None) -> Continue | Stop:
        k = self.design.runs_per_block
        if block is None:
            return self._continue(self._new_block("baseline", "interleaved"), "baseline block 1")
        if block.passes < k:
            return self._continue(block, f"block {block.index + 1}, run {block.passes + 1}/{k}")
        pairs = self._pairs(self.policy.primary_metric)
        interval = stats.anytime_interval(pairs, self.policy.confidence)
        stop = self._stop_reason(interval, {"after": len(pairs), "unit": "clean pairs"})
        if stop:
            return self._stop(stop, installed=block.arm)
        # A block without a clean run at the primary level is measured again, so a
        # disturbed run costs one block, not a pair. The first block (the server as found,
        # not restarted) is never paired: every paired block starts with a restart.
        again = block.index not in self._block_means(self.policy.primary_metric, self.level)
        other: Arm = "candidate" if block.arm == "baseline" else "baseline"
        arm = block.arm if again or block.index == 0 else other
        bound = None
        if self._count(arm) + k > self.policy.max_runs:
            bound = Reason(
                code=Code.BOUND_RUNS, values={"max_runs": self.policy.max_runs, **self._spent()}
            )
        # Stop rather than start a pair that cannot finish within the time bound.
        elif self._seconds_left() < (1 if arm == "candidate" else 2) * self._block_s():
            bound = Reason(
                code=Code.BOUND_SECONDS,
                values={"max_seconds": self.policy.max_seconds, **self._spent()},
            )
        if bound and self._count("candidate") == 0:
            # No bound ends a trial before the candidate ran: its facts and one block of
            # runs are worth the overrun.
            arm, again = "candidate", False
        elif bound:
            return self._stop(bound, installed=block.arm)
        new = self._new_block(arm, "interleaved")
        why = ", again: the last was disturbed" if again and block.index > 0 else ""
        return self._continue(new, f"{arm} block {new.index + 1}{why}")

    def _pairs(self, metric: str, level: int | None = None) -> list[float]:
        """Log differences candidate - baseline of each baseline block followed by a candidate
        block, among the blocks with a clean value at `level`."""
        means = self._block_means(metric, self.level if level is None else level)
        ordered = [(self.blocks[b].arm, m) for b, m in sorted(means.items())]
        out = []
        i = 0
        while i + 1 < len(ordered):
            if ordered[i][0] == "baseline" and ordered[i + 1][0] == "candidate":
                out.append(ordered[i + 1][1] - ordered[i][1])
                i += 2
            else:
                i += 1
        return out

    def _block_means(self, metric: str, level: int) -> dict[int, float]:
        """Block -> mean log value of its clean runs; interleaved: the unpaired first block
        left out."""
        first = 1 if self.design is not None and self.design.kind == "interleaved" else 0
        by_block = self.logs.get((level, metric), {})
        return {b: sum(v) / len(v) for b, v in by_block.items() if b >= first}

    # --- before-after --------------------------------------------------------------------

    def _next_before_after(self, block: _Block | None) -> Continue | Stop:
        p = self.policy
        if block is None:
            return self._continue(self._new_block("baseline", "before"), "known-good, before")
        busy = self._busy()
        if busy:
            return self._stop(busy, installed=block.arm)
        if block.phase == "before":
            if self._clean("before") < p.runs and self._count("baseline") < p.max_runs:
                return self._continue(block, f"known-good, before, run {block.passes + 1}")
            new = self._new_block("candidate", "after")
            return self._continue(new, "candidate, run 1")
        if block.phase == "after":
            looks = self._looks()
            interval = (
                self._before_after(p.primary_metric, self.level, with_recheck=False, looks=looks)
                if self._clean("after") >= 2
                else None
            )
            stop = self._stop_reason(
                interval, {"after": self._clean("after"), "unit": "candidate runs"}
            )
            within = (
                self._count("candidate") < self._looks() - 1
                and self._seconds_left() >= self._run_s()
            )
            if stop is None and within:
                return self._continue(block, f"candidate, run {block.passes + 1}")
            self.interim = interval
            self.phase_why = stop or Reason(
                code=Code.BOUND_BEFORE_AFTER,
                values={
                    "candidate_max": self._looks() - 1,
                    "max_seconds": p.max_seconds,
                    **self._spent(),
                },
            )
            new = self._new_block("baseline", "recheck")
            return self._continue(new, "known-good re-check, run 1")
        if self._clean("recheck") < p.recheck_runs and block.passes < 2 * p.recheck_runs:
            return self._continue(block, f"known-good re-check, run {block.passes + 1}")
        assert self.phase_why is not None  # set when the re-check began
        return self._stop(self.phase_why, installed="baseline")

    def _looks(self) -> int:
        """Before-after: planned looks, one per candidate run and the final one. Candidate
        runs stop at twice the known-good's: beyond that the known-good's own runs bound
        the interval and more candidate runs barely narrow it."""
        return min(self.policy.max_runs, 2 * max(self._clean("before"), 2)) + 1

    def _segment(self, phase: Phase, metric: str, level: int) -> stats.Segment | None:
        blocks = {b.index for b in self.blocks if b.phase == phase}
        runs = [
            r
            for r in self.runs
            if r.block in blocks and r.level == level and r.disturbed is None and metric in r.values
        ]
        if not runs:
            return None
        return stats.Segment(
            tuple(math.log(r.values[metric]) for r in runs),
            float(np.mean([r.at_s - r.summary.duration_s / 2 for r in runs])),
        )

    def _before_after(
        self, metric: str, level: int, *, with_recheck: bool, looks: int
    ) -> stats.Interval | None:
        before = self._segment("before", metric, level)
        after = self._segment("after", metric, level)
        recheck = self._segment("recheck", metric, level) if with_recheck else None
        if before is None or after is None or (with_recheck and recheck is None):
            return None
        return stats.before_after_interval(
            before,
            after,
            recheck,
            self.policy.confidence,
            looks,
            self.policy.autocorrelation,
            stats.to_log(self.policy.drift_pct_per_hour) / 3600.0,
        )

    # --- shared --------------------------------------------------------------------------

    def _interval(self, metric: str, level: int) -> stats.Interval | None:
        if self.design.kind == "interleaved":
            pairs = self._pairs(metric, level)
            return stats.anytime_interval(pairs, self.policy.confidence) if pairs else None
        return self._before_after(metric, level, with_recheck=True, looks=self._looks())

    def _stop_reason(
        self, primary: stats.Interval | None, after: dict[str, Value]
    ) -> Reason | None:
        """Why to stop now, or None: too busy, a guardrail breached, or the primary decided.
        `after`: how many looks the interval rests on, and of what."""
        p = self.policy
        busy = self._busy()
        if busy:
            return busy
        # p99 TTFT's interval only in the interleaved design: before-after's needs the re-check.
        ttft = self._interval("ttft_p99", self.level) if self.design.kind == "interleaved" else None
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
                code=Code.STOP_FORCED, values={"forced": self.forced, **after, **self._spent()}
            )
        found = PRIMARY.classify(p, lo, hi)
        if found == "unresolved":
            return None
        return Reason(
            code=Code.STOP_DECIDED,
            values={"finding": found, "shows": _SHOWS[found], **after, **self._spent()},
        )

    def _busy(self) -> Reason | None:
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

    def _stop(self, why: Reason, installed: Arm) -> Stop:
        notes: list[Reason] = []
        effects = []
        for level in self.levels:
            for metric in METRICS:
                interval = self._interval(metric, level)
                if interval is None or not math.isfinite(interval.lo):
                    continue
                effects.append(self._effect(metric, level, interval))
        if self.design.kind == "before-after" and self.interim is not None:
            est, lo, hi = self.interim.pct
            notes.append(
                Reason(
                    code=Code.INTERIM,
                    values={
                        "drift_pct_per_hour": self.policy.drift_pct_per_hour,
                        "pct": est,
                        "lo_pct": lo,
                        "hi_pct": hi,
                    },
                )
            )
        if self.design.kind == "before-after":
            drift = self._drift_note()
            if drift:
                notes.append(drift)
        if self.design.kind == "interleaved" and not any(
            e.metric == self.policy.primary_metric and e.concurrency == self.level for e in effects
        ):
            n = len(self._pairs(self.policy.primary_metric))
            alpha = 1 - self.policy.confidence
            least = next(m for m in range(2, 999) if stats.anytime_multiplier(m, alpha) < math.inf)
            notes.append(
                Reason(
                    code=Code.TOO_FEW_PAIRS,
                    values={"pairs": n, "level": self.level, "least": least},
                )
            )
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

    def _drift_note(self) -> Reason | None:
        metric = self.policy.primary_metric
        before = self._segment("before", metric, self.level)
        recheck = self._segment("recheck", metric, self.level)
        if before is None or recheck is None:
            return None
        minutes = (recheck.at_s - before.at_s) / 60
        return Reason(
            code=Code.DRIFT,
            values={"pct": stats.to_pct(recheck.mean - before.mean), "minutes": minutes},
        )

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

    def _new_block(self, arm: Arm, phase: Phase) -> _Block:
        block = _Block(arm, len(self.blocks), phase)
        self.blocks.append(block)
        return block

    def _continue(self, block: _Block, step: str) -> Continue:
        block.pending = set(self.levels)
        first = block.passes == 0
        # The first block runs on the server as found (the known-good): no restart.
        return Continue(
            block.arm, restart=first and block.index > 0, warmup=first, step=step, block=block.index
        )

    def _count(self, arm: Arm) -> int:
        return sum(1 for r in self.runs if r.arm == arm and r.level == self.level)

    def _clean(self, phase: Phase) -> int:
        blocks = {b.index for b in self.blocks if b.phase == phase}
        return sum(
            1 for r in self.runs if r.block in blocks and r.level == self.level and not r.disturbed
        )

    def _block_s(self) -> float:
        return self.clock_s / max(len(self.blocks), 1)

    def _run_s(self) -> float:
        passes = sum(b.passes for b in self.blocks)
        return self.clock_s / max(passes, 1)

    def _seconds_left(self) -> float:
        return self.policy.max_seconds - self.clock_s

    def _spent(self) -> dict[str, Value]:
        """What the measurement has cost so far, as reasons.STOPS cite it."""
        return {
            "baseline_runs": self._count("baseline"),
            "candidate_runs": self._count("candidate"),
            "level": self.level,
            "seconds": self.clock_s,
        }
