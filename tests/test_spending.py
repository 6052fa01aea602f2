"""Planned looks with alpha spending: the repeated intervals cover the true effect at every
look together, as often as the confidence says, and are narrower than the confidence
sequence they replace; checked on simulated pairs drawn apart from the calibration's."""

from __future__ import annotations

import numpy as np
import pytest

from flagtrial import spending, stats

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine


def test_looks_grow_geometrically_to_the_horizon() -> None:
    looks = spending.plan(39, 0.05)
    assert looks.at[0] == spending.FIRST_LOOK and looks.horizon == 39
    steps = [b / a for a, b in zip(looks.at, looks.at[1:], strict=False)]
    assert all(1.2 <= s <= 2.0 for s in steps)
    assert spending.plan(3, 0.05).at == (spending.FIRST_LOOK,)  # no look before the first


@pytest.mark.parametrize(("horizon", "tails"), [(12, False), (39, False), (39, True)])
def test_every_look_covers_the_truth_together_at_the_confidence(horizon: int, tails: bool) -> None:
    """Simultaneous coverage over all planned looks, for normal pairs and for heavy-tailed
    ones: the difference of two exponential block values (a pair of blocks of the same
    server differs symmetrically, however skewed one block's noise is)."""
    looks = spending.plan(horizon, 0.05)
    rng = np.random.default_rng(7)
    trials, missed = 4000, 0
    for _ in range(trials):
        if tails:
            diffs = rng.exponential(1.0, horizon) - rng.exponential(1.0, horizon)
        else:
            diffs = rng.normal(0.0, 1.0, horizon)
        for n in looks.at:
            iv = stats.paired_interval(diffs[:n], looks.critical(n))
            if not iv.lo <= 0.0 <= iv.hi:
                missed += 1
                break
    rate = missed / trials
    assert rate <= 0.05 + 3 * (0.05 * 0.95 / trials) ** 0.5  # within the simulation's error
    if not tails:
        assert rate >= 0.04  # the error rate is spent, not thrown away


def test_a_look_between_planned_ones_is_a_final_look_that_keeps_the_rate() -> None:
    looks = spending.plan(39, 0.05)
    a, b = looks.at[1], looks.at[2]
    between = looks.critical(a + 1)
    assert between is not None
    # it spends what the plan has spent by then: between the two planned looks' values
    assert looks.critical(b) <= between <= looks.critical(a)  # type: ignore[operator]
    assert looks.critical(looks.at[0] - 1) is None


def test_narrower_than_the_confidence_sequence_at_every_look() -> None:
    looks = spending.plan(39, 0.05)
    for n in looks.at:
        c = looks.critical(n)
        assert c is not None and c < stats.anytime_multiplier(n, 0.05)
