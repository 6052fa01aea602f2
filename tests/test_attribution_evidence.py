"""Edits the engine's own --help shows to leave the server as it is, read from the real
llama-server's help: the demo's `--cont-batching` is one, `--parallel -1` against `-np 8`
is not."""

from __future__ import annotations

import pytest

from flagtrial.attribution.evidence import help_default, inert
from flagtrial.launch.change import Edit
from flagtrial.launch.schema import FlagSchema

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

KNOWN_GOOD = ["-m", "model.gguf", "-c", "8192", "-np", "8", "--metrics"]


def test_a_switch_the_known_good_already_runs_is_inert(llama: FlagSchema) -> None:
    why = inert(Edit(op="add", name="--cont-batching"), KNOWN_GOOD, llama)
    help_says = "llama-server --help: default: enabled"
    assert why == f"--cont-batching is what the known-good already runs ({help_says})"
    # Turning it off is not; neither is turning it on where the known-good turned it off.
    assert inert(Edit(op="add", name="--no-cont-batching"), KNOWN_GOOD, llama) is None
    assert inert(Edit(op="add", name="-cb"), [*KNOWN_GOOD, "-nocb"], llama) is None


def test_a_value_is_inert_only_where_the_known_good_runs_it(llama: FlagSchema) -> None:
    assert help_default(llama.lookup("--parallel")) == "-1"
    # The demo's second edit: -1 is the default, but the known-good runs 8 slots.
    assert inert(Edit(op="set", name="--parallel", value="-1"), KNOWN_GOOD, llama) is None
    same = inert(Edit(op="set", name="--parallel", value="8"), KNOWN_GOOD, llama)
    assert same == "--parallel 8 is what the known-good already runs (its own flags)"
    without = [w for w in KNOWN_GOOD if w not in ("-np", "8")]
    assert inert(Edit(op="set", name="-np", value="-1"), without, llama) == (
        "-np -1 is what the known-good already runs (llama-server --help: default: -1)"
    )


def test_environment_edits_are_never_inert(llama: FlagSchema) -> None:
    assert inert(Edit(op="setenv", name="OMP_NUM_THREADS", value="1"), KNOWN_GOOD, llama) is None
