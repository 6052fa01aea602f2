"""The fact search as a procedure: driven by simulated servers whose effects are known, it
finds the edits behind each effect, interactions included, in fewer restarts than one per
edit where the effects allow."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from flagtrial.attribution.search import FactSearch, Subset

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine


def drive(
    n: int,
    shows: Callable[[Subset], set[str]],
    candidates: Subset | None = None,
    among: dict[str, Subset] | None = None,
) -> FactSearch:
    everything = frozenset(range(n))
    search = FactSearch(
        shows(everything), candidates if candidates is not None else everything, among or {}
    )
    while (subset := search.next()) is not None:
        search.observe(subset, shows(subset))
    return search


def test_one_culprit_among_eight_in_five_restarts() -> None:
    search = drive(8, lambda s: {"capacity"} if 5 in s else set())
    assert search.found["capacity"].alone == {5} and search.found["capacity"].together == []
    # {0-3} does not show it: {4-7} must carry it, unread; {4,5} does, {6,7} not (read: it
    # could have carried it too); {4} does not: {5} is started alone to confirm it.
    assert list(search.seen) == [
        frozenset({0, 1, 2, 3}), frozenset({4, 5}), frozenset({6, 7}), frozenset({4}),
        frozenset({5}),
    ]  # fmt: skip


def test_of_three_edits_the_last_costs_three_restarts_the_first_two() -> None:
    last = drive(3, lambda s: {"capacity"} if 2 in s else set())
    assert (last.found["capacity"].alone, len(last.seen)) == ({2}, 3)
    first = drive(3, lambda s: {"capacity"} if 0 in s else set())
    assert (first.found["capacity"].alone, len(first.seen)) == ({0}, 2)


def test_a_lone_candidate_costs_no_restart() -> None:
    # The other edit sets a flag to the engine's default: it cannot touch a fact.
    search = drive(2, lambda s: {"capacity"} if 1 in s else set(), candidates=frozenset({1}))
    assert (search.found["capacity"].alone, len(search.seen)) == ({1}, 0)


def test_two_effects_from_two_edits_share_the_reads() -> None:
    def shows(s: Subset) -> set[str]:
        return ({"capacity"} if 0 in s else set()) | ({"implicit:kv_unified"} if 3 in s else set())

    search = drive(4, shows)
    assert search.found["capacity"].alone == {0}
    assert search.found["implicit:kv_unified"].alone == {3}
    # Two effects among four edits: halving would read 6 subsets, each edit alone takes 4.
    assert list(search.seen) == [frozenset({i}) for i in range(4)]


def test_with_as_many_effects_as_edits_no_edit_alone_is_an_interaction() -> None:
    search = drive(3, lambda s: {"a", "b"} if {0, 2} <= s else set())
    # each alone shows nothing; then each edit left out in turn: {1, 2} does not show it (0
    # is needed), {0, 2} does (1 is not), {0} was read already (2 is needed)
    assert list(search.seen) == [
        frozenset({0}), frozenset({1}), frozenset({2}), frozenset({1, 2}), frozenset({0, 2})
    ]  # fmt: skip
    assert search.found["a"].together == search.found["b"].together == [frozenset({0, 2})]
    assert search.found["b"].alone == set()


def test_an_effect_only_two_edits_make_together_is_an_interaction() -> None:
    search = drive(4, lambda s: {"capacity"} if {1, 2} <= s else set())
    culprits = search.found["capacity"]
    # narrowed to the pair: the edits that do not take part are not named
    assert culprits.alone == set() and culprits.together == [frozenset({1, 2})]
    # halving: {0,1} and {2} and {3} show nothing; then each edit left out of the whole in
    # turn, {2,3} known not to show it as the rest of {2} and {3} is not: read
    assert list(search.seen) == [
        frozenset({0, 1}), frozenset({2}), frozenset({3}), frozenset({1, 2, 3}),
        frozenset({2, 3}), frozenset({1, 3}), frozenset({1, 2}),
    ]  # fmt: skip


def test_a_pair_in_one_half_is_narrowed_with_the_reads_made() -> None:
    search = drive(4, lambda s: {"start:fails"} if {0, 1} <= s else set())
    assert search.found["start:fails"].together == [frozenset({0, 1})]
    assert list(search.seen) == [
        frozenset({0, 1}), frozenset({2, 3}), frozenset({0}), frozenset({1})
    ]  # fmt: skip


def test_an_effect_is_searched_among_its_own_edits_only() -> None:
    """Only edits 1 and 2 can move the setting (the engine's own resolution of each): its
    search leaves 0 and 3 out, in fewer reads; a capacity effect of edit 0 is still searched
    among all four."""
    setting = drive(4, lambda s: {"setting:x"} if 2 in s else set(),
                    among={"setting:x": frozenset({1, 2})})  # fmt: skip
    assert setting.found["setting:x"].alone == {2}
    assert list(setting.seen) == [frozenset({1}), frozenset({2})]
    assert len(drive(4, lambda s: {"setting:x"} if 2 in s else set()).seen) == 3

    def shows(s: Subset) -> set[str]:
        return ({"setting:x"} if 2 in s else set()) | ({"capacity"} if 0 in s else set())

    both = drive(4, shows, among={"setting:x": frozenset({1, 2})})
    assert (both.found["setting:x"].alone, both.found["capacity"].alone) == ({2}, {0})


def test_two_culprits_of_one_effect_are_both_found() -> None:
    search = drive(4, lambda s: {"capacity"} if s & {0, 3} else set())
    assert search.found["capacity"].alone == {0, 3}


def test_nothing_to_search_without_effects() -> None:
    search = drive(3, lambda s: set())
    assert (search.found, len(search.seen)) == ({}, 0)
