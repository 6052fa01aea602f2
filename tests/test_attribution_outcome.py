"""Per-edit outcomes from what the searches found: the rules in their order, and the change
left to try."""

from __future__ import annotations

import pytest

from flagtrial.attribution.outcome import Attribution, Cost, Found, judge
from flagtrial.attribution.search import Culprits
from flagtrial.launch.change import Edit

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

EDITS = [
    Edit(op="add", name="--cont-batching"),
    Edit(op="set", name="--parallel", value="4"),
    Edit(op="set", name="--ctx-size", value="16384"),
    Edit(op="set", name="-b", value="32"),
    Edit(op="set", name="-ub", value="512"),
    Edit(op="set", name="--alias", value="x"),
    Edit(op="set", name="--timeout", value="700"),
]


def test_each_rule_in_its_order() -> None:
    found = Found(
        culprits={
            "capacity:concurrent_requests:loss": Culprits(alone={1}),
            "capacity:context_per_request:gain": Culprits(alone={1, 2}),
            "measured:harm": Culprits(together=[frozenset({3, 4})]),
        },
        unsettled={"setting:n_ctx_slot": {6}},
        said={"capacity:concurrent_requests:loss": {1: "concurrent requests 8 -> 4 (-50.0 %)"}},
        equivalent={5},
    )
    settled = {0: ("useless", "--cont-batching is what the known-good already runs")}
    verdicts = judge(EDITS, settled, found)
    outcomes = [v.outcome for v in verdicts]
    assert outcomes == [
        "useless",  # settled without a restart
        "harmful",  # a loss alone, whatever it also gains
        "beneficial",
        "interacting",
        "interacting",
        "useless",  # nothing follows it and its speed was measured the same
        "unresolved",  # the search stopped before it
    ]
    assert verdicts[1].evidence[0] == "concurrent requests 8 -> 4 (-50.0 %)"
    assert verdicts[3].evidence == ["measured harm only together with edit(s) 5"]
    assert (
        verdicts[6].evidence[0]
        == "the server changes n_ctx_slot on its own: not settled for this edit"
    )


def test_an_edit_nothing_follows_but_never_measured_is_unresolved() -> None:
    found = Found(culprits={"capacity:kv_tokens:loss": Culprits(alone={1})})
    (alias,) = [v for v in judge(EDITS[:2] + EDITS[5:6], {}, found) if v.index == 2]
    assert alias.outcome == "unresolved"
    assert alias.evidence == ["none of the change's effects follows it; its own speed not measured"]


def attribution(outcomes: list[str]) -> Attribution:
    found = Found(
        culprits={
            "capacity:kv_tokens:loss": Culprits(
                alone={i for i, o in enumerate(outcomes) if o == "harmful"}
            )
        },
        equivalent={i for i, o in enumerate(outcomes) if o == "useless"},
    )
    edits = EDITS[: len(outcomes)]
    zero = Cost(restarts=0, load_s=0.0)
    return Attribution(
        trial_id=1,
        edits=judge(edits, {}, found),
        used=zero,
        one_at_a_time=zero,
        journals=[],
        stopped=None,
    )


def test_the_fixed_change_leaves_out_only_what_did_harm() -> None:
    fixed = attribution(["useless", "harmful", "unresolved"]).fixed()
    assert fixed is not None and [e.name for e in fixed.edits] == ["--cont-batching", "--ctx-size"]
    assert attribution(["harmful", "harmful"]).fixed() is None  # nothing left
    assert attribution(["useless", "useless"]).fixed() is None  # the trial's own change
