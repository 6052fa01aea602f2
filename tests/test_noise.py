"""What a trial's bound can resolve at the noise an earlier trial measured: the statement is
checked against the looks the trial plans (flagtrial.spending) on simulated pairs of that
spread, and found again from the ledger by the next trial of the workload."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flagtrial import spending, stats
from flagtrial.guardrails import PRIMARY
from flagtrial.noise import Noise, bound_pairs, resolvable
from flagtrial.reasons import Code
from flagtrial.settings import Policy

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

POLICY = Policy(max_seconds=200, max_runs=40)


def noise(sd_pct: float, block_s: float = 4.0) -> Noise:
    return Noise(workload="w", pair_sd=stats.to_log(sd_pct), pairs=8, block_s=block_s,
                 runs_per_block=1)  # fmt: skip


def resolved_share(effect_pct: float, sd: Noise, pairs: int, want: str, seed: int = 0) -> float:
    """How often the trial's interval after `pairs` pairs (or sooner) decides `want`."""
    rng = np.random.default_rng(seed)
    looks = spending.plan(pairs, 1.0 - POLICY.confidence)
    hits = 0
    for _ in range(2000):
        diffs = rng.normal(stats.to_log(effect_pct), sd.pair_sd, pairs)
        for n in looks.at:
            _, lo, hi = stats.paired_interval(diffs[:n], looks.critical(n)).pct
            if (found := PRIMARY.classify(POLICY, lo, hi)) != "unresolved":
                hits += found == want
                break
    return hits / 2000


def test_the_bound_in_pairs_is_the_tighter_of_runs_and_seconds() -> None:
    assert bound_pairs(POLICY, noise(3.0, block_s=4.0)) == 24  # (200 - 4) // 8
    assert bound_pairs(POLICY, noise(3.0, block_s=1.0)) == 39  # 40 runs, the first unpaired
    assert bound_pairs(Policy(max_seconds=10), noise(3.0, block_s=4.0)) == 0


def test_the_stated_effect_is_resolved_four_times_in_five() -> None:
    """At the stated minimal detectable effect the procedure decides harm at least 4 times
    in 5 within the bound; at half the distance to the margin, far less often."""
    sd = noise(4.0)
    said = resolvable(POLICY, sd, trial_id=7)
    assert said.code == Code.RESOLVES
    pairs, mde = int(said.values["pairs"]), float(said.values["mde"])
    assert 2.0 < mde < 10.0
    assert resolved_share(-mde, sd, pairs, "harm") >= 0.78
    assert resolved_share(-(2.0 + mde) / 2, sd, pairs, "harm") < 0.6
    # and no effect is shown for a true effect inside the stated width, 4 times in 5
    within = float(said.values["within"])
    assert resolved_share(within * 0.99, sd, pairs, "equivalent") >= 0.78
    assert "trial 7 measured" in said.message and f"{mde:.1f} %" in said.message


def test_a_noise_too_wide_for_the_margin_says_no_effect_cannot_be_shown() -> None:
    said = resolvable(POLICY, noise(15.0), trial_id=3)
    assert said.code == Code.RESOLVES_NO_EQUIVALENCE
    assert resolved_share(0.0, noise(15.0), int(said.values["pairs"]), "equivalent") < 0.2
    assert "cannot show no effect" in said.message or "unlikely to show" in said.message


def test_a_bound_too_short_for_an_interval_says_so() -> None:
    said = resolvable(Policy(max_seconds=10), noise(3.0), trial_id=1)
    assert said.code == Code.RESOLVES_NOTHING and "raise max_seconds" in said.message


@pytest.mark.parametrize("sd_pct", [1.0, 3.0, 8.0])
def test_the_effect_grows_with_the_noise(sd_pct: float) -> None:
    mde = float(resolvable(POLICY, noise(sd_pct), 1).values["mde"])
    assert mde > POLICY.harm_margin_pct
    assert math.isclose(
        mde - POLICY.harm_margin_pct,
        (float(resolvable(POLICY, noise(2 * sd_pct), 1).values["mde"]) - 2.0) / 2,
        rel_tol=0.1,
    )
