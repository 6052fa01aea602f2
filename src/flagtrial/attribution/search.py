"""Which edits of a change carry its fact effects (a capacity loss, an implicit change): group
testing over subsets of the edits, each subset one restart and one facts read. A procedure
without I/O, like `Sequential`: `next()` names the subset to start, `observe()` takes the
effects that subset showed, until `next()` has nothing left to ask.

Each effect is searched by halving: of a group that carries it, the first half is started
alone; a half that shows it is searched on, and the second half is started too (it may carry
the effect as well); when the first half does not show it, the second must carry it, and is
split without a read of its own. A group of one taken that way is started to confirm it:
when it does not show the effect, only edits together do (an interaction), first named by
the last group a read showed it in, then narrowed to the edits it needs: each edit of that
group is left out in turn, and stays out when the rest still shows the effect (a subset of
a read that did not show it is taken not to, without a read). With about as many effects as
edits, each edit is started alone instead. Every read serves every effect (its result is
kept by subset), and a group of one read as part of the whole trial needs no restart. Edits
that cannot touch a fact (a flag set to the value the engine takes anyway) are left out
before the search starts; an effect can be narrowed further to the edits that can carry it
(`among`: the engine's own resolution of each edit, attribution/resolution.py).
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
    # narrowing an interaction: `edits` show the effect together; `kept`, those it needs
    kept: Subset | None = None


@dataclass
class FactSearch:
    """Search for the edits behind each of `effects`, all shown by the whole change
    (edits 0..n-1), among `candidates` (the edits that can touch a fact), or for an effect
    in `among`, among those of its edits."""

    effects: set[str]
    candidates: Subset
    among: dict[str, Subset] = field(default_factory=dict)
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
            edits = self._of(effect)
            if self._each and len(edits) > 1:
                self._open[effect] = [
                    Group(frozenset({i}), edits, each=True) for i in sorted(edits)
                ]
            else:
                self._open[effect] = [Group(edits)] if edits else []

    def _of(self, effect: str) -> Subset:
        """The edits that can carry `effect`."""
        return frozenset(self.among.get(effect, self.candidates) & self.candidates)

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
            if not groups and self._each and not self.found[effect].alone:
                edits = self._of(effect)
                if len(edits) > 1 and group.each:  # no edit alone shows it: narrow the whole
                    groups.append(Group(edits, kept=frozenset()))
        return None

    def _shows(self, effect: str, subset: Subset) -> bool | None:
        """Whether `subset` shows `effect`: as read, False as part of a read that did not
        show it, None when unknown."""
        if subset in self.seen:
            return effect in self.seen[subset]
        if any(subset <= s and effect not in shown for s, shown in self.seen.items()):
            return False
        return None

    def _ask(self, effect: str, group: Group) -> Subset | None:
        """The read that settles `group` next: a confirming read of an inferred single edit,
        else its first half, then (only when the first shows the effect) its second; when
        narrowing, the group less the next edit not yet known to be needed."""
        if group.kept is not None:
            left = sorted(group.edits - group.kept)
            if not left:
                return None
            rest = group.edits - {left[0]}
            return rest if self._shows(effect, rest) is None else None
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
        if group.kept is not None:
            return self._narrowed(effect, group)
        if group.each:
            if effect in self.seen[group.edits]:
                found.alone |= group.edits
            return []
        if len(group.edits) == 1:
            if group.anchor is None or effect in self.seen[group.edits]:
                found.alone |= group.edits
                return []
            return [Group(group.anchor, kept=frozenset())]
        first, second = _halves(group.edits)
        if effect not in self.seen[first]:
            if second not in self.seen:  # the rest carries it, or the edits only together
                return [Group(second, group.anchor or group.edits)]
            if effect in self.seen[second]:
                return [Group(second)]
            return [Group(group.anchor or group.edits, kept=frozenset())]
        return [Group(first), *([Group(second)] if effect in self.seen[second] else [])]

    def _narrowed(self, effect: str, group: Group) -> list[Group]:
        """An interaction once the group less its next edit is known: that edit is needed,
        or left out; with none left to try, the edits it needs (one: it carries it alone)."""
        assert group.kept is not None
        left = sorted(group.edits - group.kept)
        if not left:
            found = self.found[effect]
            if len(group.edits) == 1:
                found.alone |= group.edits
            else:
                found.together.append(group.edits)
            return []
        rest = group.edits - {left[0]}
        if rest and self._shows(effect, rest):
            return [Group(rest, kept=group.kept)]
        return [Group(group.edits, kept=group.kept | {left[0]})]


def _halves(group: Subset) -> tuple[Subset, Subset]:
    ordered = sorted(group)
    mid = len(ordered) // 2
    return frozenset(ordered[:mid]), frozenset(ordered[mid:])
