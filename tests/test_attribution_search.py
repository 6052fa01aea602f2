"""The fact search as a procedure: driven by simulated servers whose effects are known, it
finds the edits behind each effect, interactions included, in fewer restarts than one per
edit where the effects allow."""

from __future__ import annotations

from collections.abc import Callable

from flagtrial.attribution.search import FactSearch, Subset


def drive(
    n: int, shows: Callable[[Subset], set[str]], candidates: Subset | None = None
) -> FactSearch:
    everything = frozenset(range(n))
    search = FactSearch(shows(everything), candidates if candidates is not None else everything)
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
    assert len(search.seen) == 3
    assert search.found["a"].together == [frozenset({0, 1, 2})]
    assert search.found["b"].alone == set()


def test_an_effect_only_two_edits_make_together_is_an_interaction() -> None:
    search = drive(4, lambda s: {"capacity"} if {1, 2} <= s else set())
    culprits = search.found["capacity"]
    assert culprits.alone == set() and culprits.together == [frozenset({0, 1, 2, 3})]


def test_two_culprits_of_one_effect_are_both_found() -> None:
    search = drive(4, lambda s: {"capacity"} if s & {0, 3} else set())
    assert search.found["capacity"].alone == {0, 3}


def test_nothing_to_search_without_effects() -> None:
    search = drive(3, lambda s: set())
    assert (search.found, len(search.seen)) == ({}, 0)
