"""Property-based tests of unit parsing and rendering (hypothesis).

Units are generated with every line ending (LF, CRLF, CR, mixed), a BOM or not, a final
newline or not, comments (also inside continuations) holding non-UTF-8 bytes, quoted words,
specifiers and `$` references. The properties: reading and writing a file changes no byte,
an edit rewrites only the lines holding what it changes (each keeping its own line ending),
and any input, however broken, gets a one-line SpecError (exit code 3), never a traceback.
systemd itself checks a sample of what is parsed and rendered.
"""

from __future__ import annotations

import asyncio
import difflib
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from flagtrial.errors import FlagtrialError, SpecError
from flagtrial.launch.execwords import expand_env, literal_word, quote_word, resolve_specifiers
from flagtrial.launch.spec import LaunchSpec, decode_spec, encode_spec, parse_command, parse_unit
from flagtrial.targets.process import ProcessTarget
from test_launch_execwords import systemd_parse

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

EOL = st.sampled_from(["\n", "\r\n", "\r"])
# one byte that is not UTF-8 (a Latin-1 letter, a stray continuation byte), as read
RAW_BYTE = st.integers(0x80, 0xFF).map(lambda b: chr(0xDC00 + b))
TEXT_CHAR = st.characters(exclude_categories=("Cs", "Cc", "Zl", "Zp")) | RAW_BYTE
FREE_TEXT = st.text(TEXT_CHAR, max_size=16)
# what systemd accepts in an assignment: valid UTF-8, no specifier
PLAIN_TEXT = st.text(st.sampled_from("abc XYZ 019_.,:/-é中"), max_size=16)
# a value's characters: printable, any script
VALUE_CHAR = st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp"))
# words a value may be written as in ExecStart=: bare, quoted, escaped, specifiers, $refs
VALUE_SOURCE = st.one_of(
    st.sampled_from(["4", "-1", "%n", "%%", "50%%", "$HOME", "${X}", "$$X", "é", "a\\;"]),
    st.sampled_from(["'x y'", '"a b"', 'a"b c"d', '"\\x41\\t"', "'\\101'", '""']),
    st.text(VALUE_CHAR, max_size=8).map(lambda v: quote_word(literal_word(v))),
)
FLAG = st.sampled_from(["--ctx-size", "--alias", "-t", "--model", "-c", "--jinja"])


def physical_lines(text: str) -> list[str]:
    """Lines with their endings, split on LF, CRLF and CR."""
    return re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", text)


def ending(line: str) -> str:
    return line[len(line.rstrip("\r\n")) :]


def changed(old: str, new: str) -> tuple[list[str], list[str]]:
    """(removed, added) physical lines, endings included; the rest are kept byte for byte."""
    a, b = physical_lines(old), physical_lines(new)
    removed: list[str] = []
    added: list[str] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op != "equal":
            removed += a[i1:i2]
            added += b[j1:j2]
    return removed, added


@st.composite
def comment(draw: st.DrawFn) -> str:
    return draw(st.sampled_from(["", " ", "\t"])) + draw(st.sampled_from("#;")) + draw(FREE_TEXT)


@st.composite
def units(draw: st.DrawFn) -> str:
    """A llama-server unit: its shape, and every byte that does not matter to systemd, random.

    `-np 4` is on a line of its own (the edit the properties make) and OMP_NUM_THREADS set.
    """
    rows: list[str] = [draw(comment()) for _ in range(draw(st.integers(0, 2)))]
    rows += ["[Unit]", "Description=" + draw(PLAIN_TEXT)]
    rows += [draw(comment()) for _ in range(draw(st.integers(0, 1)))]
    rows.append("[Service]")
    rows.append("Environment=OMP_NUM_THREADS=1" + draw(st.sampled_from(["", ' "B=x y"'])))
    groups = [f"{flag} {draw(VALUE_SOURCE)}" for flag in draw(st.lists(FLAG, max_size=3))]
    groups.insert(draw(st.integers(0, len(groups))), "-np 4")
    exec_rows = ["ExecStart=/usr/bin/llama-server -m /srv/m.gguf"]
    for group in groups:
        if draw(st.booleans()):  # a continuation line, with comments inside it or not
            exec_rows[-1] += draw(st.sampled_from([" \\", "\\", "  \\"]))
            exec_rows += [draw(comment()) for _ in range(draw(st.integers(0, 1)))]
            exec_rows.append(draw(st.sampled_from(["    ", "\t", ""])) + group)
        elif group == "-np 4":  # the edited flag is alone on its line
            exec_rows[-1] += " \\"
            exec_rows.append("  " + group)
        else:
            exec_rows[-1] += " " + group
    rows += exec_rows
    rows += draw(st.lists(st.sampled_from(["User=llm", "Restart=on-failure", ""]), max_size=2))
    rows += draw(st.sampled_from([[], ["[Install]", "WantedBy=multi-user.target"]]))
    # Only a CR directly before an empty LF line would read as one CRLF: keep lines distinct.
    endings = [draw(EOL) for _ in rows]
    for k in range(1, len(rows)):
        if endings[k - 1] == "\r" and rows[k] == "" and endings[k] == "\n":
            endings[k] = "\r"
    if draw(st.booleans()):
        endings[-1] = ""  # no final newline
    bom = "\ufeff" if draw(st.booleans()) else ""
    text = bom + "".join(r + e for r, e in zip(rows, endings, strict=True))
    return decode_spec(encode_spec(text))  # as read from a file (raw bytes may pair up)


PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(units())
def test_reading_and_writing_a_unit_changes_no_byte(text: str) -> None:
    data = encode_spec(text)
    assert decode_spec(data) == text  # every byte survives the text form
    spec = parse_unit(text)
    assert spec.with_argv(spec.argv) is spec and spec.with_env({}) is spec
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "llama.service"
        path.write_bytes(data)
        target = ProcessTarget(path, Path(tmp) / "state")
        read = asyncio.run(target.read_spec())
        assert read.text == text
        asyncio.run(target.install_spec(read))
        assert path.read_bytes() == data


@PROPERTY
@given(units(), VALUE_SOURCE)
def test_changing_a_value_rewrites_only_its_line_and_keeps_its_ending(text: str, new: str) -> None:
    spec = parse_unit(text)
    argv = spec.argv
    value = parse_unit(f"[Service]\nExecStart=/x {new}\n").argv[1]
    assume(value != "4")
    argv[argv.index("-np") + 1] = value
    edited = spec.with_argv(argv)
    assert edited.argv == argv
    [old_line], [new_line] = changed(text, edited.text)
    assert ending(new_line) == ending(old_line)
    assert new_line == old_line.replace("-np 4", f"-np {quote_word(value)}", 1)


@PROPERTY
@given(units(), FLAG, VALUE_SOURCE)
def test_appending_a_flag_touches_only_the_command_s_last_line(
    text: str, flag: str, source: str
) -> None:
    spec = parse_unit(text)
    value = parse_unit(f"[Service]\nExecStart=/x {source}\n").argv[1]
    assume(f"{flag} {quote_word(value)}" not in text)  # a new line the diff cannot misplace
    edited = spec.with_argv([*spec.argv, flag, value])
    assert edited.argv == [*spec.argv, flag, value]
    removed, added = changed(text, edited.text)
    assert len(removed) == 1  # the command's last line, whatever else the file holds
    eol = ending(removed[0]) or next(ending(line) for line in physical_lines(text))
    assert all(ending(line) == eol for line in added[:-1])
    assert ending(added[-1]) == ending(removed[0])


@PROPERTY
@given(units(), st.text(VALUE_CHAR | st.sampled_from("\t\n\\%$\"'"), max_size=8))
def test_environment_edits_touch_only_environment_lines(text: str, value: str) -> None:
    spec = parse_unit(text)
    assume(value != "1")
    edited = spec.with_env({"OMP_NUM_THREADS": value})
    assert edited.env == {**spec.env, "OMP_NUM_THREADS": value} and edited.argv == spec.argv
    [old_line], [new_line] = changed(text, edited.text)
    assert old_line.startswith("Environment=OMP_NUM_THREADS=1")
    assert ending(new_line) == ending(old_line)

    added_var = spec.with_env({"NEW_VAR": value})
    removed, added = changed(text, added_var.text)
    # one new line after the Environment= line, which keeps its bytes (only an unterminated
    # last line gains an ending to have something after it)
    assert [line.rstrip("\r\n") for line in removed] == [line.rstrip("\r\n") for line in added[:-1]]
    assert added[-1].startswith("Environment=") and len(added) == len(removed) + 1

    unset = spec.with_env({}, {"OMP_NUM_THREADS"})
    removed, added = changed(text, unset.text)
    assert removed[0].startswith("Environment=OMP_NUM_THREADS=1")
    assert added == ([] if "B=x y" not in text else [f'Environment="B=x y"{ending(removed[0])}'])


@settings(max_examples=25, deadline=None)
@given(units(), FLAG, VALUE_SOURCE)
def test_systemd_reads_what_was_parsed_and_rendered(text: str, flag: str, source: str) -> None:
    # systemd refuses a unit whose BOM'd first line holds a non-UTF-8 byte (its comment
    # check runs before the BOM is skipped)
    first = physical_lines(text)[0]
    assume(not (first.startswith("\ufeff") and any(0xDC80 <= ord(c) <= 0xDCFF for c in first)))
    spec = parse_unit(text)
    value = parse_unit(f"[Service]\nExecStart=/x {source}\n").argv[1]
    argv = spec.argv
    argv[argv.index("-np") + 1] = "8"
    edited = spec.with_argv([*argv, flag, value]).with_env({"NEW_VAR": "a b"})
    for unit in (spec, edited):
        argvs, env_entries, _ = systemd_parse(unit.text)
        assert argvs == [[resolve_specifiers(w, {"n": "oracle.service"}) for w in unit.argv]]
        assert env_entries == [f"{k}={v}" for k, v in expand_env(unit.env).items()]


RESETS = (
    "[Service]\n"
    "ExecStart=/bin/false\n"
    "Environment=A=1\n"
    "Environment=\n"
    'Environment=B=2 "C=3 4"\n'
    "EnvironmentFile=-/nonexistent\n"
    "ExecStart=\n"
    "ExecStart={prefix}/bin/echo echo-name \\\n"
    "  -np 4 \\\n"
    "  --drop me \\\n"
    "  --last y\n"
    "Environment=D=5"
)


@pytest.mark.parametrize("prefix", ["-@", "+@", "!!@", ":@"])
def test_systemd_reads_resets_prefixes_and_removed_lines_as_parsed(prefix: str) -> None:
    """What the sampled units above never hold: the reader's resets and prefix characters,
    the renderer dropping a line, a whole Environment= and a continuation."""
    spec = parse_unit(RESETS.format(prefix=prefix))
    assert (spec.prefix, spec.program) == (prefix, ["/bin/echo"])
    argv = spec.argv
    dropped = spec.with_argv([w for w in argv if w not in ("--drop", "me")])
    edited = dropped.with_argv(dropped.argv[:-2]).with_env({"B": "9"}, {"D"})
    # the dropped last line had no ending, so the file still ends without one
    assert edited.text.endswith("ExecStart=" + prefix + "/bin/echo echo-name \\\n  -np 4")
    assert (edited.argv, edited.env) == (argv[:-4], {"B": "9", "C": "3 4"})
    for unit in (spec, dropped, edited):
        argvs, env_entries, _ = systemd_parse(unit.text)
        assert argvs == [unit.argv[1:]]  # with `@`, systemd shows argv[0] on
        assert env_entries == [f"{k}={v}" for k, v in unit.env.items()]


# ---------------------------------------------------------------------------- bad input


@st.composite
def broken_units(draw: st.DrawFn) -> bytes:
    """A unit with random bytes inserted, deleted or replaced, or random bytes outright."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200))
    data = bytearray(encode_spec(draw(units())))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        junk = draw(
            st.sampled_from([b"\\", b'"', b"'", b"\r", b"\n", b"=", b"[", b"]", b";", b"\0"])
            | st.binary(min_size=1, max_size=3)
        )
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        if op == "insert":
            data[at:at] = junk
        elif op == "delete":
            del data[at : at + len(junk)]
        else:
            data[at : at + len(junk)] = junk
    return bytes(data)


def one_line_spec_error(e: FlagtrialError) -> None:
    assert isinstance(e, SpecError) and e.exit_code == 3
    assert "\n" not in str(e) and "\r" not in str(e) and str(e)


@PROPERTY
@given(broken_units(), st.sampled_from(["unit", "command"]))
def test_broken_input_is_a_one_line_error_and_leaves_the_file(data: bytes, kind: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("llama.service" if kind == "unit" else "llama.cmd")
        path.write_bytes(data)
        target = ProcessTarget(path, Path(tmp) / "state")
        try:
            spec = asyncio.run(target.read_spec())
        except FlagtrialError as e:
            one_line_spec_error(e)
        else:
            # Parsed: every edit either renders what was asked or refuses in one line.
            for edit in (
                lambda s: s.with_argv([*s.argv, "--ctx-size", "8"]),
                lambda s: s.with_argv(s.argv[:1] + s.argv[2:]) if len(s.argv) > 1 else s,
                lambda s: s.with_env({"OMP_NUM_THREADS": "2"}, set(s.env) - {"OMP_NUM_THREADS"}),
            ):
                try:
                    edited = edit(spec)
                except FlagtrialError as e:
                    one_line_spec_error(e)
                else:
                    again = LaunchSpec(kind=spec.kind, text=edited.text)
                    assert (again.argv, again.env) == (edited.argv, edited.env)
        assert path.read_bytes() == data


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.with_argv([*s.argv, "a\0b"]), "NUL"),
        (lambda s: s.with_argv([]), "empty"),
        (lambda s: s.with_env({"1BAD": "x"}), "invalid environment variable name"),
        (lambda s: s.with_env({"A": "x\0"}), "NUL"),
        (lambda s: s.with_argv([s.argv[0], "z", "--c"]), "spans continuation"),
    ],
)
def test_bad_edits_are_one_line_errors(edit, message: str) -> None:  # type: ignore[no-untyped-def]
    spec = parse_unit('\ufeff[Service]\r\nExecStart=/usr/bin/x "a \\\r\n  b" --c\r\n')
    with pytest.raises(SpecError, match=message) as e:
        edit(spec)
    one_line_spec_error(e.value)


@PROPERTY
@given(units())
def test_a_command_file_round_trips_like_a_unit(text: str) -> None:
    # the unit's command alone, as a command file with the same line endings
    spec = parse_unit(text)
    lines = physical_lines(text)
    start = next(k for k, line in enumerate(lines) if line.lstrip("\ufeff").startswith("Exec"))
    body = [lines[start].removeprefix("ExecStart=")]
    last = body[0]  # the command's last line that is not a comment
    for line in lines[start + 1 :]:
        if not last.rstrip("\r\n").endswith("\\"):
            break
        body.append(line)
        if not line.lstrip(" \t").startswith(("#", ";")):
            last = line
    command = parse_command("".join(body))
    assert command.argv == spec.argv
    argv = command.argv
    argv[argv.index("-np") + 1] = "8"
    [old_line], [new_line] = changed(command.text, command.with_argv(argv).text)
    assert new_line == old_line.replace("-np 4", "-np 8", 1)
