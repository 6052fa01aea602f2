"""The verdict rules (judge.decide) on constructed cases."""

from __future__ import annotations

import numpy as np

from flagtrial import stats
from flagtrial.facts import Facts, FactsDiff, diff_facts
from flagtrial.judge import Effect, Verdict, decide
from flagtrial.load.summary import RunSummary
from flagtrial.settings import Policy
from runsummaries import summary


def facts(slots: float) -> Facts:
    return Facts(
        engine="llamacpp",
        capacity={"concurrent_requests": slots, "kv_tokens": 8192},
        settings={"n_slots": int(slots)},
    )


def runs(values: list[float], **kw: float) -> dict[int, list[RunSummary]]:
    return {8: [summary(v, **kw) for v in values]}


NOISE = [0.98, 1.01, 1.0, 1.02, 0.99]


def judge(
    policy: Policy,
    diff: FactsDiff,
    baseline: dict[int, list[RunSummary]],
    candidate: dict[int, list[RunSummary]],
) -> Verdict:
    """decide() on before/after intervals (no drift, one look) of the primary metric and p99
    TTFT: constructed cases with a known interval, not the sequential procedure (tested in
    test_sequential)."""
    found = []
    for level in baseline:
        for metric in ("output_tok_s", "ttft_p99"):
            a = np.log([getattr(r, metric) for r in baseline[level]])
            b = np.log([getattr(r, metric) for r in candidate[level]])
            before, after = stats.Segment(tuple(a), 0.0), stats.Segment(tuple(b), 0.0)
            iv = stats.before_after_interval(before, after, None, policy.confidence, 1, 0.0, 0.0)
            pct, lo, hi = iv.pct
            found.append(Effect(
                metric=metric, concurrency=level, baseline=float(np.exp(a.mean())),
                candidate=float(np.exp(b.mean())), pct=pct, lo_pct=lo, hi_pct=hi,
                runs_baseline=len(a), runs_candidate=len(b),
            ))  # fmt: skip
    return decide(policy, diff, found, baseline, candidate)


def test_seed_story_no_gain_but_capacity_loss_reverts() -> None:
    before, after = facts(48), facts(26)
    diff = diff_facts(before, after, named_settings=set())
    verdict = judge(
        Policy(), diff, runs([300 * x for x in NOISE]), runs([300 * x for x in NOISE[::-1]])
    )
    assert verdict.decision == "REVERT"
    assert "no real gain, but a cost" in verdict.reasons[0]
    assert any("concurrent requests 48 -> 26 (-45.8 %)" in r for r in verdict.reasons)
    assert any("implicit change" in r and "n_slots" in r for r in verdict.reasons)


def test_real_gain_without_cost_keeps() -> None:
    diff = diff_facts(facts(8), facts(8), set())
    verdict = judge(Policy(), diff, runs([300 * x for x in NOISE]), runs([360 * x for x in NOISE]))
    assert verdict.decision == "KEEP"
    assert "+20.0 %" in verdict.reasons[0]


def test_harm_reverts() -> None:
    diff = diff_facts(facts(8), facts(8), set())
    verdict = judge(Policy(), diff, runs([300 * x for x in NOISE]), runs([200 * x for x in NOISE]))
    assert verdict.decision == "REVERT"
    assert verdict.reasons[0].startswith("harmful")


def test_equivalent_without_cost_is_inconclusive() -> None:
    diff = diff_facts(facts(8), facts(8), set())
    verdict = judge(Policy(), diff, runs([300.0, 301, 299, 300]), runs([300.5, 299.5, 300, 300.2]))
    assert verdict.decision == "INCONCLUSIVE"
    assert "no effect beyond the margins" in verdict.reasons[0]


def test_wide_interval_is_inconclusive() -> None:
    diff = diff_facts(facts(8), facts(8), set())
    verdict = judge(Policy(), diff, runs([200.0, 400]), runs([250.0, 420]))
    assert verdict.decision == "INCONCLUSIVE"
    assert "too wide" in verdict.reasons[0]


def test_gain_with_errors_reverts() -> None:
    diff = diff_facts(facts(8), facts(8), set())
    verdict = judge(
        Policy(), diff, runs([300 * x for x in NOISE]), runs([360 * x for x in NOISE], errors=2)
    )
    assert verdict.decision == "REVERT"
    assert "a gain that breaks a guardrail" in verdict.reasons[0]
    assert any("requests failed" in r for r in verdict.reasons)


def test_named_settings_are_not_implicit() -> None:
    diff = diff_facts(facts(8), facts(4), named_settings={"n_slots"})
    assert diff.implicit == []
    assert [c.name for c in diff.explicit] == ["n_slots"]
    assert diff.worst_capacity_loss() is not None
    assert diff.worst_capacity_loss().pct == -50.0


def test_short_outputs_are_called_out() -> None:
    diff = diff_facts(facts(8), facts(8), set())
    base = runs([300 * x for x in NOISE])
    base[8][0] = base[8][0].model_copy(update={"n_short": 3})
    verdict = judge(Policy(), diff, base, runs([300 * x for x in NOISE]))
    assert any("3 known-good requests returned fewer tokens" in r for r in verdict.reasons)
