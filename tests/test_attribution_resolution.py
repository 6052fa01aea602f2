"""What the engine's own resolution of each edit alone settles before any restart, as a
procedure over resolutions (the real engine's are driven in tests/test_gates_trial.py)."""

from __future__ import annotations

import pytest

from flagtrial.attribution.resolution import EachResolved, settle
from flagtrial.engines.resolve import Raised, Resolution
from flagtrial.facts import Scalar

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine


def resolved(**settings: Scalar) -> Resolution:
    base: dict[str, Scalar] = {"chunked_prefill_size": 8192, "mem_fraction_static": 0.83,
                               "attention_backend": "fa3"}  # fmt: skip
    return Resolution(engine="sglang", status="resolved", settings={**base, **settings})


GOOD = resolved()
RAISED = Resolution(
    engine="sglang",
    status="raised",
    raised=Raised(type="RuntimeError", message="--kv-cache-dtype=nvfp4 requires Blackwell",
                  file="sglang/srt/arg_groups/kv_cache_hook.py", line=42),
)  # fmt: skip
EVERY = frozenset({0, 1, 2})


def test_a_setting_one_edit_moves_alone_is_that_edits() -> None:
    each = EachResolved(GOOD, {0: resolved(), 1: resolved(attention_backend="triton"),
                               2: resolved(chunked_prefill_size=4096)})  # fmt: skip
    by = settle(each, {"setting:attention_backend", "capacity:kv_tokens:loss"},
                {"attention_backend"}, EVERY, failed=False)  # fmt: skip
    assert by.alone == {
        "setting:attention_backend": (
            1,
            "the engine's own resolution of the known-good with only this edit: "
            "attention_backend 'fa3' -> 'triton'",
        )
    }
    assert by.among == {} and by.harmful == {}
    assert each.spent == 4


def test_a_setting_the_whole_resolution_did_not_predict_is_left_to_restarts() -> None:
    each = EachResolved(GOOD, {1: resolved(attention_backend="triton")})
    by = settle(each, {"setting:attention_backend"}, set(), frozenset({1}), failed=False)
    assert by.alone == {}


def test_two_edits_moving_it_alone_keep_the_search_among_the_movers() -> None:
    each = EachResolved(GOOD, {0: resolved(), 1: resolved(mem_fraction_static=0.8),
                               2: resolved(mem_fraction_static=0.85)})  # fmt: skip
    by = settle(each, {"setting:mem_fraction_static"}, {"mem_fraction_static"}, EVERY, False)
    assert by.alone == {}
    # edit 0 moves none of the searched settings: out of that setting's search only
    assert by.among == {"setting:mem_fraction_static": frozenset({1, 2})}
    said = ("mem_fraction_static: edits 2, 3 each move it alone by the engine's own "
            "resolution: searched by restarts")  # fmt: skip
    assert by.notes == {1: [said], 2: [said]}


def test_an_edit_whose_own_resolution_raises_is_harmful_where_the_start_failed() -> None:
    each = EachResolved(GOOD, {0: resolved(), 1: RAISED})
    by = settle(each, {"start:fails"}, set(), frozenset({0, 1}), failed=True)
    assert list(by.harmful) == [1]
    assert by.harmful[1].startswith(
        "fails at startup per the engine's own resolution: RuntimeError: --kv-cache-dtype=nvfp4 "
        "requires Blackwell (sglang/srt/arg_groups/kv_cache_hook.py:42)"
    )
    # a known-good the engine refuses too: the edit is not what fails
    refused = EachResolved(RAISED, {1: RAISED})
    assert settle(refused, {"start:fails"}, set(), frozenset({1}), failed=True).harmful == {}
