"""Effects with intervals, and policy -> Verdict.

The effect of a change on a metric is the ratio of geometric means of the per-run values,
candidate over baseline. The sequential protocols (flagtrial.sequential) compute its
interval; `decide` turns intervals and the facts' diff into KEEP, REVERT or INCONCLUSIVE by
the rules of flagtrial.guardrails.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal

from pydantic import BaseModel

from flagtrial.facts import FactsDiff
from flagtrial.guardrails import GUARDRAILS, METRICS, PRIMARY, SLO, Evidence, Finding
from flagtrial.load.client import RequestRecord
from flagtrial.load.summary import RunSummary
from flagtrial.reasons import EFFECT, Code, Reason, Value
from flagtrial.settings import Policy

Decision = Literal["KEEP", "REVERT", "INCONCLUSIVE"]


def good_requests(records: Sequence[RequestRecord], ttft_max_s: float, itl_max_s: float) -> int:
    """Requests that succeeded within both limits: TTFT, and mean inter-token latency (time
    per output token after the first)."""
    return sum(
        1
        for r in records
        if r.ok
        and r.ttft_s is not None
        and r.ttft_s <= ttft_max_s
        and (not r.itl_s or sum(r.itl_s) / len(r.itl_s) <= itl_max_s)
    )


def metric_values(
    policy: Policy, summary: RunSummary, records: Sequence[RequestRecord] | None
) -> dict[str, float]:
    """A run's value of every metric it has (goodput needs its records); none that is not
    positive, for the log scale."""
    values: dict[str, float] = {}
    for metric in METRICS:
        if metric == "goodput":
            if records is None:
                continue
            value: float | None = goodput(
                records, policy.goodput_ttft_max_s, policy.goodput_itl_max_s
            )
        else:
            value = getattr(summary, metric)
        if value is not None and value > 0:
            values[metric] = float(value)
    return values


def goodput(records: Sequence[RequestRecord], ttft_max_s: float, itl_max_s: float) -> float:
    """Requests per second that succeeded within both limits (good_requests), over the run's
    whole duration.

    None good counts as half a request: a collapse must show as a large drop on the log
    scale, not as a run without a value."""
    if not records:
        return 0.0
    duration = max(r.end for r in records) - min(r.start for r in records)
    good = good_requests(records, ttft_max_s, itl_max_s)
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

    def values(self) -> dict[str, Value]:
        """What a reason about this effect cites (rendered by reasons.EFFECT)."""
        return {
            "metric": self.metric,
            "label": self.label,
            "concurrency": self.concurrency,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "pct": self.pct,
            "lo_pct": self.lo_pct,
            "hi_pct": self.hi_pct,
        }

    def describe(self) -> str:
        return EFFECT.format_map(self.values())


class Verdict(BaseModel):
    decision: Decision
    reasons: list[Reason]
    effects: list[Effect]
    finding: Finding | None = None

    @classmethod
    def revert(cls, *reasons: Reason) -> Verdict:
        """A REVERT that ends the trial before any interval: the candidate did not start,
        died, broke a guardrail read from its facts, or the comparison is void."""
        return cls(decision="REVERT", reasons=list(reasons), effects=[])

    def first(self, codes: Collection[Code]) -> Reason | None:
        """The first reason with one of `codes`, if any."""
        return next((r for r in self.reasons if r.code in codes), None)

    def adding(self, *after: Reason, before: Sequence[Reason] = ()) -> Verdict:
        """This verdict with more reasons: `before` the deciding one, or after all."""
        return self.model_copy(update={"reasons": [*before, *self.reasons, *after]})


def decide(
    policy: Policy,
    diff: FactsDiff,
    found: list[Effect],
    baseline: dict[int, list[RunSummary]],
    candidate: dict[int, list[RunSummary]],
    notes: Sequence[Reason] = (),
) -> Verdict:
    """One primary metric decides gain or harm; capacity, p99 TTFT and errors are guardrails.

    "No real gain, but a cost" is a REVERT: a guardrail breach needs a proven gain to be
    even discussed, and here guardrails are hard limits, so any breach reverts. `notes` (how
    the measurement ended, disturbed runs) follow the deciding reason.
    """
    evidence = Evidence(
        policy.primary_concurrency or max(baseline), found, baseline, candidate, diff
    )
    checked = [r for rule in GUARDRAILS for r in rule.check(policy, evidence)]
    costs = [r for r in checked if r.breach]
    reasons = [*notes]
    for change in diff.implicit:
        reasons.append(
            Reason(
                code=Code.IMPLICIT_CHANGE, values={"name": change.name, "change": change.describe()}
            )
        )
    for arm, arm_runs in (("known-good", baseline), ("candidate", candidate)):
        short = sum(r.n_short for runs in arm_runs.values() for r in runs)
        if short:
            reasons.append(Reason(code=Code.SHORT_OUTPUTS, values={"count": short, "arm": arm}))
    reasons += [r for r in checked if not r.breach]
    reasons += SLO.check(policy, evidence)

    finding, lead = PRIMARY.check(policy, evidence, cost=bool(costs))
    decision: Decision
    if costs or finding == "harm":
        decision, said = "REVERT", costs
    else:
        decision = "KEEP" if finding == "gain" else "INCONCLUSIVE"
        said = [] if lead.code == Code.NO_INTERVAL else [Reason(code=Code.NO_BREACH)]
    return Verdict(
        decision=decision, effects=found, finding=finding, reasons=[lead, *said, *reasons]
    )
