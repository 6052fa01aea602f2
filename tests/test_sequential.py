"""The sequential procedure on constructed and simulated runs: schedule, stopping, verdicts."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from flagtrial.designs import BeforeAfter, DesignKind, Interleaved, choose_design
from flagtrial.facts import Facts, diff_facts
from flagtrial.judge import goodput
from flagtrial.load.client import RequestRecord
from flagtrial.load.summary import RunSummary
from flagtrial.reasons import Code
from flagtrial.sequential import Continue, Sequential, Stop
from flagtrial.settings import Policy
from harness.runsummaries import summary

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

FACTS = Facts(engine="llamacpp", capacity={"concurrent_requests": 8}, settings={"n_slots": 8})
NO_DIFF = diff_facts(FACTS, FACTS, set())
INTERLEAVED = Interleaved(1, "test")
BEFORE_AFTER = BeforeAfter(3, "test")


Source = Callable[[Continue, int], RunSummary]


def drive(seq: Sequential, source: Source, levels: tuple[int, ...] = (8,)) -> Stop:
    """Answer every Continue with one run per level from `source(step, index)`."""
    index = 0
    while isinstance(step := seq.decision(), Continue):
        for level in levels:
            seq.observe(step.arm, level, source(step, index))
        index += 1
    return step


def noisy(effect_pct: float, cv: float, seed: int, **kw: float) -> Source:
    """Runs with AR(1) noise (lag-1 0.6), the candidate `effect_pct` faster."""
    rng = np.random.default_rng(seed)
    state = [0.0]

    def source(step: Continue, index: int) -> RunSummary:
        state[0] = 0.6 * state[0] + rng.normal(0, cv * 0.8)
        effect = math.log1p(effect_pct / 100) if step.arm == "candidate" else 0.0
        return summary(300 * math.exp(state[0] + effect), **kw)

    return source


def test_design_follows_restart_cost() -> None:
    p = Policy()
    assert choose_design(p, restart_s=0.4, run_s=5.0).kind == "interleaved"
    assert choose_design(p, restart_s=0.4, run_s=5.0).runs_per_block == 1
    assert choose_design(p, restart_s=4.0, run_s=5.0).runs_per_block == 3
    big = choose_design(p, restart_s=180.0, run_s=30.0)
    assert big.kind == "before-after" and "restart 180.0s" in big.why
    assert choose_design(Policy(protocol="before-after"), 0.4, 5.0).kind == "before-after"
    assert choose_design(Policy(protocol="interleaved"), 180.0, 30.0).kind == "interleaved"


def test_interleaved_schedule_alternates_restart_blocks() -> None:
    seq = Sequential(Policy(), [4, 8], design=Interleaved(2, "test"))
    steps = []
    for _ in range(6):
        step = seq.decision()
        assert isinstance(step, Continue)
        steps.append((step.arm, step.restart, step.warmup))
        for level in (4, 8):
            seq.observe(step.arm, level, summary(300.0))
    assert steps == [
        ("baseline", False, True),  # the server as found: a probe, never paired
        ("baseline", False, False),
        ("baseline", True, True),
        ("baseline", False, False),
        ("candidate", True, True),
        ("candidate", False, False),
    ]


def test_observe_must_follow_the_plan() -> None:
    seq = Sequential(Policy(), [4, 8], design=INTERLEAVED)
    step = seq.decision()
    assert isinstance(step, Continue) and step.arm == "baseline"
    with pytest.raises(ValueError, match="not asked for"):
        seq.observe("candidate", 8, summary(300.0))
    seq.observe("baseline", 8, summary(300.0))
    with pytest.raises(ValueError, match=r"missing c=\[4\]"):
        seq.decision()


def test_clear_gain_stops_early_and_keeps() -> None:
    policy = Policy()
    stop = drive(Sequential(policy, [8], design=INTERLEAVED), noisy(15.0, 0.02, seed=1))
    verdict = stop.verdict(policy, NO_DIFF)
    assert verdict.decision == "KEEP" and verdict.finding == "gain"
    assert len(stop.candidate[8]) <= 8  # far below the 40-run bound
    lead = verdict.reasons[0]
    assert (lead.code, lead.values["metric"], lead.values["concurrency"]) == (
        Code.GAIN,
        "output_tok_s",
        8,
    )
    assert (stop.why.code, stop.why.values["finding"]) == (Code.STOP_DECIDED, "gain")
    assert stop.why in verdict.reasons


def test_clear_harm_stops_early_and_reverts() -> None:
    policy = Policy()
    stop = drive(Sequential(policy, [8], design=INTERLEAVED), noisy(-15.0, 0.02, seed=2))
    verdict = stop.verdict(policy, NO_DIFF)
    assert verdict.decision == "REVERT" and verdict.finding == "harm"
    assert len(stop.candidate[8]) <= 8


def test_no_effect_is_shown_equivalent() -> None:
    policy = Policy()
    stop = drive(Sequential(policy, [8], design=INTERLEAVED), noisy(0.0, 0.02, seed=3))
    verdict = stop.verdict(policy, NO_DIFF)
    assert verdict.decision == "INCONCLUSIVE" and verdict.finding == "equivalent"
    assert verdict.reasons[0].code == Code.EQUIVALENT


def test_bound_in_runs_gives_inconclusive_with_the_interval() -> None:
    policy = Policy(max_runs=10)
    stop = drive(Sequential(policy, [8], design=INTERLEAVED), noisy(0.0, 0.15, seed=4))
    verdict = stop.verdict(policy, NO_DIFF)
    assert verdict.decision == "INCONCLUSIVE" and verdict.finding == "unresolved"
    assert (len(stop.baseline[8]), len(stop.candidate[8])) == (10, 9)  # 1 probe, 9 pairs
    lead = verdict.reasons[0]
    assert (lead.code, lead.values["metric"]) == (Code.UNRESOLVED, "output_tok_s")
    assert math.isfinite(lead.values["lo_pct"]) and math.isfinite(lead.values["hi_pct"])
    bound = verdict.first({Code.BOUND_RUNS})
    assert bound is not None and bound.values["max_runs"] == 10
    # what more load would likely settle it, at the effect and noise measured: more pairs,
    # each two blocks of one run at the pace measured
    more = verdict.first({Code.MORE_LOAD})
    assert more is not None and int(more.values["more"]) > 0
    block_s = stop.seconds / (len(stop.baseline[8]) + len(stop.candidate[8]))
    assert more.values["seconds"] == pytest.approx(int(more.values["more"]) * 2 * block_s)


def test_no_bound_stops_a_trial_before_the_candidate_ran() -> None:
    # Two-run blocks and a bound of two runs per arm: the known-good's first two blocks
    # already reach it, yet the candidate still gets its block before the trial stops.
    policy = Policy(max_runs=2)
    stop = drive(Sequential(policy, [8], design=Interleaved(2, "test")), noisy(0.0, 0.1, 9))
    assert len(stop.candidate[8]) == 2
    assert stop.installed == "candidate"
    assert (stop.why.code, stop.why.values["max_runs"]) == (Code.BOUND_RUNS, 2)


def test_a_verdict_fixed_by_the_facts_stops_at_the_first_interval() -> None:
    policy = Policy()
    seq = Sequential(policy, [8], design=INTERLEAVED)
    seq.breached("capacity guardrail")
    stop = drive(seq, noisy(0.0, 0.15, seed=10))
    # the first planned look: the fewest pairs with a finite interval
    assert len(stop.candidate[8]) == INTERLEAVED.looks(policy).at[0]
    assert (stop.why.code, stop.why.values["forced"]) == (Code.STOP_FORCED, "capacity guardrail")
    assert any(e.metric == "output_tok_s" for e in stop.effects)
    # decided: no word of how much more load would settle the interval
    assert not [n for n in stop.notes if n.code in (Code.MORE_LOAD, Code.MORE_LOAD_NO)]


def test_bound_in_seconds() -> None:
    policy = Policy(max_seconds=60)
    stop = drive(Sequential(policy, [8], design=INTERLEAVED), noisy(0.0, 0.15, seed=5))
    assert stop.seconds <= 60
    assert (stop.why.code, stop.why.values["max_seconds"]) == (Code.BOUND_SECONDS, 60)


def test_disturbed_runs_are_set_aside_with_their_reason() -> None:
    policy = Policy()
    seq = Sequential(policy, [8], design=INTERLEAVED)
    source = noisy(15.0, 0.02, seed=6)
    index = 0
    arms = []
    while isinstance(step := seq.decision(), Continue):
        arms.append(step.arm)
        run = source(step, index)
        slow = index % 5 == 4  # every fifth run: a foreign burst halves it
        if slow:
            run = summary(run.output_tok_s / 2)
        why = "disturbed: foreign CPU 1.9 cores" if slow else None
        seq.observe(step.arm, 8, run, disturbed=why)
        index += 1
    # the block after a disturbed one measures the same arm again
    assert all(arms[i + 1] == arms[i] for i in range(4, len(arms) - 1, 5))
    verdict = step.verdict(policy, NO_DIFF)
    assert verdict.decision == "KEEP"
    assert all(r.output_tok_s > 200 for r in stop_runs(step))
    aside = verdict.first({Code.DISTURBED})
    assert aside is not None and "1.9 cores" in aside.values["why"]


def test_disturbed_runs_count_when_the_policy_says_so() -> None:
    policy = Policy(set_aside_disturbed=False)
    seq = Sequential(policy, [8], design=INTERLEAVED)
    while isinstance(step := seq.decision(), Continue):
        seq.observe(step.arm, 8, summary(300.0), disturbed="disturbed: foreign CPU 1.5 cores")
    verdict = step.verdict(policy, NO_DIFF)
    assert verdict.first({Code.BUSY, Code.DISTURBED}) is None
    assert verdict.first({Code.COUNTED_ANYWAY}) is not None
    assert verdict.finding == "equivalent"


def stop_runs(stop: Stop) -> list[RunSummary]:
    return [r for runs in (*stop.baseline.values(), *stop.candidate.values()) for r in runs]


def test_machine_too_busy_to_measure() -> None:
    policy = Policy()
    seq = Sequential(policy, [8], design=INTERLEAVED)
    while isinstance(step := seq.decision(), Continue):
        seq.observe(step.arm, 8, summary(300.0), disturbed="disturbed: foreign CPU 1.5 cores")
    verdict = step.verdict(policy, NO_DIFF)
    assert verdict.decision == "INCONCLUSIVE"
    busy = verdict.first({Code.BUSY})
    assert busy is not None and (busy.values["disturbed"], busy.values["runs"]) == (10, 10)


def test_candidate_errors_stop_at_once_and_revert() -> None:
    policy = Policy()
    seq = Sequential(policy, [8], design=INTERLEAVED)
    stop = drive(seq, lambda step, i: summary(300.0, errors=2 if step.arm == "candidate" else 0))
    assert len(stop.candidate[8]) == 1
    verdict = stop.verdict(policy, NO_DIFF)
    assert verdict.decision == "REVERT"
    assert stop.why.code == Code.STOP_ERRORS
    errors = verdict.first({Code.ERRORS})
    assert errors is not None and (errors.values["errors"], errors.values["total"]) == (2, 16)


def test_stopping_rule_and_verdict_read_errors_alike() -> None:
    """A 5 % error limit, the candidate failing 1 request in 16 (6.25 %, not shown above 5 %)
    while clearly faster: the stopping rule does not stop on it and the verdict does not
    revert on it; 8 in 16 is shown above, and both stop and revert at once."""
    policy = Policy(error_rate_max=0.05)
    source = noisy(15.0, 0.02, seed=12)

    def failing(n: int) -> Source:
        def runs(step: Continue, index: int) -> RunSummary:
            run = source(step, index)
            return summary(run.output_tok_s, errors=n) if step.arm == "candidate" else run

        return runs

    stop = drive(Sequential(policy, [8], design=INTERLEAVED), failing(1))
    verdict = stop.verdict(policy, NO_DIFF)
    assert (stop.why.code, verdict.decision) == (Code.STOP_DECIDED, "KEEP")
    assert verdict.first({Code.ERRORS}) is None
    assert verdict.first({Code.ERRORS_UNPROVEN}) is not None
    stop = drive(Sequential(policy, [8], design=INTERLEAVED), failing(8))
    verdict = stop.verdict(policy, NO_DIFF)
    assert (stop.why.code, verdict.decision) == (Code.STOP_ERRORS, "REVERT")
    assert len(stop.candidate[8]) == 1
    assert verdict.first({Code.ERRORS}) is not None


def test_latency_guardrail_stops_early_and_reverts() -> None:
    policy = Policy()
    rng = np.random.default_rng(7)

    def source(step: Continue, index: int) -> RunSummary:
        ttft = 0.5 * (1.6 if step.arm == "candidate" else 1.0) * math.exp(rng.normal(0, 0.03))
        return summary(300 * math.exp(rng.normal(0, 0.05)), ttft=ttft)

    stop = drive(Sequential(policy, [8], design=INTERLEAVED), source)
    verdict = stop.verdict(policy, NO_DIFF)
    assert verdict.decision == "REVERT"
    assert stop.why.code == Code.STOP_LATENCY
    latency = verdict.first({Code.LATENCY})
    assert latency is not None
    assert (latency.values["metric"], latency.values["concurrency"]) == ("ttft_p99", 8)
    assert latency.values["lo_pct"] > policy.ttft_p99_worse_max_pct


def test_capacity_loss_reverts_a_sequential_gain() -> None:
    policy = Policy()
    stop = drive(Sequential(policy, [8], design=INTERLEAVED), noisy(15.0, 0.02, seed=8))
    smaller = Facts(engine="llamacpp", capacity={"concurrent_requests": 4}, settings={})
    verdict = stop.verdict(policy, diff_facts(FACTS, smaller, set()))
    assert verdict.decision == "REVERT"
    assert verdict.reasons[0].code == Code.GAIN_WITH_COST


def test_wrong_verdicts_are_rare_on_simulated_trials() -> None:
    """A true 5 % harm, CV 3 %, lag-1 0.6: 300 trials, no KEEP; the truth is mostly found."""
    policy = Policy()
    decisions = []
    for seed in range(300):
        stop = drive(
            Sequential(policy, [8], design=INTERLEAVED), noisy(-5.0, 0.03, seed=100 + seed)
        )
        decisions.append(stop.verdict(policy, NO_DIFF).decision)
    assert decisions.count("KEEP") == 0
    assert decisions.count("REVERT") >= 270


def test_before_after_schedule_and_recheck() -> None:
    policy = Policy(runs=3, recheck_runs=2)
    seq = Sequential(policy, [8], design=BEFORE_AFTER)
    plan = []
    source = noisy(20.0, 0.01, seed=9)
    index = 0
    while isinstance(step := seq.decision(), Continue):
        plan.append((step.arm, step.restart))
        seq.observe(step.arm, 8, source(step, index))
        index += 1
    phases = [plan[0], plan[3]]
    assert phases == [("baseline", False), ("candidate", True)]
    assert plan[:3] == [("baseline", False)] * 3
    assert plan[-2:] == [("baseline", True), ("baseline", False)]  # the re-check
    assert step.installed == "baseline"
    verdict = step.verdict(policy, NO_DIFF)
    assert verdict.decision == "KEEP"
    assert verdict.first({Code.DRIFT}) is not None
    assert verdict.first({Code.INTERIM}) is not None


def test_before_after_recheck_catches_drift() -> None:
    """No effect, but the machine speeds up 1 % a run: before/after alone would call it a
    gain; the re-check measures the drift, and the interval covers 0."""
    policy = Policy(runs=4, recheck_runs=4, drift_pct_per_hour=0.0, autocorrelation=0.0)
    seq = Sequential(policy, [8], design=BEFORE_AFTER)
    rng = np.random.default_rng(10)
    index = 0
    while isinstance(step := seq.decision(), Continue):
        seq.observe(step.arm, 8, summary(300 * math.exp(0.01 * index + rng.normal(0, 0.002))))
        index += 1
    verdict = step.verdict(policy, NO_DIFF)
    interim = BEFORE_AFTER.interim(seq)
    assert interim is not None and interim.est > math.log(1.04)
    assert verdict.decision != "KEEP"
    primary = next(e for e in verdict.effects if e.metric == "output_tok_s")
    assert primary.lo_pct < 0 < primary.hi_pct


def test_goodput_as_the_primary_metric() -> None:
    def records(ttft: float, n: int = 16) -> list[RequestRecord]:
        return [
            RequestRecord(True, None, 200, i * 0.25, i * 0.25 + 1.0, ttft, [0.02] * 10, 11)
            for i in range(n)
        ]

    fast, slow = records(0.5), records(1.5)  # limit 1.0 s: all good, none good
    assert goodput(fast, 1.0, 0.1) == pytest.approx(16 / 4.75)
    policy = Policy(primary_metric="goodput", goodput_ttft_max_s=1.0)
    seq = Sequential(policy, [8], design=INTERLEAVED)
    rng = np.random.default_rng(11)
    while isinstance(step := seq.decision(), Continue):
        recs = slow if step.arm == "candidate" and rng.random() < 0.5 else fast
        seq.observe(step.arm, 8, summary(300.0), records=recs)
    verdict = step.verdict(policy, NO_DIFF)
    assert verdict.decision == "REVERT"
    lead = verdict.reasons[0]
    assert (lead.code, lead.values["metric"], lead.values["concurrency"]) == (
        Code.HARM,
        "goodput",
        8,
    )


def test_each_arm_is_reported_with_the_highest_level_that_meets_the_slo() -> None:
    """The SLO (99 % of requests within 1 s TTFT and 0.1 s ITL) read from every run's own
    requests: both arms keep it at c=1; at c=8 the candidate's TTFT is 1.5 s."""

    def records(ttft: float) -> list[RequestRecord]:
        return [
            RequestRecord(True, None, 200, i * 0.25, i * 0.25 + 1.0, ttft, [0.02] * 10, 11)
            for i in range(16)
        ]

    policy = Policy(goodput_ttft_max_s=1.0, primary_concurrency=1)
    seq = Sequential(policy, [1, 8], design=INTERLEAVED)
    while isinstance(step := seq.decision(), Continue):
        for level in (1, 8):
            slow = step.arm == "candidate" and level == 8
            seq.observe(
                step.arm, level, summary(300.0, c=level), records=records(1.5 if slow else 0.5)
            )
    verdict = step.verdict(policy, NO_DIFF)
    slo = {
        r.values["arm"]: r for r in verdict.reasons if r.code in {Code.SLO_MET, Code.SLO_MET_ALL}
    }
    assert (slo["known-good"].code, slo["known-good"].values["level"]) == (Code.SLO_MET_ALL, 8)
    candidate = slo["candidate"]
    assert (candidate.code, candidate.values["level"], candidate.values["over_level"]) == (
        Code.SLO_MET, 1, 8
    )  # fmt: skip
    assert candidate.values["over_share"] == 0.0
    assert candidate.message == (
        "SLO (99% of requests within TTFT 1 s and ITL 0.1 s): candidate meets it up to c=1 "
        "(100.0% there), not at c=8 (0.0%)"
    )


@pytest.mark.parametrize("kind", ["interleaved", "before-after"])
def test_design_chosen_after_the_first_block(kind: DesignKind) -> None:
    """The first block is the same in both designs, so its run time can choose the design:
    the procedure chooses it itself once that block is measured."""
    policy = Policy(runs=3, protocol=kind)
    seq = Sequential(policy, [8], restart_s=0.4)
    first = seq.decision()
    assert isinstance(first, Continue)
    assert (first.arm, first.restart, first.warmup) == ("baseline", False, True)
    assert seq.design is None
    with pytest.raises(ValueError, match="no design before the first block"):
        seq.chosen  # noqa: B018
    seq.observe("baseline", 8, summary(300.0))
    assert seq.design == choose_design(policy, restart_s=0.4, run_s=5.0)
    assert seq.design.kind == kind
    second = seq.decision()
    assert isinstance(second, Continue)
    # interleaved: the first paired block restarts the known-good; before-after goes on
    assert (second.arm, second.restart) == ("baseline", kind == "interleaved")
