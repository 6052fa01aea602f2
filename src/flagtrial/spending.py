"""Planned looks with alpha spending: the interleaved design's repeated confidence intervals.

A confidence sequence (stats.anytime_interval) stays valid after any number of looks over
any horizon, and pays for it: after 12 pairs its half-width is 3.68 standard errors at
95 %, and never below 3.3.
A trial is bounded (max_runs, max_seconds), so its horizon is known once its first block is
measured; looking only at a few planned pair counts, spaced geometrically up to that
horizon, and spending the error rate over them (Lan-DeMets, Pocock type: early looks get a
fair share, so a clear answer stops early) gives repeated intervals that all cover the true
effect together with probability 1 - alpha (Jennison & Turnbull, ch. 9), narrower at every
look: 3.31 standard errors after 12 pairs of 39, 2.53 at the last; below the confidence
sequence from the first look on (tests/test_spending.py).

The critical value of each look is calibrated on simulated paths of the t statistic of iid
normal pair differences, which does not depend on the mean or the spread (it is pivotal),
so the coverage is exact up to the simulation's error (about +-0.001 at alpha 0.05 with
PATHS paths; seeded, the same values every time). A look the plan did not have (a trial
stopped by a bound between looks) is a final look: its value spends what the plan had
spent by then, so stopping there keeps the error rate too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# The first look: a t statistic on fewer pairs has too heavy tails to decide much.
FIRST_LOOK = 4
# Each look after that at about this many times the pairs of the one before.
GROWTH = 1.25
PATHS = 100_000
# Paths for "how many more pairs would settle it", a likely figure scanned over many plans.
ADVICE_PATHS = 10_000
_SEED = 20261202


def spent(alpha: float, fraction: float) -> float:
    """Error rate spent by `fraction` of the horizon (Lan-DeMets, Pocock type)."""
    return alpha * math.log1p((math.e - 1.0) * min(max(fraction, 0.0), 1.0))


@dataclass(frozen=True)
class Looks:
    """The planned looks of one trial: pair counts, the last one the horizon."""

    at: tuple[int, ...]
    alpha: float

    @property
    def horizon(self) -> int:
        return self.at[-1]

    def critical(self, pairs: int, paths: int = PATHS) -> float | None:
        """The half-width in standard errors of the interval after `pairs` pairs, when a
        look is taken there: a planned look, or a final one between looks; None before the
        first look."""
        if pairs < self.at[0]:
            return None
        taken = self.at if pairs >= self.horizon else (*(a for a in self.at if a < pairs), pairs)
        return _critical(taken, self.horizon, self.alpha, paths)[-1]

    def is_look(self, pairs: int) -> bool:
        return pairs in self.at


def plan(horizon: int, alpha: float) -> Looks:
    """Looks from FIRST_LOOK pairs, each about GROWTH times the last, ending at `horizon`
    (a look that would fall within a third of a step of the horizon is merged into it)."""
    horizon = max(horizon, FIRST_LOOK)
    at = [FIRST_LOOK]
    while at[-1] < horizon:
        step = max(at[-1] + 1, math.ceil(at[-1] * GROWTH))
        if step >= horizon or horizon - step < (step - at[-1]) / 3:
            step = horizon
        at.append(step)
    return Looks(tuple(at), alpha)


@lru_cache(maxsize=512)
def _critical(looks: tuple[int, ...], horizon: int, alpha: float, paths: int) -> tuple[float, ...]:
    """Critical values of |t| at `looks` such that the chance of any crossing by look j is
    what the spending function allows by then, on seeded simulated paths."""
    rng = np.random.default_rng(_SEED)
    s1 = np.zeros(paths)
    s2 = np.zeros(paths)
    alive = np.ones(paths, dtype=bool)
    n = 0
    out: list[float] = []
    for look in looks:
        while n < look:
            x = rng.standard_normal(paths)
            s1 += x
            s2 += x * x
            n += 1
        mean = s1 / n
        var = np.maximum(s2 - n * mean * mean, 1e-300) / (n - 1)
        t = np.abs(mean) / np.sqrt(var / n)
        allowed = spent(alpha, look / horizon) * paths - (paths - int(alive.sum()))
        candidates = np.sort(t[alive])[::-1]
        k = int(allowed)
        c = math.inf if k <= 0 else float(candidates[min(k, len(candidates) - 1)])
        out.append(c)
        alive &= ~(t > c)
    return tuple(out)
