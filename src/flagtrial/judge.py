"""Statistics and policy -> verdict.

The effect of a change on a metric is the ratio of geometric means of the per-run values,
candidate over baseline, with a Welch t interval computed on log-scale run values: run
throughputs are positive and their noise is multiplicative, so a log scale makes the interval
symmetric in ratio terms and the relative change is what the policy's margins are written in.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel
from scipy import stats

from flagtrial.facts import FactsDiff
from flagtrial.load.summary import RunSummary
from flagtrial.settings import Policy

Decision = Literal["KEEP", "REVERT", "INCONCLUSIVE"]

# metric -> (label, higher is better)
METRICS: dict[str, tuple[str, bool]] = {
    "output_tok_s": ("output tok/s", True),
    "request_rate": ("requests/s", True),
    "ttft_p50": ("TTFT p50", False),
    "ttft_p99": ("TTFT p99", False),
    "itl_p50": ("ITL p50", False),
}


class Effect(BaseModel):
    metric: str
    concurrency: int
    baseline: float
    candidate: float
    pct: float
    lo_pct: float
    hi_pct: float
    runs_baseline: int
    runs_candidate: int

    @property
    def label(self) -> str:
        return METRICS[self.metric][0]

    def describe(self) -> str:
        return (
            f"{self.label} at c={self.concurrency}: {self.baseline:.4g} -> {self.candidate:.4g} "
            f"({self.pct:+.1f} %, {self.lo_pct:+.1f} .. {self.hi_pct:+.1f} %)"
        )


class Verdict(BaseModel):
    decision: Decision
    reasons: list[str]
    effects: list[Effect]


def relative_change(
    baseline: list[float], candidate: list[float], confidence: float
) -> tuple[float, float, float]:
    """Relative change in % with its confidence interval (Welch t on log values)."""
    a = np.log(np.asarray(baseline, dtype=float))
    b = np.log(np.asarray(candidate, dtype=float))
    diff = float(b.mean() - a.mean())
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0.0:
        half = 0.0
    else:
        df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
        half = float(stats.t.ppf(0.5 + confidence / 2, df)) * se

    def pct(x: float) -> float:
        return (math.exp(x) - 1.0) * 100.0

    return pct(diff), pct(diff - half), pct(diff + half)


def effects(
    baseline: dict[int, list[RunSummary]], candidate: dict[int, list[RunSummary]], confidence: float
) -> list[Effect]:
    out = []
    for level in sorted(set(baseline) & set(candidate)):
        for metric in METRICS:
            a = [getattr(r, metric) for r in baseline[level]]
            b = [getattr(r, metric) for r in candidate[level]]
            if len(a) < 2 or len(b) < 2 or any(v is None or v <= 0 for v in (*a, *b)):
                continue
            pct, lo, hi = relative_change(a, b, confidence)
            out.append(
                Effect(
                    metric=metric,
                    concurrency=level,
                    baseline=float(np.exp(np.mean(np.log(a)))),
                    candidate=float(np.exp(np.mean(np.log(b)))),
                    pct=pct,
                    lo_pct=lo,
                    hi_pct=hi,
                    runs_baseline=len(a),
                    runs_candidate=len(b),
                )
            )
    return out


def capacity_breach(policy: Policy, diff: FactsDiff) -> str | None:
    """The capacity guardrail, read from the server's own facts."""
    worst = diff.worst_capacity_loss()
    if worst is not None and -worst.pct > policy.capacity_loss_max_pct:
        return (
            f"capacity loss: {worst.describe()}, beyond the {policy.capacity_loss_max_pct:g} % "
            "guardrail"
        )
    return None


def _find(found: list[Effect], metric: str, level: int) -> Effect | None:
    return next((e for e in found if e.metric == metric and e.concurrency == level), None)


def judge(
    policy: Policy,
    diff: FactsDiff,
    baseline: dict[int, list[RunSummary]],
    candidate: dict[int, list[RunSummary]],
) -> Verdict:
    """One primary metric decides gain or harm; capacity, p99 TTFT and errors are guardrails.

    "No real gain, but a cost" is a REVERT: a guardrail breach needs a proven gain to be
    even discussed, and here guardrails are hard limits, so any breach reverts.
    """
    found = effects(baseline, candidate, policy.confidence)
    level = policy.primary_concurrency or max(baseline)
    costs: list[str] = []
    reasons: list[str] = []

    capacity = capacity_breach(policy, diff)
    if capacity:
        costs.append(capacity)
    for change in diff.implicit:
        reasons.append(f"implicit change (not named by the change): {change.describe()}")

    for lvl, runs in sorted(candidate.items()):
        errors = sum(r.n_errors for r in runs)
        total = sum(r.n_requests for r in runs)
        rate = errors / total if total else 0.0
        if rate > policy.error_rate_max:
            costs.append(
                f"errors at c={lvl}: {errors}/{total} requests failed ({rate:.1%}), "
                f"guardrail {policy.error_rate_max:.1%}"
            )

    for arm, arm_runs in (("known-good", baseline), ("candidate", candidate)):
        short = sum(r.n_short for runs in arm_runs.values() for r in runs)
        if short:
            reasons.append(
                f"warning: {short} {arm} requests returned fewer tokens than max_tokens "
                "(the server cut them, e.g. a full slot context): throughput compares unequal work"
            )

    ttft = _find(found, "ttft_p99", level)
    if ttft and ttft.lo_pct > policy.ttft_p99_worse_max_pct:
        costs.append(
            f"latency guardrail: {ttft.describe()}, worse than +{policy.ttft_p99_worse_max_pct:g} %"
        )

    primary = _find(found, policy.primary_metric, level)
    if primary is None:
        return Verdict(
            decision="INCONCLUSIVE",
            effects=found,
            reasons=[
                *costs,
                *reasons,
                f"no usable {METRICS[policy.primary_metric][0]} runs at c={level}",
            ],
        )

    if primary.hi_pct < -policy.harm_margin_pct:
        return Verdict(
            decision="REVERT",
            effects=found,
            reasons=[
                f"harmful: {primary.describe()}, "
                f"the whole interval below -{policy.harm_margin_pct:g} %",
                *costs,
                *reasons,
            ],
        )
    gain = primary.lo_pct > policy.improvement_margin_pct
    if costs:
        why = "a gain that breaks a guardrail" if gain else "no real gain, but a cost"
        return Verdict(
            decision="REVERT",
            effects=found,
            reasons=[f"{why}: {primary.describe()}", *costs, *reasons],
        )
    if gain:
        return Verdict(
            decision="KEEP",
            effects=found,
            reasons=[
                f"real improvement: {primary.describe()}, the whole interval above "
                f"+{policy.improvement_margin_pct:g} %",
                "no guardrail breached",
                *reasons,
            ],
        )
    margin = policy.improvement_margin_pct
    if -policy.harm_margin_pct < primary.lo_pct and primary.hi_pct < margin:
        what = "no effect beyond the margins"
    else:
        what = "the interval is too wide to tell"
    return Verdict(
        decision="INCONCLUSIVE",
        effects=found,
        reasons=[f"{what}: {primary.describe()}", "no guardrail breached", *reasons],
    )
