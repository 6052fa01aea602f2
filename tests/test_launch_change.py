"""Changes: parsing them from the CLI, describing them, applying them against a real schema."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from flagtrial.errors import ChangeError, UnknownFlagError
from flagtrial.launch.change import Change, Edit, apply_change, names_touched
from flagtrial.launch.execwords import expand_env, expand_words
from flagtrial.launch.schema import FlagSchema
from flagtrial.launch.spec import parse_command, parse_unit

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

UNIT = """\
[Unit]
Description=llama-server

[Service]
Environment=OMP_NUM_THREADS=4
ExecStart=/usr/local/bin/llama-server \\
    -m /srv/models/qwen.gguf \\
    -np 4 \\
    --ctx-size 8192 \\
    -nocb
Restart=always
"""


def test_from_cli_forms() -> None:
    change = Change.from_cli(
        add=["--cont-batching", "--alias x y", "-a=  padded"],
        set_=["--parallel=4", "--ctx-size 8192", "-np -1"],
        remove=["--mlock"],
        env=["OMP_NUM_THREADS=1", "EMPTY="],
        unset_env=["HF_HOME"],
    )
    assert change.edits == [
        Edit(op="remove", name="--mlock"),
        Edit(op="set", name="--parallel", value="4"),
        Edit(op="set", name="--ctx-size", value="8192"),
        Edit(op="set", name="-np", value="-1"),
        Edit(op="add", name="--cont-batching"),
        Edit(op="add", name="--alias", value="x y"),
        Edit(op="add", name="-a", value="  padded"),
        Edit(op="setenv", name="OMP_NUM_THREADS", value="1"),
        Edit(op="setenv", name="EMPTY", value=""),
        Edit(op="unsetenv", name="HF_HOME"),
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"set_": ["--parallel"]}, "set needs a value"),
        ({"remove": ["--parallel 4"]}, "flag name only"),
        ({"add": ["parallel"]}, "not a flag"),
        ({"env": ["NOVALUE"]}, "not an environment assignment"),
        ({"unset_env": ["1X"]}, "not an environment variable name"),
    ],
)
def test_from_cli_errors(kwargs: dict[str, list[str]], message: str) -> None:
    with pytest.raises(ChangeError, match=message):
        Change.from_cli(**kwargs)


def test_json_round_trip() -> None:
    change = Change.from_cli(add=["--cont-batching"], set_=["-np=$(x) 50%"], env=["A=1"])
    assert Change.model_validate_json(change.model_dump_json()) == change


def test_describe(llama: FlagSchema) -> None:
    change = Change(
        edits=[
            Edit(op="add", name="--cont-batching"),
            Edit(op="set", name="--parallel", value="-1"),
            Edit(op="remove", name="--mlock"),
            Edit(op="setenv", name="OMP_NUM_THREADS", value="1"),
            Edit(op="setenv", name="HF_HOME", value="/hf"),
            Edit(op="unsetenv", name="X"),
        ]
    )
    assert change.describe(parse_unit(UNIT), llama).splitlines() == [
        "+ --cont-batching",
        "~ --parallel 4 -> -1",
        "- --mlock",
        "env ~ OMP_NUM_THREADS 4 -> 1",
        "env + HF_HOME=/hf",
        "env - X",
    ]
    assert change.describe().splitlines()[1] == "~ --parallel -1"


def test_set_keeps_the_form_in_use(llama: FlagSchema) -> None:
    spec = parse_unit(UNIT)
    change = Change.from_cli(set_=["--parallel=-1", "-c 4096"])
    new = apply_change(spec, change, llama)
    assert new.text == UNIT.replace("-np 4", "-np -1").replace("--ctx-size 8192", "--ctx-size 4096")


def test_set_appends_canonical_and_add_appends_as_typed(llama: FlagSchema) -> None:
    spec = parse_unit(UNIT)
    new = apply_change(spec, Change.from_cli(set_=["-t 8"], add=["-fa on"]), llama)
    assert new.argv[-4:] == ["--threads", "8", "-fa", "on"]
    assert new.text.endswith("    -nocb \\\n    --threads 8 \\\n    -fa on\nRestart=always\n")


def test_add_switch_twice_is_refused_under_any_spelling(llama: FlagSchema) -> None:
    spec = parse_unit(UNIT)
    with pytest.raises(
        ChangeError, match=r"--cont-batching is already on the command line \(as -nocb\)"
    ):
        apply_change(spec, Change.from_cli(add=["--cont-batching"]), llama)
    flipped = apply_change(
        spec, Change.from_cli(remove=["--no-cont-batching"], add=["--cont-batching"]), llama
    )
    assert flipped.argv[-1] == "--cont-batching"
    assert "-nocb" not in flipped.argv


def test_remove_every_occurrence(llama: FlagSchema) -> None:
    spec = parse_command("/usr/bin/llama-server -m /m.gguf -a one --alias two -np 2\n")
    new = apply_change(spec, Change.from_cli(remove=["--alias"]), llama)
    assert new.text == "/usr/bin/llama-server -m /m.gguf -np 2\n"
    with pytest.raises(ChangeError, match="--alias is not on the command line"):
        apply_change(new, Change.from_cli(remove=["--alias"]), llama)
    with pytest.raises(ChangeError, match="appears 2 times"):
        apply_change(spec, Change.from_cli(set_=["--alias x"]), llama)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (Change.from_cli(set_=["--paralel 4"]), UnknownFlagError, "did you mean --parallel"),
        (Change.from_cli(add=["--flash-atn on"]), UnknownFlagError, "did you mean --flash-attn"),
        (Change.from_cli(add=["-sm bogus"]), ChangeError, "-sm bogus: not one of none, layer"),
        (Change.from_cli(add=["--alias"]), ChangeError, "--alias needs a value"),
        (Change.from_cli(add=["--cont-batching=yes"]), ChangeError, "takes no value"),
        (Change.from_cli(set_=["--cont-batching 1"]), ChangeError, "takes no value"),
        (Change.from_cli(unset_env=["NOT_SET"]), ChangeError, "NOT_SET is not set"),
        (
            Change.from_cli(add=["--control-vector-layer-range 1"]),
            ChangeError,
            "takes 2 values",
        ),
    ],
)
def test_invalid_changes(
    llama: FlagSchema, change: Change, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        apply_change(parse_unit(UNIT), change, llama)


def test_env_edits_are_literal(llama: FlagSchema) -> None:
    spec = parse_unit(UNIT)
    change = Change.from_cli(env=["MSG=50% of $HOME", "OMP_NUM_THREADS=1"])
    new = apply_change(spec, change, llama)
    assert 'Environment="OMP_NUM_THREADS=1"\nEnvironment="MSG=50%% of $HOME"\n' in new.text
    assert expand_env(new.env) == {"OMP_NUM_THREADS": "1", "MSG": "50% of $HOME"}
    gone = apply_change(new, Change.from_cli(unset_env=["OMP_NUM_THREADS", "MSG"]), llama)
    assert gone.text == UNIT.replace("Environment=OMP_NUM_THREADS=4\n", "")


def test_argparse_engine_keeps_equals_and_attaches_dash_values() -> None:
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    parser.add_argument("--model-path")
    parser.add_argument("--tensor-parallel-size", "--tp-size", type=int)
    parser.add_argument("--offset", type=int)
    schema = FlagSchema.parse_help(parser.format_help(), program="sglang.launch_server")
    spec = parse_command("/opt/venv/bin/python -m sglang.launch_server --model-path=/m --tp 4\n")
    new = apply_change(
        spec, Change.from_cli(set_=["--model-path /n", "--tp-size 8", "--offset -3"]), schema
    )
    assert new.argv[3:] == ["--model-path=/n", "--tp", "8", "--offset=-3"]
    assert parser.parse_args(new.argv[3:]).offset == -3
    touched = names_touched(Change.from_cli(set_=["--tp 2"], env=["A=1"]), schema)
    assert touched == {"--tensor-parallel-size"}


def test_names_touched(llama: FlagSchema) -> None:
    change = Change.from_cli(add=["-cb"], set_=["-np 2"], remove=["-c"], env=["A=1"])
    assert names_touched(change, llama) == {"--cont-batching", "--parallel", "--ctx-size"}


HOSTILE_ALIAS = "$(touch /tmp/flagtrial-pwned); reboot `id` 50% \"q\" 'x' \\ é"


def test_a_hostile_value_reaches_the_real_server_verbatim(
    llama: FlagSchema,
    tiny_model: Path,
    run_llama_server: Callable[..., str],
) -> None:
    spec = parse_command("/usr/local/bin/llama-server -np 1\n")
    new = apply_change(spec, Change.from_cli(set_=[f"--alias={HOSTILE_ALIAS}"]), llama)
    assert parse_command(new.text).argv == new.argv
    args = expand_words(new.argv, {"HOME": "/root"})[1:]
    url = run_llama_server(tiny_model, *args)
    models = httpx.get(f"{url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [HOSTILE_ALIAS]
    assert not Path("/tmp/flagtrial-pwned").exists()


@pytest.mark.parametrize(
    "edits",
    [
        [Edit(op="set", name="-np", value="4"), Edit(op="set", name="--parallel", value="5")],
        [Edit(op="add", name="--alias", value="x"), Edit(op="remove", name="--alias")],
        [Edit(op="setenv", name="OMP_NUM_THREADS", value="2"),
         Edit(op="unsetenv", name="OMP_NUM_THREADS")],
    ],
)  # fmt: skip
def test_one_edit_per_flag_or_variable(llama: FlagSchema, edits: list[Edit]) -> None:
    """Which of two edits of one flag would win is an accident of their order: refused."""
    with pytest.raises(ChangeError, match="is edited twice in this change"):
        apply_change(parse_unit(UNIT), Change(edits=edits), llama)
