"""Launch specs: parsing units, drop-ins and command files, and lossless minimal edits."""

from __future__ import annotations

import difflib
import random

import pytest

from flagtrial.errors import SpecError
from flagtrial.launch.execwords import literal_word
from flagtrial.launch.spec import LaunchSpec, parse, parse_command, parse_unit, spec_sha256

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

SGLANG_UNIT = """\
# Managed by hand: SGLang serving Llama 3 70B on four GPUs.
[Unit]
Description=SGLang server
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
User=llm
; CUDA devices pinned by the rack layout
Environment="CUDA_VISIBLE_DEVICES=0,1,2,3" HF_HOME=/srv/hf
Environment=NCCL_DEBUG=WARN
EnvironmentFile=-/etc/default/sglang
ExecStart=/opt/venv/bin/python -m sglang.launch_server \\
    --model-path /srv/models/Meta-Llama-3-70B-Instruct \\
    --host 0.0.0.0 \\
    # the proxy expects this port
    --port 30000 \\
    --tp 4 \\
    --mem-fraction-static 0.85 \\
    --chat-template "llama-3 instruct"
Restart=on-failure
RestartSec=5

[Install]
WantedBy=multi-user.target
"""


def changed_lines(old: str, new: str) -> tuple[list[str], list[str]]:
    """(removed, added) physical lines, ignoring the ones kept byte for byte."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    removed: list[str] = []
    added: list[str] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op != "equal":
            removed += a[i1:i2]
            added += b[j1:j2]
    return removed, added


def test_realistic_unit_parses() -> None:
    spec = parse_unit(SGLANG_UNIT)
    assert spec.kind == "unit"
    assert spec.argv == [
        "/opt/venv/bin/python", "-m", "sglang.launch_server",
        "--model-path", "/srv/models/Meta-Llama-3-70B-Instruct", "--host", "0.0.0.0",
        "--port", "30000", "--tp", "4", "--mem-fraction-static", "0.85",
        "--chat-template", "llama-3 instruct",
    ]  # fmt: skip
    assert spec.env == {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "HF_HOME": "/srv/hf",
        "NCCL_DEBUG": "WARN",
    }
    assert spec.environment_files == ["-/etc/default/sglang"]
    assert spec.prefix == ""
    assert len(spec_sha256(spec.text)) == 64


def test_changing_a_value_rewrites_only_its_line() -> None:
    spec = parse_unit(SGLANG_UNIT)
    argv = spec.argv
    argv[argv.index("--tp") + 1] = "8"
    new = spec.with_argv(argv)
    assert changed_lines(SGLANG_UNIT, new.text) == (["    --tp 4 \\\n"], ["    --tp 8 \\\n"])
    assert new.argv == argv


def test_removing_the_last_flag_fixes_the_previous_continuation() -> None:
    spec = parse_unit(SGLANG_UNIT)
    new = spec.with_argv(spec.argv[:-2])
    assert changed_lines(SGLANG_UNIT, new.text) == (
        ["    --mem-fraction-static 0.85 \\\n", '    --chat-template "llama-3 instruct"\n'],
        ["    --mem-fraction-static 0.85\n"],
    )
    assert "Restart=on-failure" in new.text.splitlines()


def test_removing_a_flag_in_the_middle_drops_its_line_and_keeps_the_comment() -> None:
    spec = parse_unit(SGLANG_UNIT)
    argv = spec.argv
    k = argv.index("--port")
    new = spec.with_argv(argv[:k] + argv[k + 2 :])
    assert changed_lines(SGLANG_UNIT, new.text) == (["    --port 30000 \\\n"], [])
    assert "    # the proxy expects this port\n" in new.text


def test_removing_one_word_of_a_line() -> None:
    text = "[Service]\nExecStart=/usr/bin/x --a 1 --b 2 --c\n"
    spec = parse_unit(text)
    assert spec.with_argv(["/usr/bin/x", "--a", "1", "--c"]).text == (
        "[Service]\nExecStart=/usr/bin/x --a 1 --c\n"
    )


def test_appending_to_a_multi_line_command_adds_continuation_lines() -> None:
    spec = parse_unit(SGLANG_UNIT)
    new = spec.with_argv([*spec.argv, "--enable-metrics", "--log-level", "debug"])
    assert changed_lines(SGLANG_UNIT, new.text) == (
        ['    --chat-template "llama-3 instruct"\n'],
        [
            '    --chat-template "llama-3 instruct" \\\n',
            "    --enable-metrics \\\n",
            "    --log-level debug\n",
        ],
    )


def test_appending_to_a_one_line_command_stays_on_the_line() -> None:
    spec = parse_unit("[Service]\nExecStart=/usr/bin/llama-server -m /m.gguf\nUser=llm\n")
    new = spec.with_argv([*spec.argv, "-np", "-1", "--cont-batching"])
    assert new.text == (
        "[Service]\nExecStart=/usr/bin/llama-server -m /m.gguf -np -1 --cont-batching\nUser=llm\n"
    )


def test_hostile_values_round_trip_through_the_unit() -> None:
    spec = parse_unit(SGLANG_UNIT)
    hostile = ["$(touch /tmp/pwned)", "; reboot", 'a"b\\c', "x\ny", "50%", "#c", ";"]
    argv = [*spec.argv, "--served-model-name", *map(literal_word, hostile)]
    new = spec.with_argv(argv)
    assert parse_unit(new.text).argv == argv
    assert new.text.count("\n") == SGLANG_UNIT.count("\n") + 1  # the newline stayed escaped


def test_prefix_characters_are_exposed_and_kept() -> None:
    spec = parse_unit("[Service]\nExecStart=-!/usr/bin/x --a\n")
    assert spec.prefix == "-!"
    assert spec.argv == ["/usr/bin/x", "--a"]
    assert spec.with_argv(["/usr/bin/y", "--a"]).text == '[Service]\nExecStart="-!/usr/bin/y" --a\n'
    at = parse_unit("[Service]\nExecStart=@/usr/bin/python3 my-server --a\n")
    assert (at.argv, at.program_words) == (["/usr/bin/python3", "my-server", "--a"], 2)


def test_crlf_and_missing_final_newline_are_kept() -> None:
    text = "[Service]\r\nExecStart=/usr/bin/x \\\r\n  --a 1 \\\r\n  --b 2\r\nUser=llm"
    spec = parse_unit(text)
    assert spec.with_argv(["/usr/bin/x", "--a", "3", "--b", "2"]).text == text.replace("1", "3")
    new = spec.with_env({"K": "v"})
    assert new.text.endswith('  --b 2\r\nEnvironment="K=v"\r\nUser=llm')


def test_set_env_in_place_and_append() -> None:
    spec = parse_unit(SGLANG_UNIT)
    new = spec.with_env({"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "1"})
    assert changed_lines(SGLANG_UNIT, new.text) == (
        ["Environment=NCCL_DEBUG=WARN\n"],
        ['Environment="NCCL_DEBUG=INFO"\n', 'Environment="OMP_NUM_THREADS=1"\n'],
    )
    assert new.env == {**spec.env, "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "1"}


def test_set_env_keeps_the_other_assignments_of_the_line() -> None:
    spec = parse_unit(SGLANG_UNIT)
    new = spec.with_env({"HF_HOME": "/data/hf cache"})
    assert changed_lines(SGLANG_UNIT, new.text) == (
        ['Environment="CUDA_VISIBLE_DEVICES=0,1,2,3" HF_HOME=/srv/hf\n'],
        ['Environment="CUDA_VISIBLE_DEVICES=0,1,2,3" "HF_HOME=/data/hf cache"\n'],
    )


def test_unset_env_removes_the_word_or_the_line() -> None:
    spec = parse_unit(SGLANG_UNIT)
    assert changed_lines(SGLANG_UNIT, spec.with_env({}, {"NCCL_DEBUG"}).text) == (
        ["Environment=NCCL_DEBUG=WARN\n"],
        [],
    )
    assert changed_lines(SGLANG_UNIT, spec.with_env({}, {"HF_HOME"}).text) == (
        ['Environment="CUDA_VISIBLE_DEVICES=0,1,2,3" HF_HOME=/srv/hf\n'],
        ['Environment="CUDA_VISIBLE_DEVICES=0,1,2,3"\n'],
    )


def test_env_without_environment_lines_goes_after_exec_start() -> None:
    spec = parse_unit("[Service]\nExecStart=/usr/bin/x \\\n  --a\nUser=llm\n")
    assert spec.with_env({"A": "1"}).text == (
        '[Service]\nExecStart=/usr/bin/x \\\n  --a\nEnvironment="A=1"\nUser=llm\n'
    )


def test_environment_reset_and_override() -> None:
    spec = parse_unit(
        "[Service]\nEnvironment=A=1 B=2\nEnvironment=\nEnvironment=B=3\nEnvironment=B=4\n"
        "ExecStart=/usr/bin/x\n"
    )
    assert spec.env == {"B": "4"}
    new = spec.with_env({}, {"B"})
    assert new.env == {}
    assert new.text == "[Service]\nEnvironment=A=1 B=2\nEnvironment=\nExecStart=/usr/bin/x\n"


def test_invalid_env_edits() -> None:
    spec = parse_unit(SGLANG_UNIT)
    with pytest.raises(SpecError, match="invalid environment variable name"):
        spec.with_env({"1BAD": "x"})
    with pytest.raises(SpecError, match="both set and unset"):
        spec.with_env({"A": "x"}, {"A"})


def test_dropin_resets_and_replaces_exec_start() -> None:
    text = (
        "[Service]\n"
        "Environment=OMP_NUM_THREADS=4\n"
        "ExecStart=\n"
        "ExecStart=/usr/bin/llama-server \\\n"
        "    -m /srv/m.gguf \\\n"
        "    -np 4\n"
    )
    spec = parse_unit(text, dropin=True)
    assert spec.dropin
    assert spec.argv == ["/usr/bin/llama-server", "-m", "/srv/m.gguf", "-np", "4"]
    new = spec.with_argv(["/usr/bin/llama-server", "-m", "/srv/m.gguf", "-np", "8"])
    assert changed_lines(text, new.text) == (["    -np 4\n"], ["    -np 8\n"])


def test_dropin_with_only_environment() -> None:
    spec = parse_unit("[Service]\nEnvironment=A=1\n", dropin=True)
    assert (spec.argv, spec.env) == ([], {"A": "1"})
    assert spec.with_env({"B": "2"}).text == '[Service]\nEnvironment=A=1\nEnvironment="B=2"\n'
    with pytest.raises(SpecError, match="no ExecStart"):
        spec.with_argv(["/usr/bin/x"])


def test_dropin_exec_start_needs_a_reset() -> None:
    with pytest.raises(SpecError, match=r"^line 2: .*must follow an empty ExecStart="):
        parse_unit("[Service]\nExecStart=/usr/bin/x\n", dropin=True)


def test_reset_then_one_exec_start_in_a_unit() -> None:
    spec = parse_unit("[Service]\nExecStart=/usr/bin/a\nExecStart=\nExecStart=/usr/bin/b --x\n")
    assert spec.argv == ["/usr/bin/b", "--x"]
    assert spec.with_argv(["/usr/bin/b", "--y"]).text.endswith("ExecStart=/usr/bin/b --y\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[Unit]\nDescription=x\n[Service]\nType=simple\n",
            r"^line 3: \[Service\] has no ExecStart=",
        ),
        (
            '[Service]\nUser=x\nExecStart=/usr/bin/x "open \\\n  --a\n',
            r"^line 3: unbalanced quoting",
        ),
        (
            "[Service]\nExecStart=/usr/bin/a\nUser=x\nExecStart=/usr/bin/b\n",
            r"^line 4: second ExecStart= \(first at line 2\)",
        ),
        (
            "[Unit]\nDescription=x\nExecStart=/usr/bin/x\n",
            r"^line 3: unit has no \[Service\] section",
        ),
        ("[Unit]\nDescription=x\n", r"^line 2: unit has no \[Service\] section"),
        ("ExecStart=/usr/bin/x\n", r"^line 1: ExecStart= outside any section"),
        ("[Service\nExecStart=/usr/bin/x\n", r"^line 1: invalid section header"),
        ("[Service]\nExecStart /usr/bin/x\n", r"^line 2: missing '='"),
        ("[Service]\nExecStart=/usr/bin/x ; /usr/bin/y\n", r"^line 2: .*separates commands"),
        ("[Service]\nExecStart=-\n", r"^line 2: the command has no executable"),
        (
            "[Service]\nEnvironment=NOEQUALS\nExecStart=/usr/bin/x\n",
            r"^line 2: invalid environment",
        ),
        ("[Service]\nEnvironment=A=\\q\nExecStart=/usr/bin/x\n", r"^line 2: unknown escape"),
    ],
)
def test_malformed_units_name_the_line(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_unit(text)


def test_editing_a_word_that_spans_lines_is_refused() -> None:
    spec = parse_unit('[Service]\nExecStart=/usr/bin/x "a \\\n  b" --c\n')
    assert spec.argv == ["/usr/bin/x", "a    b", "--c"]
    assert spec.with_argv(["/usr/bin/x", "a    b", "--d"]).argv == ["/usr/bin/x", "a    b", "--d"]
    with pytest.raises(SpecError, match="spans continuation lines"):
        spec.with_argv(["/usr/bin/x", "z", "--c"])


def test_command_file() -> None:
    text = (
        "# llama on the lab box\nOMP_NUM_THREADS=1 /usr/bin/llama-server -m /m.gguf \\\n  -np 4\n"
    )
    spec = parse_command(text)
    assert spec.kind == "command"
    assert spec.argv == ["/usr/bin/llama-server", "-m", "/m.gguf", "-np", "4"]
    assert spec.env == {"OMP_NUM_THREADS": "1"}
    assert spec.with_argv([*spec.argv[:-1], "8"]).text == text.replace("-np 4", "-np 8")
    assert spec.with_env({"A": "x y"}, {"OMP_NUM_THREADS"}).text == text.replace(
        "OMP_NUM_THREADS=1", '"A=x y"'
    )
    plain = parse_command("/usr/bin/llama-server -m /m.gguf\n")
    assert plain.with_env({"A": "1"}).text == "A=1 /usr/bin/llama-server -m /m.gguf\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"^line 1: the command file holds no command"),
        ("/usr/bin/a\n/usr/bin/b\n", r"^line 2: a second command \(first at line 1\)"),
        ("A=1 B=2\n", r"^line 1: the command has only environment"),
        ("/usr/bin/a 'x\n", r"^line 1: unbalanced"),
    ],
)
def test_malformed_command_files(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_command(text)


def test_spec_json_round_trip_rederives_from_text() -> None:
    spec = parse(SGLANG_UNIT, "unit")
    again = LaunchSpec.model_validate_json(spec.model_dump_json())
    assert again == spec
    assert (again.argv, again.env, spec_sha256(again.text)) == (
        spec.argv,
        spec.env,
        spec_sha256(spec.text),
    )
    assert set(spec.model_dump()) == {"kind", "text", "dropin"}


FUZZ_TEXTS = [
    SGLANG_UNIT,
    "[Service]\nExecStart=/usr/bin/x --a 1 --b 2\n",
    "[Service]\nExecStart=/usr/bin/x\\\n  --a\\\n  # c\n  --b 2\nUser=x",
    "[Service]\nEnvironment=A=1 B=2\nEnvironment=\n"
    "Environment=B=3 \\\n  A=4\nExecStart=/usr/bin/x\n",
]
FUZZ_WORDS = ["--a", "1", "-1", "x y", "--bb", "$X", "%%", "#c", ";", "\\", '"', "é", ""]


@pytest.mark.parametrize("text", FUZZ_TEXTS)
def test_random_edits_render_exactly_what_was_asked(text: str) -> None:
    rng = random.Random(text)
    spec = parse_unit(text)
    kept = [line for line in text.splitlines() if not line.startswith((" ", "ExecStart", "Env"))]
    for _ in range(300):
        argv = spec.argv
        for _ in range(rng.randint(1, 4)):
            k = rng.randint(1, len(argv))
            if rng.random() < 0.4 and k < len(argv):
                del argv[k]
            elif rng.random() < 0.5:
                argv.insert(k, rng.choice(FUZZ_WORDS))
            elif k < len(argv):
                argv[k] = rng.choice(FUZZ_WORDS)
        env = {n: rng.choice(FUZZ_WORDS) for n in rng.sample(["A", "B", "HF_HOME", "Z"], 2)}
        unset = {n for n in ["A", "NCCL_DEBUG"] if n in spec.env and n not in env}
        new = spec.with_argv(argv).with_env(env, unset)
        assert new.argv == argv
        assert new.env == {k: v for k, v in {**spec.env, **env}.items() if k not in unset}
        assert all(line in new.text.splitlines() for line in kept)
