"""Effects with intervals, and policy -> Verdict.

The effect of a change on a metric is the ratio of geometric means of the per-run values,
candidate over baseline. The sequential protocols (flagtrial.sequential) compute its
interval; `decide` turns intervals and the facts' diff into KEEP, REVERT or INCONCLUSIVE.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

from flagtrial import stats
from flagtrial.facts import FactsDiff
from flagtrial.load.client import RequestRecord
from flagtrial.load.summary import RunSummary
from flagtrial.settings import Policy

Decision = Literal["KEEP", "REVERT", "INCONCLUSIVE"]
# What the primary metric's interval showed, whatever the guardrails say.
Finding = Literal["gain", "harm", "equivalent", "unresolved"]

# metric -> (label, higher is better); all but goodput are RunSummary fields.
METRICS: dict[str, tuple[str, bool]] = {
    "output_tok_s": ("output tok/s", True),
    "request_rate": ("requests/s", True),
    "goodput": ("goodput req/s", True),
    "ttft_p50": ("TTFT p50", False),
    "ttft_p99": ("TTFT p99", False),
    "itl_p50": ("ITL p50", False),
}


def goodput(records: Sequence[RequestRecord], ttft_max_s: float, itl_max_s: float) -> float:
    """Requests per second that succeeded within both limits: TTFT, and mean inter-token
    latency (time per output token after the first). Over the run's whole duration.

    None good counts as half a request: a collapse must show as a large drop on the log
    scale, not as a run without a value."""
    if not records:
        return 0.0
    duration = max(r.end for r in records) - min(r.start for r in records)
    good = sum(
        1
        for r in records
        if r.ok
        and r.ttft_s is not None
        and r.ttft_s <= ttft_max_s
        and (not r.itl_s or sum(r.itl_s) / len(r.itl_s) <= itl_max_s)
    )
    return max(good, 0.5) / duration if duration > 0 else 0.0


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
    finding: Finding | None = None


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


def decide(
    policy: Policy,
    diff: FactsDiff,
    found: list[Effect],
    baseline: dict[int, list[RunSummary]],
    candidate: dict[int, list[RunSummary]],
    notes: Sequence[str] = (),
) -> Verdict:
    """One primary metric decides gain or harm; capacity, p99 TTFT and errors are guardrails.

    "No real gain, but a cost" is a REVERT: a guardrail breach needs a proven gain to be
    even discussed, and here guardrails are hard limits, so any breach reverts. `notes` (how
    the measurement ended, disturbed runs) follow the deciding reason.
    """
    level = policy.primary_concurrency or max(baseline)
    costs: list[str] = []
    reasons: list[str] = list(notes)

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
            decision="REVERT" if costs else "INCONCLUSIVE",
            effects=found,
            finding="unresolved",
            reasons=[
                f"no interval for {METRICS[policy.primary_metric][0]} at c={level}: "
                f"{len(baseline.get(level, []))} known-good and "
                f"{len(candidate.get(level, []))} candidate clean runs",
                *costs,
                *reasons,
            ],
        )

    eq_lo, eq_hi = policy.equivalence_bounds_pct
    finding = stats.classify(
        primary.lo_pct,
        primary.hi_pct,
        policy.improvement_margin_pct,
        policy.harm_margin_pct,
        (eq_lo, eq_hi),
    )
    if finding == "harm":
        return Verdict(
            decision="REVERT",
            effects=found,
            finding=finding,
            reasons=[
                f"harmful: {primary.describe()}, "
                f"the whole interval below -{policy.harm_margin_pct:g} %",
                *costs,
                *reasons,
            ],
        )
    if costs:
        why = "a gain that breaks a guardrail" if finding == "gain" else "no real gain, but a cost"
        return Verdict(
            decision="REVERT",
            effects=found,
            finding=finding or "unresolved",
            reasons=[f"{why}: {primary.describe()}", *costs, *reasons],
        )
    if finding == "gain":
        return Verdict(
            decision="KEEP",
            effects=found,
            finding=finding,
            reasons=[
                f"real improvement: {primary.describe()}, the whole interval above "
                f"+{policy.improvement_margin_pct:g} %",
                "no guardrail breached",
                *reasons,
            ],
        )
    if finding == "equivalent":
        what = (
            "no effect beyond the margins "
            f"(the whole interval inside +-{policy.equivalence_margin_pct:g} %)"
        )
    else:
        what = "the interval is too wide to tell"
    return Verdict(
        decision="INCONCLUSIVE",
        effects=found,
        finding=finding or "unresolved",
        reasons=[f"{what}: {primary.describe()}", "no guardrail breached", *reasons],
    )
