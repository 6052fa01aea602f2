"""The measured design as a procedure: driven by simulated servers whose per-edit effects and
noise are known, it names each edit's main effect, sees an interaction it cannot separate,
and needs fewer runs than one edit at a time for the same intervals."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from flagtrial.attribution.factorial import Design, Factorial
from flagtrial.attribution.search import Subset
from flagtrial.settings import Policy

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

POLICY = Policy()


def drive(
    edits: int, truth: Callable[[Subset], float], noise: float, seed: int, limit: int = 60
) -> Factorial:
    """Replicates until the design decides (or `limit`): `truth` gives an arm's log metric."""
    rng = np.random.default_rng(seed)
    factorial = Factorial(Design.of(frozenset(range(edits))), POLICY, margin_pct=5.0)
    while not factorial.done() and factorial.replicates < limit:
        factorial.observe({a: truth(a) + rng.normal(0, noise) for a in factorial.design.arms})
    return factorial


def additive(effects: dict[int, float]) -> Callable[[Subset], float]:
    """log metric: 5 plus each edit's effect (in %) present in the arm."""
    return lambda arm: 5.0 + sum(math.log1p(effects.get(i, 0.0) / 100) for i in arm)


def test_two_edits_run_the_full_factorial_and_three_a_half_fraction_with_the_known_good() -> None:
    two = Design.of(frozenset({0, 1}))
    assert set(two.arms) == {frozenset(), frozenset({0}), frozenset({1}), frozenset({0, 1})}
    assert two.arms[0] == frozenset({0, 1}) and not two.known_good_added
    three = Design.of(frozenset({0, 1, 2}))
    # I = ABC: each edit alone and all three; the known-good added to see an interaction
    assert set(three.arms) == {
        frozenset({0, 1, 2}), frozenset({0}), frozenset({1}), frozenset({2}), frozenset(),
    }  # fmt: skip
    assert three.known_good_added
    five = Design.of(frozenset({0, 1, 2, 3, 4}))
    assert five.rows == 8 and len(set(five.arms)) == len(five.arms) == 9
    # every pair of edits' columns is balanced: main effects are estimated apart
    assert (five.signs.T @ five.signs == 8 * np.eye(5)).all()


def test_the_arms_order_is_drawn_anew_each_replicate() -> None:
    design = Design.of(frozenset({0, 1, 2}))
    orders = {tuple(design.order(r)) for r in range(6)}
    assert len(orders) > 1 and all(set(o) == set(design.arms) for o in orders)


@pytest.mark.parametrize("seed", range(5))
def test_three_edits_each_main_effect_found(seed: int) -> None:
    """-30 % on edit 0, +25 % on edit 2, nothing on edit 1; 3 % noise per run."""
    factorial = drive(3, additive({0: -30.0, 2: 25.0}), 0.03, seed)
    findings = [f for _, f in factorial.effects()]
    assert findings == ["harm", "equivalent", "gain"]
    assert factorial.interaction() is None
    (harm, _, _), (_, lo, hi), (gain, _, _) = (iv.pct for iv, _ in factorial.effects())
    assert harm == pytest.approx(-30.0, abs=4) and gain == pytest.approx(25.0, abs=4)
    assert lo > -5.0 and hi < 5.0


@pytest.mark.parametrize("seed", range(5))
def test_a_pair_that_harms_only_together_is_an_interaction(seed: int) -> None:
    """Each edit alone does nothing; both together lose 40 %."""

    def truth(arm: Subset) -> float:
        return 5.0 + (math.log(0.6) if arm == frozenset({0, 1}) else 0.0)

    factorial = drive(2, truth, 0.03, seed)
    assert factorial.interaction() is not None
    assert factorial.done()


def test_additive_edits_show_no_interaction_on_any_seed() -> None:
    """No false interaction where the effects add up (20 designs run to their limit)."""
    for seed in range(20):
        factorial = drive(3, additive({0: -20.0, 1: 10.0}), 0.05, seed, limit=15)
        assert factorial.interaction() is None, seed


def test_the_design_needs_fewer_runs_than_one_edit_at_a_time() -> None:
    """For 2, 3 and 6 edits: the runs one at a time would need for the same widths
    (known-good and each edit alone) against the design's own."""
    for edits, saving in ((2, 1.5), (3, 1.6), (6, 28 / 9)):
        design = Design.of(frozenset(range(edits)))
        assert design.alone_visits(10) / (len(design.arms) * 10) == pytest.approx(saving, rel=0.01)


def test_one_edit_at_a_time_at_the_same_runs_is_wider() -> None:
    """The claim behind alone_visits: the design's main-effect interval is about 1/sqrt(2)
    the width of the difference of two means from as many runs per arm (3 edits)."""
    rng = np.random.default_rng(7)
    design = Design.of(frozenset({0, 1, 2}))
    mains, alone = [], []
    for _ in range(4000):
        logs = {a: rng.normal(0, 1) for a in design.arms}
        mains.append(design.contrasts(logs)[0][0])
        alone.append(logs[frozenset({0})] - logs[frozenset()])
    assert np.std(mains) / np.std(alone) == pytest.approx(1 / math.sqrt(2), rel=0.05)


def test_before_any_replicate_every_edit_is_undecided() -> None:
    """A bound or a start that failed may stop the design before its first replicate."""
    factorial = Factorial(Design.of(frozenset({0, 1})), POLICY, margin_pct=5.0)
    assert [f for _, f in factorial.effects()] == [None, None]
    assert factorial.interaction() is None and not factorial.done()
