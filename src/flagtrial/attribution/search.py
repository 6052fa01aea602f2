"""Which edits of a change carry its fact effects (a capacity loss, an implicit change): group
testing over subsets of the edits, each subset one restart and one facts read. A procedure
without I/O, like `Sequential`: `next()` names the subset to start, `observe()` takes the
effects that subset showed, until `next()` has nothing left to ask.

Each effect is searched by halving: of a group known to carry it, the first half is started
alone, then the second; a half that shows it is searched on; when neither half does, only the
edits together do (an interaction). Every read serves every effect (its result is kept by
subset), and a group of one needs no restart. Edits that cannot touch a fact (a flag set to
the value the engine takes anyway) are left out before the search starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Subset = frozenset[int]


@dataclass
class Culprits:
    """For one effect: the edits that carry it alone, and groups that carry it only together."""

    alone: set[int] = field(default_factory=set)
    together: list[Subset] = field(default_factory=list)


@dataclass
class FactSearch:
    """Search for the edits behind each of `effects`, all shown by the whole change
    (edits 0..n-1), among `candidates` (the edits that can touch a fact)."""

    effects: set[str]
    candidates: Subset
    seen: dict[Subset, set[str]] = field(default_factory=dict)
    found: dict[str, Culprits] = field(default_factory=dict)
    # per effect, groups still to split: each known (or assumed) to carry the effect
    _open: dict[str, list[Subset]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for effect in self.effects:
            self.found[effect] = Culprits()
            self._open[effect] = [self.candidates] if self.candidates else []

    def next(self) -> Subset | None:
        """The next subset to start and read, or None when every effect is attributed."""
        for effect in sorted(self.effects):
            while (step := self._step(effect)) is not None:
                if step in self.seen:
                    self._settle(effect, step)
                    continue
                return step
        return None

    def observe(self, subset: Subset, shown: set[str]) -> None:
        self.seen[subset] = set(shown)

    def restarts(self) -> int:
        return len(self.seen)

    def unsettled(self) -> dict[str, set[int]]:
        """Per effect, the edits of groups not split yet (a search stopped by its bound)."""
        return {e: set().union(*groups) for e, groups in self._open.items() if groups}

    def _step(self, effect: str) -> Subset | None:
        """The subset this effect needs read next (maybe read already), or None when done."""
        groups = self._open[effect]
        while groups:
            group = groups[0]
            if len(group) == 1:
                self.found[effect].alone |= group
                groups.pop(0)
                continue
            first, second = _halves(group)
            return first if first not in self.seen else second
        return None

    def _settle(self, effect: str, read: Subset) -> None:
        """Use a read of one half of the effect's first open group."""
        groups = self._open[effect]
        group = groups[0]
        first, second = _halves(group)
        if read == first and second not in self.seen:
            return  # the second half is read next
        groups.pop(0)
        carriers = [half for half in (first, second) if effect in self.seen[half]]
        if carriers:
            groups[:0] = carriers
        else:
            self.found[effect].together.append(group)


def _halves(group: Subset) -> tuple[Subset, Subset]:
    ordered = sorted(group)
    mid = len(ordered) // 2
    return frozenset(ordered[:mid]), frozenset(ordered[mid:])
