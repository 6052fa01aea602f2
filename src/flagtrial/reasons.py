"""Typed reasons: what a rule found, as a code and the values it read; the message people read
is rendered from them.

Every reason a verdict, a stopped measurement or an early REVERT gives is a Reason, built by
the rule that found it (flagtrial.guardrails, flagtrial.sequential, flagtrial.trial). The
ledger stores reasons with their codes, so tools and tests read codes and numbers, not prose.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, computed_field

Value = int | float | str


class Code(StrEnum):
    # the primary metric: what its interval shows, and the verdict it leads to
    GAIN = "gain"
    HARM = "harm"
    EQUIVALENT = "equivalent"
    UNRESOLVED = "unresolved"
    NO_INTERVAL = "no-interval"
    GAIN_WITH_COST = "gain-with-cost"
    COST_WITHOUT_GAIN = "cost-without-gain"
    NO_BREACH = "no-breach"
    # guardrail breaches (BREACHES), and what a guardrail saw without a breach
    CAPACITY = "capacity"
    LATENCY = "latency"
    ERRORS = "errors"
    ERRORS_UNPROVEN = "errors-unproven"
    # why the measurement stopped (STOPS)
    STOP_ERRORS = "stop-errors"
    STOP_LATENCY = "stop-latency"
    STOP_DECIDED = "stop-decided"
    STOP_FORCED = "stop-forced"
    BUSY = "busy"
    BOUND_RUNS = "bound-runs"
    BOUND_SECONDS = "bound-seconds"
    BOUND_LOOKS = "bound-looks"
    BOUND_BEFORE_AFTER = "bound-before-after"
    # notes on the measurement and the facts
    INTERIM = "interim"
    DRIFT = "drift"
    TOO_FEW_PAIRS = "too-few-pairs"
    MORE_LOAD = "more-load"
    MORE_LOAD_NO = "more-load-no"
    # before the load: what the bound can resolve at the noise an earlier trial measured
    RESOLVES = "resolves"
    RESOLVES_NO_EQUIVALENCE = "resolves-no-equivalence"
    RESOLVES_NOTHING = "resolves-nothing"
    RESOLVES_UNKNOWN = "resolves-unknown"
    DISTURBED = "disturbed"
    COUNTED_ANYWAY = "counted-anyway"
    IMPLICIT_CHANGE = "implicit-change"
    SHORT_OUTPUTS = "short-outputs"
    # each arm's highest workload level that kept the SLO (guardrails.Slo)
    SLO_MET = "slo-met"
    SLO_MET_ALL = "slo-met-all"
    SLO_MISSED = "slo-missed"
    # the trial's own: early REVERTs and what it saw while switching arms
    CANDIDATE_NOT_READY = "candidate-not-ready"
    SERVER_DIED = "server-died"
    BASELINE_FACTS_CHANGED = "baseline-facts-changed"
    CAPACITY_GUARD_REVERT = "capacity-guard-revert"
    CANDIDATE_FACTS_CHANGED = "candidate-facts-changed"
    NOT_KEPT = "not-kept"
    SOURCE_GATE = "source-gate"
    # the engine's own resolution before the restart, held against the candidate's report
    PREDICTION_CONFIRMED = "prediction-confirmed"
    PREDICTION_MISSED = "prediction-missed"
    # a reason recorded as plain text, before reasons had codes (ledger schema 3 and older)
    TEXT = "text"


BREACHES = frozenset({Code.CAPACITY, Code.LATENCY, Code.ERRORS})
STOPS = frozenset(
    {
        Code.STOP_ERRORS,
        Code.STOP_LATENCY,
        Code.STOP_DECIDED,
        Code.STOP_FORCED,
        Code.BUSY,
        Code.BOUND_RUNS,
        Code.BOUND_SECONDS,
        Code.BOUND_LOOKS,
        Code.BOUND_BEFORE_AFTER,
    }
)

# An effect's values (flagtrial.judge.Effect.values) as people read them.
EFFECT = (
    "{label} at c={concurrency}: {baseline:.4g} -> {candidate:.4g} "
    "({pct:+.1f} %, {lo_pct:+.1f} .. {hi_pct:+.1f} %)"
)
_NOISE = (
    "before the load, at the noise trial {trial} measured (pair differences spread "
    "{sd_pct:.1f} %, {block_s:.0f} s a block)"
)
_SPENT = "{baseline_runs}+{candidate_runs} runs at c={level}, {seconds:.0f}s"
_AFTER = "after {after} {unit}"
_SLO = "SLO ({target:.0%} of requests within TTFT {ttft_max:g} s and ITL {itl_max:g} s)"
MESSAGES: dict[Code, str] = {
    Code.GAIN: f"real improvement: {EFFECT}, the whole interval above +{{margin:g}} %",
    Code.HARM: f"harmful: {EFFECT}, the whole interval below -{{margin:g}} %",
    Code.EQUIVALENT: (
        f"no effect beyond the margins (the whole interval inside +-{{margin:g}} %): {EFFECT}"
    ),
    Code.UNRESOLVED: f"the interval is too wide to tell: {EFFECT}",
    Code.NO_INTERVAL: (
        "no interval for {label} at c={level}: {baseline_runs} known-good and "
        "{candidate_runs} candidate clean runs"
    ),
    Code.GAIN_WITH_COST: f"a gain that breaks a guardrail: {EFFECT}",
    Code.COST_WITHOUT_GAIN: f"no real gain, but a cost: {EFFECT}",
    Code.NO_BREACH: "no guardrail breached",
    Code.CAPACITY: "capacity loss: {change}, beyond the {limit:g} % guardrail",
    Code.LATENCY: f"latency guardrail: {EFFECT}, worse than +{{limit:g}} %",
    Code.ERRORS: (
        "errors at c={level}: {errors}/{total} requests failed ({rate:.1%}), guardrail {limit:.1%}"
    ),
    Code.ERRORS_UNPROVEN: (
        "errors at c={level}: {errors}/{total} requests failed ({rate:.1%}), above the "
        "{limit:.1%} guardrail but not with {confidence:.0%} confidence (at least {lower:.1%})"
    ),
    Code.STOP_ERRORS: "error guardrail: {errors}/{total} candidate requests failed at c={level}",
    Code.STOP_LATENCY: f"latency guardrail breached {_AFTER}",
    Code.STOP_DECIDED: f"the interval shows {{shows}} {_AFTER}; {_SPENT}",
    Code.STOP_FORCED: (
        "the verdict is already fixed by the {forced}: measured only until the effect had an "
        f"interval, {_AFTER}; {_SPENT}"
    ),
    Code.BUSY: (
        "machine too busy to measure: {disturbed} of {runs} runs at c={level} disturbed, "
        "last: {last}"
    ),
    Code.BOUND_RUNS: f"bound: {{max_runs}} runs per arm; {_SPENT}",
    Code.BOUND_SECONDS: f"bound: {{max_seconds:g}}s of measurement; {_SPENT}",
    Code.BOUND_LOOKS: (
        "bound: the last of {looks} planned looks, at the {pairs} pairs max_runs and "
        f"max_seconds allow; {_SPENT}"
    ),
    Code.BOUND_BEFORE_AFTER: (
        f"bound: {{candidate_max}} candidate runs or {{max_seconds:g}}s of measurement; {_SPENT}"
    ),
    Code.INTERIM: (
        "before the re-check (drift bounded by {drift_pct_per_hour:g} %/h): "
        "{pct:+.1f} % ({lo_pct:+.1f} .. {hi_pct:+.1f} %)"
    ),
    Code.DRIFT: (
        "known-good drift: {pct:+.1f} % between before and re-check, {minutes:.1f} min apart; "
        "interpolated out of the effect"
    ),
    Code.TOO_FEW_PAIRS: "{pairs} clean pairs at c={level}: an interval needs at least {least}",
    Code.MORE_LOAD: "about {more} more clean pairs at c={level} (about {seconds:.0f} s of load "
    "and restarts at this pace) would likely settle it, at the effect and noise measured",
    Code.MORE_LOAD_NO: "more load would likely not settle it within {limit} pairs: the estimate "
    "({pct:+.1f} %) lies near a margin",
    Code.RESOLVES: (
        f"{_NOISE}: its bound (about {{pairs}} pairs) likely (4 in 5) resolves a gain or harm "
        "of {mde:.1f} % or more, and shows no effect for a true effect within +-{within:.1f} %"
    ),
    Code.RESOLVES_NO_EQUIVALENCE: (
        f"{_NOISE}: its bound (about {{pairs}} pairs) likely (4 in 5) resolves a gain or harm "
        "of {mde:.1f} % or more, but is unlikely to show no effect within +-{margin:g} %: more "
        "max_seconds or max_runs, or a quieter workload, would"
    ),
    Code.RESOLVES_NOTHING: (
        f"{_NOISE}: its bound gives too few pairs ({{pairs}}) for an interval: raise max_seconds "
        "or max_runs"
    ),
    Code.RESOLVES_UNKNOWN: (
        "no earlier trial on this target measured this workload's noise: what the bound can "
        "resolve is said from this trial on"
    ),
    Code.DISTURBED: (
        "{disturbed} of {runs} runs set aside as disturbed, e.g. {arm} c={level}: {why}"
    ),
    Code.COUNTED_ANYWAY: (
        "{counted} runs had foreign load beyond the limits and were counted anyway "
        "(set_aside_disturbed = false)"
    ),
    Code.IMPLICIT_CHANGE: "implicit change (not named by the change): {change}",
    Code.SHORT_OUTPUTS: (
        "warning: {count} {arm} requests returned fewer tokens than max_tokens (the server cut "
        "them, e.g. a full slot context): throughput compares unequal work"
    ),
    Code.SLO_MET: (
        f"{_SLO}: {{arm}} meets it up to {{load}} ({{share:.1%}} there), not at {{over_load}} "
        "({over_share:.1%})"
    ),
    Code.SLO_MET_ALL: f"{_SLO}: {{arm}} meets it at every level, up to {{load}} ({{share:.1%}})",
    Code.SLO_MISSED: f"{_SLO}: {{arm}} misses it from the lowest level, {{load}} ({{share:.1%}})",
    Code.CANDIDATE_NOT_READY: "{error}",
    Code.SERVER_DIED: "{error}",
    Code.BASELINE_FACTS_CHANGED: (
        "the known-good restarted with other facts than before, so the comparison is void: "
        "{mismatches}"
    ),
    Code.CAPACITY_GUARD_REVERT: "capacity_guard = revert: no load spent on the candidate",
    Code.CANDIDATE_FACTS_CHANGED: (
        "the candidate's facts changed between its restarts: {mismatches}"
    ),
    Code.NOT_KEPT: (
        "not kept: the candidate restarted with other facts than it was measured with: {mismatches}"
    ),
    Code.SOURCE_GATE: "source gate: {setting}: {outcome} ({why})",
    Code.PREDICTION_CONFIRMED: (
        "predicted implicit changes confirmed: the candidate reports {settings} settings as the "
        "engine's own resolution predicted them, {implicit} of {predicted} predicted implicit "
        "changes among them"
    ),
    Code.PREDICTION_MISSED: (
        "the candidate reports {count} of {compared} settings otherwise than the engine's own "
        "resolution predicted: {mismatches}"
    ),
    Code.TEXT: "{text}",
}


class Reason(BaseModel):
    """A code, the values the rule read, and (rendered from them) the message."""

    code: Code
    values: dict[str, Value] = Field(default_factory=dict)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def message(self) -> str:
        return MESSAGES[self.code].format_map(self.values)

    @property
    def breach(self) -> bool:
        """Whether this is a guardrail breach: a cost that reverts any verdict."""
        return self.code in BREACHES


def coded(reasons: list[Any]) -> list[dict[str, Any]]:
    """Reasons as the ledger stores them: one recorded as plain text (schema 3 and older)
    becomes a TEXT reason with its words; one with a code stays as it is."""
    return [
        Reason(code=Code.TEXT, values={"text": r}).model_dump() if isinstance(r, str) else r
        for r in reasons
    ]
