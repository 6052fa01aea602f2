"""The statistics on known inputs: interval coverage on simulated data, constructed cases."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from flagtrial import stats

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine


def _ever_misses(diffs: np.ndarray, half: np.ndarray) -> float:
    """Share of sequences (rows) whose running interval excludes the true mean 0 at any n."""
    n = np.arange(1, diffs.shape[1] + 1)
    mean = np.cumsum(diffs, axis=1) / n
    sq = np.cumsum(diffs**2, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        sd = np.sqrt(np.maximum(sq - n * mean**2, 0) / (n - 1))
        miss = np.abs(mean) > half * sd / np.sqrt(n)
    return float(miss[:, 1:].any(axis=1).mean())


def test_confidence_sequence_holds_under_repeated_looks() -> None:
    """Looked at after every pair up to 80 pairs, the 95 % sequence misses in <= 5 % of
    trials; a fixed t interval looked at the same way misses far more often."""
    rng = np.random.default_rng(11)
    diffs = rng.normal(0.0, 0.03, size=(2000, 80))
    ns = np.arange(1, 81)
    anytime = np.array([stats.anytime_multiplier(int(n), 0.05) for n in ns])
    fixed = np.array([np.inf] + [sps.t.ppf(0.975, n - 1) for n in ns[1:]])
    assert _ever_misses(diffs, anytime) <= 0.05
    assert _ever_misses(diffs, fixed) >= 0.2


def test_confidence_sequence_shape() -> None:
    c = [stats.anytime_multiplier(n, 0.05) for n in range(2, 60)]
    assert math.isinf(c[0]) and math.isinf(c[2])  # 2 and 4 pairs exclude nothing
    finite = [x for x in c[:30] if math.isfinite(x)]  # narrows fast up to 30 pairs ...
    assert all(a >= b for a, b in itertools.pairwise(finite))
    assert all(3.2 < x < 3.5 for x in c[30:])  # ... then stays about flat
    # always wider than the one-look t interval at the same n
    assert all(
        x > sps.t.ppf(0.975, n - 1) for n, x in zip(range(2, 60), c, strict=True) if x < math.inf
    )


def test_anytime_interval_on_constructed_pairs() -> None:
    iv = stats.anytime_interval([0.10, 0.11, 0.09, 0.10, 0.10, 0.12, 0.08], 0.95)
    est, lo, hi = iv.pct
    assert est == pytest.approx(10.52, abs=0.01)
    assert 0 < lo < est < hi
    assert stats.anytime_interval([0.1, 0.1], 0.95).lo == -math.inf


def _ar1(rng: np.random.Generator, rows: int, cols: int, phi: float, sd: float) -> np.ndarray:
    x = np.empty((rows, cols))
    x[:, 0] = rng.normal(0, sd, rows)
    for t in range(1, cols):
        x[:, t] = phi * x[:, t - 1] + rng.normal(0, sd * math.sqrt(1 - phi**2), rows)
    return x


def test_paired_blocks_hold_under_autocorrelated_runs() -> None:
    """Blocks A B A B ... on AR(1) noise (lag-1 0.6): the differences of adjacent pairs
    are about independent (their residual correlation is -0.12), so the confidence sequence
    on them still holds at every look."""
    rng = np.random.default_rng(3)
    noise = _ar1(rng, 2000, 120, 0.6, 0.05)
    d = noise[:, 1::2] - noise[:, 0::2]
    r = np.mean([np.corrcoef(row[1:], row[:-1])[0, 1] for row in d])
    assert -0.2 < r < 0.0
    anytime = np.array([stats.anytime_multiplier(int(n), 0.05) for n in range(1, 61)])
    assert _ever_misses(d, anytime) <= 0.05


def test_ar1_mean_factor_matches_the_covariance_matrix() -> None:
    for n, rho in ((1, 0.6), (6, 0.6), (20, 0.3), (5, 0.0)):
        cov = rho ** np.abs(np.subtract.outer(np.arange(n), np.arange(n)))
        exact = cov.sum() / n  # Var(mean) * n / sigma^2
        assert stats.ar1_mean_factor(n, rho) == pytest.approx(exact)


def test_before_after_with_recheck_removes_linear_drift() -> None:
    """No effect, a steady 20 %/30 min drift, 2-minute runs: the A re-check's interpolation
    covers 0 at the nominal rate; before/after without it does not."""
    rng = np.random.default_rng(5)
    drift = math.log(1.2) / 1800  # per second
    hits = naive_hits = 0
    for _ in range(1000):
        t = np.arange(15) * 120.0  # 6 A runs, 6 B runs, 3 A runs, back-to-back
        y = drift * t + _ar1(rng, 1, 15, 0.6, 0.03)[0]
        a, b, a2 = (stats.Segment(tuple(y[i:j]), float(t[i:j].mean())) for i, j in SEGMENTS)
        iv = stats.before_after_interval(a, b, a2, 0.95, 1, 0.6, 0.0)
        hits += iv.lo <= 0 <= iv.hi
        naive = stats.before_after_interval(a, b, None, 0.95, 1, 0.6, 0.0)
        naive_hits += naive.lo <= 0 <= naive.hi
    assert hits / 1000 >= 0.95
    assert naive_hits / 1000 < 0.85


SEGMENTS = ((0, 6), (6, 12), (12, 15))


def test_before_after_drift_bound_widens_the_interval() -> None:
    a = stats.Segment((0.0, 0.01, -0.01), 0.0)
    b = stats.Segment((0.1, 0.11, 0.09), 600.0)
    tight = stats.before_after_interval(a, b, None, 0.95, 1, 0.0, 0.0)
    wide = stats.before_after_interval(a, b, None, 0.95, 1, 0.0, 1e-4)
    assert wide.hi - wide.lo == pytest.approx(tight.hi - tight.lo + 2 * 1e-4 * 600)
    more_looks = stats.before_after_interval(a, b, None, 0.95, 10, 0.0, 0.0)
    assert more_looks.hi - more_looks.lo > tight.hi - tight.lo


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (2.5, 9.0, "gain"),
        (-9.0, -2.5, "harm"),
        (-1.5, 1.8, "equivalent"),
        (-1.0, 4.0, None),
        (-4.0, 1.0, None),
        (1.0, 4.5, None),  # a gain is possible, but not shown
    ],
)
def test_classify(lo: float, hi: float, expected: str | None) -> None:
    assert stats.classify(lo, hi, 2.0, 2.0, (-2.0, 2.0)) == expected


def test_classify_with_a_wider_equivalence_region() -> None:
    assert stats.classify(-4.0, 4.5, 2.0, 2.0, (-5.0, 5.0)) == "equivalent"
    assert stats.classify(2.5, 4.5, 2.0, 2.0, (-5.0, 5.0)) == "gain"  # gain wins


def test_error_rate_lower_bound() -> None:
    assert stats.error_rate_lower(1, 500, 0.95) > 0.0
    assert not stats.error_rate_lower(0, 500, 0.95) > 0.0
    assert not stats.error_rate_lower(2, 100, 0.95) > 0.01  # 2 % observed, not shown above 1 %
    assert stats.error_rate_lower(30, 100, 0.95) > 0.10


def test_pct_and_log_are_inverse() -> None:
    assert stats.to_pct(stats.to_log(5.0)) == pytest.approx(5.0)
    assert stats.to_pct(-math.inf) == -math.inf


def test_pairs_to_settle_finds_the_first_count_whose_interval_fits() -> None:
    diffs = [0.1, -0.1] * 5  # estimate 0, sd 0.105
    margin = stats.to_log(5.0)

    def inside(i: stats.Interval) -> bool:
        return -margin < i.lo and i.hi < margin

    def critical(n: int) -> float:
        return stats.anytime_multiplier(n, 0.05)

    n = stats.pairs_to_settle(diffs, critical, inside, 10_000)
    assert n is not None and n > len(diffs)
    sd = float(np.std(diffs, ddof=1))
    half = critical(n) * sd / math.sqrt(n)
    before = critical(n - 1) * sd / math.sqrt(n - 1)
    assert half < margin <= before  # the first n at which the interval fits
    # an estimate on the margin's edge never fits inside it
    edge = [margin + 0.01, margin - 0.01] * 5
    assert stats.pairs_to_settle(edge, critical, inside, 10_000) is None
