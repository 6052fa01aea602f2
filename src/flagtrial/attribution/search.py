"""Which edits of a change carry its fact effects (a capacity loss, an implicit change): group
testing over subsets of the edits, each subset one restart and one facts read. A procedure
without I/O, like `Sequential`: `next()` names the subset to start, `observe()` takes the
effects that subset showed, until `next()` has nothing left to ask.

Each effect is searched by halving: of a group that carries it, the first half is started
alone; a half that shows it is searched on, and the second half is started too (it may carry
the effect as well); when the first half does not show it, the second must carry it, and is
split without a read of its own. A group of one taken that way is started to confirm it:
when it does not show the effect, only edits together do (an interaction), named by the
last group a read showed it in. With about as many effects as edits, each edit is started
alone instead. Every read serves every effect (its result is kept by
subset), and a group of one read as part of the whole trial needs no restart. Edits that
cannot touch a fact (a flag set to the value the engine takes anyway) are left out before
the search starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

Subset = frozenset[int]


@dataclass
class Culprits:
    """For one effect: the edits that carry it alone, and groups that carry it only together."""

    alone: set[int] = field(default_factory=set)
    together: list[Subset] = field(default_factory=list)


@dataclass(frozen=True)
class Group:
    """Edits that carry an effect: shown by a read (`anchor` is None), or inferred from the
    last group a read showed it in (`anchor`), when another part of that group did not."""

    edits: Subset
    anchor: Subset | None = None
    each: bool = False  # one of the edits, each started alone: not showing it settles only this


@dataclass
class FactSearch:
    """Search for the edits behind each of `effects`, all shown by the whole change
    (edits 0..n-1), among `candidates` (the edits that can touch a fact)."""

    effects: set[str]
    candidates: Subset
    seen: dict[Subset, set[str]] = field(default_factory=dict)
    found: dict[str, Culprits] = field(default_factory=dict)
    # per effect, groups still to split
    _open: dict[str, list[Group]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # With about as many effects as edits, halving would read more than starting each
        # edit alone does.
        n = len(self.candidates)
        self._each = n > 1 and len(self.effects) * math.ceil(math.log2(n)) >= n
        for effect in self.effects:
            self.found[effect] = Culprits()
            if self._each:
                each = [
                    Group(frozenset({i}), self.candidates, each=True)
                    for i in sorted(self.candidates)
                ]
                self._open[effect] = each
            else:
                self._open[effect] = [Group(self.candidates)] if self.candidates else []

    def next(self) -> Subset | None:
        """The next subset to start and read, or None when every effect is attributed."""
        for effect in sorted(self.effects):
            if (step := self._step(effect)) is not None:
                return step
        return None

    def observe(self, subset: Subset, shown: set[str]) -> None:
        self.seen[subset] = set(shown)

    def unsettled(self) -> dict[str, set[int]]:
        """Per effect, the edits of groups not split yet (a search stopped by its bound)."""
        return {e: set().union(*(g.edits for g in gs)) for e, gs in self._open.items() if gs}

    def _step(self, effect: str) -> Subset | None:
        """The subset this effect needs read next, or None when it is attributed: each
        group settled as far as the reads so far allow."""
        groups = self._open[effect]
        while groups:
            group = groups[0]
            ask = self._ask(effect, group)
            if ask is not None and ask not in self.seen:
                return ask
            groups[:1] = self._split(effect, group)
        found = self.found[effect]
        if self._each and not found.alone and self.candidates not in found.together:
            found.together.append(self.candidates)  # no edit alone shows it
        return None

    def _ask(self, effect: str, group: Group) -> Subset | None:
        """The read that settles `group` next: a confirming read of an inferred single edit,
        else its first half, then (only when the first shows the effect) its second."""
        if len(group.edits) == 1:
            return group.edits if group.anchor is not None else None
        first, second = _halves(group.edits)
        if first not in self.seen:
            return first
        return second if effect in self.seen[first] else None

    def _split(self, effect: str, group: Group) -> list[Group]:
        """What replaces `group` once its read is in: its carriers, or none (an alone edit,
        an interaction, or a half that does not carry it)."""
        found = self.found[effect]
        if group.each:
            if effect in self.seen[group.edits]:
                found.alone |= group.edits
            return []
        if len(group.edits) == 1:
            if group.anchor is None or effect in self.seen[group.edits]:
                found.alone |= group.edits
            else:
                found.together.append(group.anchor)
            return []
        first, second = _halves(group.edits)
        if effect not in self.seen[first]:
            if second not in self.seen:  # the rest carries it, or the edits only together
                return [Group(second, group.anchor or group.edits)]
            if effect in self.seen[second]:
                return [Group(second)]
            found.together.append(group.anchor or group.edits)
            return []
        return [Group(first), *([Group(second)] if effect in self.seen[second] else [])]


def _halves(group: Subset) -> tuple[Subset, Subset]:
    ordered = sorted(group)
    mid = len(ordered) // 2
    return frozenset(ordered[:mid]), frozenset(ordered[mid:])
