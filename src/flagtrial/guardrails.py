"""The decision rules, each evaluated in one place: the primary metric and the guardrails
(capacity, p99 TTFT, errors).

A rule reads the Evidence and answers with Reasons (flagtrial.reasons). The verdict
(flagtrial.judge.decide), the stopping rule (flagtrial.sequential) and the trial's capacity
REVERT (flagtrial.trial) call the same rules, so they cannot disagree. A new guardrail is one
class here with a `check`, listed in GUARDRAILS (and in MEASURED if it may stop a
measurement early), and its codes in flagtrial.reasons.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from flagtrial import stats
from flagtrial.facts import FactsDiff
from flagtrial.load.summary import RunSummary
from flagtrial.reasons import Code, Reason, Value
from flagtrial.settings import Policy

if TYPE_CHECKING:
    from flagtrial.judge import Effect

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


@dataclass(frozen=True)
class Evidence:
    """What the rules read: effects with intervals, the clean runs of both arms by level,
    and the facts' diff (None while measuring: capacity is read once, from the candidate's
    facts, when it first starts)."""

    level: int  # the primary concurrency
    effects: Sequence[Effect]
    baseline: Mapping[int, Sequence[RunSummary]]
    candidate: Mapping[int, Sequence[RunSummary]]
    diff: FactsDiff | None = None

    def effect(self, metric: str) -> Effect | None:
        return next(
            (e for e in self.effects if e.metric == metric and e.concurrency == self.level), None
        )


class Guardrail(Protocol):
    # the code of the reason a measurement stopped early on this guardrail gives
    stop: Code

    def check(self, policy: Policy, evidence: Evidence) -> list[Reason]:
        """Breaches (Reason.breach) and what else the guardrail saw that a verdict shows."""
        ...


class Capacity:
    """Capacity may not fall by more than capacity_loss_max_pct, read from the server's own
    facts."""

    stop = Code.STOP_FORCED

    def breach(self, policy: Policy, diff: FactsDiff) -> Reason | None:
        worst = diff.worst_capacity_loss()
        if worst is None or -worst.pct <= policy.capacity_loss_max_pct:
            return None
        return Reason(
            code=Code.CAPACITY,
            values={
                "name": worst.name,
                "before": worst.before,
                "after": worst.after,
                "pct": worst.pct,
                "bound_by": worst.bound_by or "",
                "change": worst.describe(),
                "limit": policy.capacity_loss_max_pct,
            },
        )

    def check(self, policy: Policy, evidence: Evidence) -> list[Reason]:
        breach = self.breach(policy, evidence.diff) if evidence.diff is not None else None
        return [breach] if breach else []


class Latency:
    """p99 TTFT at the primary level may not grow by more than ttft_p99_worse_max_pct: a
    breach when the whole interval lies beyond the limit."""

    stop = Code.STOP_LATENCY

    def check(self, policy: Policy, evidence: Evidence) -> list[Reason]:
        ttft = evidence.effect("ttft_p99")
        if ttft is None or ttft.lo_pct <= policy.ttft_p99_worse_max_pct:
            return []
        return [
            Reason(
                code=Code.LATENCY, values={**ttft.values(), "limit": policy.ttft_p99_worse_max_pct}
            )
        ]


class Errors:
    """The candidate's error rate at each level may not exceed error_rate_max: a breach when
    the one-sided Clopper-Pearson lower bound at the trial's confidence is above the limit
    (with limit 0, any error). Read from the clean runs, as every other rule is."""

    stop = Code.STOP_ERRORS

    def check(self, policy: Policy, evidence: Evidence) -> list[Reason]:
        found = []
        for level, runs in sorted(evidence.candidate.items()):
            errors = sum(r.n_errors for r in runs)
            total = sum(r.n_requests for r in runs)
            rate = errors / total if total else 0.0
            if rate <= policy.error_rate_max:
                continue
            lower = stats.error_rate_lower(errors, total, policy.confidence)
            code = Code.ERRORS if lower > policy.error_rate_max else Code.ERRORS_UNPROVEN
            values: dict[str, Value] = {
                "level": level,
                "errors": errors,
                "total": total,
                "rate": rate,
                "limit": policy.error_rate_max,
                "lower": lower,
                "confidence": policy.confidence,
            }
            found.append(Reason(code=code, values=values))
        return found


# In the order a verdict lists their breaches.
CAPACITY = Capacity()
GUARDRAILS: tuple[Guardrail, ...] = (CAPACITY, Errors(), Latency())
# The guardrails the stopping rule looks at after every block; capacity is read from the
# facts instead, and a breach there fixes the verdict (Sequential.forced).
MEASURED: tuple[Guardrail, ...] = GUARDRAILS[1:]


class Primary:
    """The primary metric at the primary level decides gain or harm, by where its interval
    lies against the margins."""

    def classify(self, policy: Policy, lo_pct: float, hi_pct: float) -> Finding:
        found = stats.classify(
            lo_pct,
            hi_pct,
            policy.improvement_margin_pct,
            policy.harm_margin_pct,
            policy.equivalence_bounds_pct,
        )
        return found or "unresolved"

    def check(self, policy: Policy, evidence: Evidence, cost: bool) -> tuple[Finding, Reason]:
        """The finding, and the reason that leads the verdict (`cost`: a guardrail is
        breached)."""
        effect = evidence.effect(policy.primary_metric)
        if effect is None:
            level = evidence.level
            return "unresolved", Reason(
                code=Code.NO_INTERVAL,
                values={
                    "metric": policy.primary_metric,
                    "label": METRICS[policy.primary_metric][0],
                    "level": level,
                    "baseline_runs": len(evidence.baseline.get(level, [])),
                    "candidate_runs": len(evidence.candidate.get(level, [])),
                },
            )
        finding = self.classify(policy, effect.lo_pct, effect.hi_pct)
        code, margin = {
            "harm": (Code.HARM, policy.harm_margin_pct),
            "gain": (Code.GAIN, policy.improvement_margin_pct),
            "equivalent": (Code.EQUIVALENT, policy.equivalence_margin_pct),
            "unresolved": (Code.UNRESOLVED, None),
        }[finding]
        if cost and finding != "harm":
            code, margin = (
                (Code.GAIN_WITH_COST if finding == "gain" else Code.COST_WITHOUT_GAIN),
                None,
            )
        values = effect.values()
        return finding, Reason(
            code=code, values=values if margin is None else {**values, "margin": margin}
        )


PRIMARY = Primary()


class Slo:
    """Not a guardrail (nothing reverts on it): each arm's highest workload level whose clean
    runs kept the SLO, at least slo_good_share of their requests within both goodput limits,
    counted up from the lowest level to the first that missed it (or was not counted). A
    per-arm fact beside the verdict, not a metric: it is a threshold over levels, read once
    at the end, with no interval the procedure could stop on (README, "How a verdict is
    reached")."""

    def check(self, policy: Policy, evidence: Evidence) -> list[Reason]:
        arms = (("known-good", evidence.baseline), ("candidate", evidence.candidate))
        return [r for arm, runs in arms if (r := self.highest(policy, arm, runs)) is not None]

    def highest(
        self, policy: Policy, arm: str, by_level: Mapping[int, Sequence[RunSummary]]
    ) -> Reason | None:
        limits: dict[str, Value] = {
            "arm": arm,
            "target": policy.slo_good_share,
            "ttft_max": policy.goodput_ttft_max_s,
            "itl_max": policy.goodput_itl_max_s,
        }
        met: dict[str, Value] | None = None
        for level in sorted(by_level):
            counted = [r for r in by_level[level] if r.n_good is not None]
            total = sum(r.n_requests for r in counted)
            if not total:
                break
            rate = counted[0].offered_rate
            found: dict[str, Value] = {
                "level": level,
                "share": sum(r.n_good or 0 for r in counted) / total,
                "requests": total,
                "load": f"{rate:g} req/s (c={level})" if rate is not None else f"c={level}",
            }
            if float(found["share"]) < policy.slo_good_share:
                if met is None:
                    return Reason(code=Code.SLO_MISSED, values={**limits, **found})
                over = {f"over_{k}": v for k, v in found.items()}
                return Reason(code=Code.SLO_MET, values={**limits, **met, **over})
            met = found
        return None if met is None else Reason(code=Code.SLO_MET_ALL, values={**limits, **met})


SLO = Slo()
