"""Measured effects of several edits at once: a two-level design over subsets of the edits,
measured in replicates. A procedure without I/O, like `Sequential`: `arms` are the subsets to
run, `order(r)` the order replicate r runs them in, `observe()` takes one replicate's log
values, `done()` says whether the intervals have decided.

The design is the rows of a Sylvester-Hadamard matrix of N = the smallest power of two above
the number of edits: for two edits the full factorial (the known-good, each edit alone, both),
for more a regular fraction (the edits on the columns that keep main effects clear of
two-edit interactions longest: the single-bit columns, then the highest-order products); its
first row is the whole change. Where the fraction lacks the known-good it is added, so the
design can see an interaction. Each replicate gives every edit's main effect (the mean log
metric of the arms with the edit minus that of the arms without): every arm informs every
edit, so the same runs give each edit an interval half as wide as a probe of the edit alone
against the known-good (variance 4/N of one run's against 2 for the probe). The interaction
checks are the columns no edit takes (the interactions aliased there) and, where it was
added, the known-good against what the main effects predict for it. Every value goes through
the trial's confidence sequence (stats.anytime_interval), the confidence split over the edits
and the checks, so the design may stop after any replicate.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy.linalg import hadamard

from flagtrial import stats
from flagtrial.attribution.search import Subset
from flagtrial.settings import Policy

Finding = stats.Finding


def _columns(n: int, k: int) -> list[int]:
    """The columns of the order-n Sylvester matrix the k edits take: the single-bit columns
    (a full factorial in those), then products of the most bits first."""
    others = sorted(range(1, n), key=lambda c: (c.bit_count() != 1, -c.bit_count(), c))
    return others[:k]


@dataclass(frozen=True)
class Design:
    """The arms over `edits` (indices of the change's edits), the Hadamard rows first."""

    edits: tuple[int, ...]
    signs: np.ndarray  # rows x edits, +1 where the row's arm has the edit
    spare: np.ndarray  # rows x unused columns: the interactions' contrasts
    arms: tuple[Subset, ...]
    known_good_added: bool

    @classmethod
    def of(cls, edits: Subset) -> Design:
        ordered = tuple(sorted(edits))
        n = 2
        while n < len(ordered) + 1:
            n *= 2
        matrix = hadamard(n)
        columns = _columns(n, len(ordered))
        signs = matrix[:, columns]
        spare = matrix[:, [c for c in range(1, n) if c not in columns]]
        arms = [frozenset(e for e, s in zip(ordered, row, strict=True) if s > 0) for row in signs]
        added = frozenset() not in arms
        if added:
            arms.append(frozenset())
        return cls(ordered, signs, spare, tuple(arms), added)

    @property
    def rows(self) -> int:
        return len(self.signs)

    def order(self, replicate: int) -> list[Subset]:
        """The arms in an order drawn for this replicate: a drift over a replicate cannot line
        up with one edit's contrast in every replicate."""
        arms = list(self.arms)
        random.Random(replicate).shuffle(arms)
        return arms

    def contrasts(self, logs: Mapping[Subset, float]) -> tuple[list[float], list[float]]:
        """One replicate's main effect per edit and its interaction checks."""
        y = np.array([logs[a] for a in self.arms[: self.rows]])
        half = self.rows / 2
        mains = [float(col @ y) / half for col in self.signs.T]
        # scaled to what a two-edit interaction aliased there adds when both edits are in
        checks = [float(col @ y) / (half / 2) for col in self.spare.T]
        if self.known_good_added:
            predicted = float(y.mean()) - sum(mains) / 2
            checks.append(logs[frozenset()] - predicted)
        return mains, checks

    def alone_visits(self, replicates: int) -> int:
        """Visits (a restart and its runs) one edit at a time would take for the same
        interval widths: the known-good and each edit alone, as many visits each as make a
        difference of two means as precise as a main effect here (N/2 per replicate)."""
        return (len(self.edits) + 1) * self.rows * replicates // 2


@dataclass
class Factorial:
    """The replicates of one design, and what their intervals decide."""

    design: Design
    policy: Policy
    margin_pct: float  # no effect within +- this
    mains: list[list[float]] = field(default_factory=list)  # per replicate, per edit
    checks: list[list[float]] = field(default_factory=list)

    @property
    def replicates(self) -> int:
        return len(self.mains)

    def observe(self, logs: Mapping[Subset, float]) -> None:
        mains, checks = self.design.contrasts(logs)
        self.mains.append(mains)
        self.checks.append(checks)

    def _confidence(self) -> float:
        # every edit's interval and every check hold together (Bonferroni)
        looks = len(self.design.edits) + len(self.checks[0] if self.checks else [])
        return 1.0 - (1.0 - self.policy.confidence) / max(looks, 1)

    def _interval(self, values: list[float]) -> stats.Interval:
        return stats.anytime_interval(values, self._confidence())

    def _classify(self, interval: stats.Interval) -> Finding | None:
        _, lo, hi = interval.pct
        p = self.policy
        return stats.classify(
            lo, hi, p.improvement_margin_pct, p.harm_margin_pct, (-self.margin_pct, self.margin_pct)
        )

    def effects(self) -> list[tuple[stats.Interval, Finding | None]]:
        """Per edit (in `design.edits` order), its main effect's interval and finding."""
        by_edit = [list(col) for col in zip(*self.mains, strict=True)]
        if not by_edit:  # no replicate finished: nothing measured yet
            by_edit = [[] for _ in self.design.edits]
        return [(iv, self._classify(iv)) for iv in map(self._interval, by_edit)]

    def interaction(self) -> stats.Interval | None:
        """A check whose interval lies wholly beyond a margin: edits that act otherwise
        together than apart, whose main effects this design cannot separate."""
        if not self.checks:
            return None
        for values in zip(*self.checks, strict=True):
            interval = self._interval(list(values))
            if self._classify(interval) in ("gain", "harm"):
                return interval
        return None

    def done(self) -> bool:
        """Every edit decided, or an interaction shown."""
        if self.replicates < 2:
            return False
        return self.interaction() is not None or all(f for _, f in self.effects())
