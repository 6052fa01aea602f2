"""Change values checked before a restart is spent, against the real llama-server.

What preflight says about a value must match what the server does with it: values the
server refuses (at parse or at start) are refused with one line, values it reads only in
part (`-t 1.5` runs 1 thread) are refused too, and preflight never passes a value the server
refuses. Also: a flag added twice, a change that moves the server off the endpoint, and the
reason a crash at start shows.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flagtrial
from flagtrial.cache import llama_server_path
from flagtrial.engines.llamacpp import LlamaCppEngine
from flagtrial.errors import ChangeError
from flagtrial.launch.change import Change, Edit, apply_change
from flagtrial.launch.schema import FlagSchema
from flagtrial.launch.spec import parse_unit
from flagtrial.launch.values import value_problem
from flagtrial.targets.process import ProcessTarget
from harness.cli import cli
from harness.wheels import SGLANG
from test_engine_sglang import seed_project  # noqa: F401 - an SGLang stand-in project
from test_trial import Project, project  # noqa: F401 - the real llama-server project fixture

# What it asserts rests on the server's facts, crashes, bounds and files, never on a
# measured difference: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

UNIT = """\
[Service]
ExecStart=/usr/local/bin/llama-server -m /srv/m.gguf --host 127.0.0.1 --port 8080 -np 4 -c 8192
"""

# One of each kind llama-server's help declares.
KINDS = {
    "-np": "int",
    "-t": "int",
    "-c": "int",
    "--port": "int",
    "--temp": "float",
    "--top-p": "float",
    "--rope-scale": "number",
    "-ngl": "number",
    "-fa": "toggle",
    "--fit": "toggle",
}


def server_parses(binary: Path, *args: str) -> tuple[bool, str]:
    """Whether llama-server's own parser takes args (`--help` last: parse, print, exit 0)."""
    r = subprocess.run([str(binary), *args, "--help"], capture_output=True, text=True, timeout=60)
    return r.returncode == 0, r.stderr


def preflight_says(llama: FlagSchema, name: str, value: str) -> tuple[bool, list[str]]:
    """(accepted, [why not]) of the static checks for `--set name=value` on UNIT."""
    change = Change(edits=[Edit(op="set", name=name, value=value)])
    try:
        apply_change(parse_unit(UNIT), change, llama)
    except ChangeError as e:
        assert "\n" not in str(e) and e.exit_code == 4
        return False, [str(e)]
    return True, []


def test_value_kinds_come_from_the_help(llama: FlagSchema) -> None:
    assert {n: llama.lookup(n).kind for n in KINDS} == KINDS
    # `-c`'s help gives no negative value a meaning (`0 = loaded from model`); `-np`'s does
    # (`-1 = auto`), as does `-t`'s (`default: -1`).
    assert [llama.lookup(n).minimum for n in ("-c", "-np", "-t")] == [0, None, None]
    assert llama.lookup("--rope-scaling").choices == ("none", "linear", "yarn")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("--parallel", "abc", "--parallel 'abc': not an integer"),
        ("--parallel", "", "--parallel '': not an integer"),
        ("-c", "-5", "-c '-5': below 0"),
        ("-t", "3000000000", "out of range for a 32-bit integer"),
        ("--temp", "1e39", "out of range for a 32-bit float"),
        ("--temp", "warm", "not a number"),
        ("-fa", "yes", "-fa 'yes': not one of on, enabled, true, 1, off"),
        ("--rope-scaling", "cubic", "not one of none, linear, yarn"),
    ],
)
def test_values_the_server_refuses_are_refused(
    llama: FlagSchema, llama_server_bin: Path, name: str, value: str, message: str
) -> None:
    accepted, said = preflight_says(llama, name, value)
    assert not accepted and message in said[0]
    if name != "-c":  # -c -5 passes the parser and aborts at start: see the real trial below
        assert not server_parses(llama_server_bin, name, value)[0]


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("-t", "1.5", "-t '1.5' would be read as 1 (the engine ignores '.5'): give 1 if"),
        ("-np", "2abc", "-np '2abc' would be read as 2 (the engine ignores 'abc')"),
        ("--temp", "0.7x", "--temp '0.7x' would be read as 0.7 (the engine ignores 'x')"),
    ],
)
def test_values_the_server_reads_in_part_are_refused(
    llama: FlagSchema, llama_server_bin: Path, name: str, value: str, why: str
) -> None:
    """The server starts with them, but a trial would measure another value than asked for."""
    accepted, said = preflight_says(llama, name, value)
    assert not accepted and said[0].startswith(why)
    assert server_parses(llama_server_bin, name, value)[0]


def test_meaningful_negatives_and_words_pass(llama: FlagSchema, llama_server_bin: Path) -> None:
    for name, value in [("-np", "-1"), ("-t", "-1"), ("-c", "0"), ("-ngl", "auto"), ("-fa", "1")]:
        assert preflight_says(llama, name, value) == (True, []), (name, value)
        assert server_parses(llama_server_bin, name, value)[0], (name, value)


def test_the_servers_own_parser_has_the_last_word(llama_server_bin: Path, tmp_path: Path) -> None:
    """`-np 0` is a number, but llama-server refuses it ("invalid value for n_parallel"): the
    help cannot say so, the server's parser run with `--help` does."""
    target = ProcessTarget(tmp_path / "unit", tmp_path / "state")
    engine = LlamaCppEngine()
    with pytest.raises(ChangeError, match='rejects -np 0: error while handling argument "-np"'):
        asyncio.run(engine.check_values(target, [str(llama_server_bin)], ["-np", "0"]))
    asyncio.run(engine.check_values(target, [str(llama_server_bin)], ["-np", "2", "-fa", "on"]))


# Property tests: random text as the value of every kind of option.
VALUES = st.one_of(
    st.text(max_size=12),
    st.from_regex(r"\s?[+-]?\d{0,11}(\.\d{0,3})?([eE][+-]?\d{1,3})?[a-z]{0,2}", fullmatch=True),
)


@functools.cache
def real_schema() -> FlagSchema:
    """The real help's schema, outside a fixture: hypothesis shows the arguments it draws."""
    help_text = subprocess.run(
        [str(llama_server_path()), "--help"], capture_output=True, text=True, check=True
    ).stdout
    return FlagSchema.parse_help(help_text, program=str(llama_server_path()))


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(sorted(KINDS)), value=VALUES)
def test_any_value_gets_a_one_line_answer_and_the_spec_is_untouched(
    llama_server_bin: Path, name: str, value: str
) -> None:
    spec = parse_unit(UNIT)
    before = spec.text
    accepted, said = preflight_says(real_schema(), name, value)  # raises nothing else
    assert all("\n" not in line for line in said)
    assert spec.text == before
    if not accepted:
        assert said[0].startswith(f"{name} ")


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["-np", "-t", "-c", "--temp", "--top-p", "-fa"]), value=VALUES)
def test_what_preflight_passes_the_server_parses(
    llama_server_bin: Path, name: str, value: str
) -> None:
    """Spot checks against the real parser. The static checks read numbers exactly as the
    server does (it never refuses with `stoi`/`stof` what they pass), refuse nothing it
    parses (where no minimum applies), and with the server's own parser run on what they
    pass, preflight passes nothing the server refuses."""
    if "\x00" in value:  # cannot be an argument at all
        return
    schema = real_schema()
    accepted, said = preflight_says(schema, name, value)
    parsed, stderr = server_parses(llama_server_bin, name, value)
    if accepted:
        assert parsed or not re.search(r": sto[if]\b", stderr), (name, value, stderr)
        target = ProcessTarget(Path("/nonexistent/unit"), Path("/nonexistent/state"))
        engine = LlamaCppEngine()
        try:
            asyncio.run(engine.check_values(target, [str(llama_server_bin)], [name, value]))
        except ChangeError:
            assert not parsed
        else:
            assert parsed, (name, value, stderr)
    elif schema.lookup(name).minimum is None and "would be read as" not in said[0]:
        assert not parsed, (name, value)


def test_problem_of_free_text_is_none(llama: FlagSchema) -> None:
    assert value_problem(llama.lookup("--alias"), "--alias", "anything at all") is None


def test_add_of_an_option_present_is_refused(llama: FlagSchema) -> None:
    spec = parse_unit(UNIT)
    with pytest.raises(ChangeError, match=r"-np is already on the command line \(as -np 4\); "
                       r"use --set -np=VALUE to change it"):  # fmt: skip
        apply_change(spec, Change(edits=[Edit(op="add", name="-np", value="8")]), llama)
    with pytest.raises(ChangeError, match=r"--parallel is already on the command line"):
        apply_change(spec, Change(edits=[Edit(op="add", name="--parallel", value="8")]), llama)
    twice = [Edit(op="add", name="--alias", value="a"), Edit(op="add", name="-a", value="b")]
    with pytest.raises(
        ChangeError, match=r"-a is edited twice in this change \(\+ --alias a, then \+ -a b\)"
    ):
        apply_change(spec, Change(edits=twice), llama)


# Real CLI runs against a llama-server under the process target.


def one_line_error(result: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert result.returncode == code, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert text in result.stderr, result.stderr


@pytest.mark.slow
def test_preflight_refuses_bad_values_and_values_read_in_part(project: Project) -> None:  # noqa: F811
    before = project.unit.read_bytes()
    for item, text in [
        ("--parallel=abc", "--parallel 'abc': not an integer"),
        ("--parallel=", "--parallel '': not an integer"),
        ("-c=-5", "-c '-5': below 0"),
        ("-np=0", 'llama-server rejects -np 0: error while handling argument "-np"'),
        ("-t=1.5", "-t '1.5' would be read as 1"),
    ]:
        one_line_error(project.cli("preflight", "--set", item), 4, text)
        assert project.unit.read_bytes() == before


@pytest.mark.slow
def test_a_bad_value_never_restarts_the_server(project: Project) -> None:  # noqa: F811
    assert project.cli("facts").returncode == 0
    pid = project.server_pid()
    before = project.unit.read_bytes()
    one_line_error(project.cli("trial", "--set", "--parallel=abc"), 4, "not an integer")
    assert project.server_pid() == pid
    assert project.unit.read_bytes() == before
    history = json.loads(project.cli("history", "--json").stdout)
    assert history["trials"] == []
    assert [g["note"] for g in history["generations"]] == ["installed"]


@pytest.mark.slow
def test_add_of_a_present_option_and_moves_off_the_endpoint_are_refused(
    project: Project,  # noqa: F811
) -> None:
    before = project.unit.read_bytes()
    endpoint = f"http://127.0.0.1:{project.port}"
    one_line_error(
        project.cli("preflight", "--add", "-np=8"),
        4,
        "-np is already on the command line (as --parallel 8); use --set -np=VALUE",
    )
    one_line_error(
        project.cli("preflight", "--set", "--port=9999"),
        4,
        f"--port 9999 would move the server off the endpoint {endpoint} "
        f"(it listens with --port {project.port} now)",
    )
    one_line_error(project.cli("preflight", "--set", "--host=127.0.0.2"), 4, endpoint)
    one_line_error(
        project.cli("preflight", "--remove", "--port"),
        4,
        "removing --port (the engine's default is 8080) would move the server off the endpoint",
    )
    assert project.unit.read_bytes() == before
    # The same port written again moves nothing: refused only as a change that changes nothing.
    same = project.cli("preflight", "--set", f"--port={project.port}")
    one_line_error(same, 4, "leaves the launch spec as it is")


@pytest.mark.slow
def test_a_crash_at_start_shows_the_engines_own_line(project: Project) -> None:  # noqa: F811
    # A unit edited outside flagtrial, so no preflight saw it: the argument error is the reason.
    text = project.unit.read_text()
    project.unit.write_text(text.replace("--parallel 8", "--parallel abc"))
    result = project.cli("facts")
    one_line_error(result, 7, 'server crashed at start (exit 1): error while handling argument '
                   '"--parallel": stoi')  # fmt: skip
    # `-c 1` is a number preflight passes, but the server aborts at its warm-up: the abort
    # is the reason, not the debugger's last line.
    project.unit.write_text(text)
    assert project.cli("preflight", "--set", "--ctx-size=1").returncode == 0
    project.unit.write_text(text.replace("--ctx-size 8192", "--ctx-size 1"))
    result = project.cli("facts")
    one_line_error(result, 7, "server crashed at start (exit -6): common.cpp:2158: get_sub_batch")


@pytest.mark.slow
def test_sglang_preflight_runs_its_parser_on_set_and_add_values(
    seed_project,  # noqa: F811
) -> None:
    """SGLang's values are checked by a real argparse parser built from the version's flag
    table, in preflight, before anything is deployed."""
    project_file = seed_project(SGLANG)
    before = (project_file.parent / "sglang.service").read_bytes()
    # seed_project points PYTHONPATH at the wheel: this checkout's flagtrial goes after it.
    src = Path(flagtrial.__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": f"{os.environ['PYTHONPATH']}{os.pathsep}{src}"}
    for args, text in [
        (["--set", "--tp-size=four"], "sglang 0.5.23 rejects the command line: argument "),
        (["--add", "--attention-backend=fa9"], "--attention-backend fa9: not one of"),
        (["--add", "--tp-size=2"], "--tp-size is already on the command line (as --tp-size 4)"),
    ]:
        result = cli(project_file, "preflight", *args, env=env)
        one_line_error(result, 4, text)
    assert (project_file.parent / "sglang.service").read_bytes() == before
