"""systemd word splitting and quoting, checked against systemd itself.

`systemd --test --system --unit=X` loads X the way PID 1 would and dumps the argv it parsed
(after unquoting and specifiers, before exec-time environment substitution), so it is the
oracle for split_words and quote_word. What happens at exec time ($ substitution) needs a
running systemd and is proven by the nspawn tests; here expand_words follows systemd's code.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from flagtrial.errors import SpecError
from flagtrial.launch.execwords import (
    expand_env,
    expand_words,
    literal_env_value,
    literal_word,
    quote_word,
    resolve_specifiers,
    split_words,
    unliteral_word,
)
from flagtrial.launch.spec import parse_unit

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

HOSTILE = [
    "$(touch /tmp/pwned)",
    "; reboot",
    ";",
    "`id`",
    "a'b\"c",
    "back\\slash\\",
    "\\;",
    "line\nbreak",
    "tab\there",
    "  spaced  ",
    "",
    "50%",
    "%n%%",
    "$HOME",
    "${HOME}",
    "$$",
    "$",
    "#not-a-comment",
    "-1",
    "--flag=value with space",
    "é ü 中文",
    "\x7f\x01\x1b[31m",
    "\udcff raw byte",
    "'",
    '"',
    "\\x41",
]


def test_quotes_open_anywhere_and_concatenate() -> None:
    assert split_words("a\"b c\"d 'x y'") == ["ab cd", "x y"]


def test_c_escapes_in_both_quote_kinds() -> None:
    assert split_words(r"'a\nb' \x41\101\u00e9 \s \"q\" '\''") == ["a\nb", "AAé", " ", '"q"', "'"]


def test_unknown_escape_is_kept_verbatim_like_systemd() -> None:
    assert split_words(r"\q x\ y") == ["\\q", "x\\ y"]


def test_empty_word_survives() -> None:
    assert split_words('/bin/x "" b') == ["/bin/x", "", "b"]


def test_semicolons() -> None:
    assert split_words(r'/bin/x \; ";" \\;') == ["/bin/x", ";", ";", "\\;"]
    with pytest.raises(SpecError, match="separates commands"):
        split_words("/bin/x ; /bin/y")


def test_unbalanced_quotes() -> None:
    with pytest.raises(SpecError, match="unbalanced"):
        split_words('/bin/x "open')
    with pytest.raises(SpecError, match="unbalanced"):
        split_words("/bin/x 'open\\")


def test_raw_bytes_come_back_surrogate_escaped() -> None:
    assert split_words(r"\xff\xc3\xa9") == ["\udcffé"]


def test_specifiers_and_dollars_are_kept_as_written() -> None:
    assert split_words("50%% ${X} $Y $$") == ["50%%", "${X}", "$Y", "$$"]


@pytest.mark.parametrize("word", HOSTILE)
def test_quote_word_round_trips(word: str) -> None:
    assert split_words(quote_word(word)) == [word]
    assert split_words(f"/bin/x {quote_word(word)} tail") == ["/bin/x", word, "tail"]


def test_quote_word_is_minimal() -> None:
    assert quote_word("--ctx-size") == "--ctx-size"
    assert quote_word("/srv/models/a.gguf") == "/srv/models/a.gguf"
    assert quote_word("a b") == '"a b"'
    assert quote_word("") == '""'


def test_quote_word_refuses_nul() -> None:
    with pytest.raises(SpecError, match="NUL"):
        quote_word("a\0b")


def test_quote_word_round_trips_random_strings() -> None:
    rng = random.Random(1234)
    alphabet = " \t\n\r\"'\\$%;#{}()`|&<>*?!-=@:+,./aZ09é\x01\x7f\u2028\udc80"
    for _ in range(2000):
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert split_words(quote_word(word)) == [word], word


@pytest.mark.parametrize("value", HOSTILE)
def test_literal_reaches_the_process_verbatim(value: str) -> None:
    env = {"HOME": "/root", "Y": "a b", "n": "unit"}
    words = split_words("/bin/x " + quote_word(literal_word(value)))
    assert expand_words(words, env)[1:] == [value]
    assert unliteral_word(literal_word(value)) == value


def test_expand_env_substitution_rules() -> None:
    env = {"FOO": "a b  'c d'", "BAR": "x"}
    words = ["/bin/x", "${FOO}", "$FOO", "a${BAR}b", "a$BAR", "$$BAR", "$UNSET", "${UNSET}"]
    assert expand_words(words, env) == [
        "/bin/x", "a b  'c d'", "a", "b", "c d", "axb", "a$BAR", "$BAR", "",
    ]  # fmt: skip
    assert expand_words(["${A:-b}", "${OPEN", "$", "$-x"], {"A": "1"}) == ["${A:-b}", "${OPEN"]
    assert expand_words(["$FOO"], env, substitute_env=False) == ["$FOO"]


def test_specifiers() -> None:
    assert resolve_specifiers("50%% 100%") == "50% 100%"
    assert resolve_specifiers("%n.log", {"n": "llm.service"}) == "llm.service.log"
    with pytest.raises(SpecError, match="%h"):
        resolve_specifiers("%h/models")
    assert expand_words(["%%$$"], {}) == ["%$"]


def test_environment_values_only_escape_percent() -> None:
    assert literal_env_value("50% $HOME") == "50%% $HOME"
    assert expand_env({"A": "50%% $HOME"}) == {"A": "50% $HOME"}


# ---------------------------------------------------------------------------- systemd oracle


def _systemd_binary() -> str:
    for path in ("/lib/systemd/systemd", "/usr/lib/systemd/systemd"):
        if os.access(path, os.X_OK):
            return path
    pytest.fail("systemd is not installed (apt-get install systemd): it is the oracle here")


def _decode_dump_word(token: str) -> str:
    """Undo systemd's shell_maybe_quote in a `Command Line:` dump."""
    if not token.startswith('"'):
        return token
    out = bytearray()
    body, i = token[1:-1], 0
    simple = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11}
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode("utf-8", "surrogateescape")
            i += 1
        elif body[i + 1] in simple:
            out.append(simple[body[i + 1]])
            i += 2
        elif body[i + 1 : i + 4].isdigit():
            out.append(int(body[i + 1 : i + 4], 8))
            i += 4
        else:
            out += body[i + 1].encode("utf-8", "surrogateescape")
            i += 2
    return out.decode("utf-8", "surrogateescape")


def _split_dump(line: str) -> list[str]:
    tokens: list[str] = []
    i = 0
    while i < len(line):
        if line[i] == '"':
            j = i + 1
            while line[j] != '"':
                j += 2 if line[j] == "\\" else 1
            tokens.append(_decode_dump_word(line[i : j + 1]))
            i = j + 2
        else:
            j = line.find(" ", i)
            j = len(line) if j < 0 else j
            tokens.append(line[i:j])
            i = j + 1
    return tokens


def systemd_parse(unit_text: str) -> tuple[list[list[str]], list[str], str]:
    """(argv of each ExecStart= command, Environment= entries, warnings) as systemd reads them."""
    unit_dir = Path(tempfile.mkdtemp(prefix="flagtrial-oracle-"))
    try:
        unit_dir.chmod(0o755)
        unit = unit_dir / "oracle.service"
        unit.write_bytes(unit_text.encode("utf-8", "surrogateescape"))
        unit.chmod(0o644)
        cmd = [_systemd_binary(), "--test", "--system", "--unit=oracle.service", "--no-pager"]
        if os.geteuid() == 0:  # systemd refuses test mode as root
            cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
        env = {"PATH": os.environ["PATH"], "HOME": "/", "SYSTEMD_LOG_TARGET": "console",
               "SYSTEMD_UNIT_PATH": f"{unit_dir}:"}  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, env=env, timeout=60, check=False)
    finally:
        shutil.rmtree(unit_dir)
    out = proc.stdout.decode("utf-8", "surrogateescape")
    block = out.split("-> Unit oracle.service:", 1)[1].split("-> Unit ", 1)[0]
    argvs, env_entries = [], []
    for line in block.splitlines():
        stripped = line.strip()
        if stripped.startswith("Command Line: "):
            argvs.append(_split_dump(stripped[len("Command Line: ") :]))
        elif stripped.startswith("Environment: "):
            env_entries.append(stripped[len("Environment: ") :])
    warnings = proc.stderr.decode("utf-8", "surrogateescape") + out.split("-> Unit ", 1)[0]
    return argvs, env_entries, warnings


SAFE_FOR_DUMP = [w for w in HOSTILE if "\n" not in w and "\x1b" not in w]


def test_systemd_splits_like_split_words() -> None:
    lines = [
        '/bin/echo a"b c"d \'x y\' "\\x41\\101\\u00e9\\s" 50%% $$HOME ${FOO} $FOO \\; -1',
        "/bin/echo 'a\\nb' \\q \"\" \\x25\\x25 \\x24x \\xff\\xc3\\xa9 '\\101' a\\\"b",
        "/bin/echo " + " ".join(quote_word(w) for w in SAFE_FOR_DUMP),
        "/bin/echo " + " ".join(quote_word(literal_word(w)) for w in SAFE_FOR_DUMP),
    ]
    unit = "[Service]\nType=oneshot\n" + "".join(f"ExecStart={line}\n" for line in lines)
    argvs, _, warnings = systemd_parse(unit)
    complaints = [w for w in warnings.splitlines() if "oracle.service:" in w]
    assert complaints == [
        f'{complaints[0].split(": ")[0]}: Ignoring unknown escape sequences: "\\q"'
    ]
    unit_name = {"n": "oracle.service"}
    assert argvs == [
        [resolve_specifiers(w, unit_name) for w in split_words(line)] for line in lines
    ]


def test_systemd_agrees_on_a_hostile_edit_of_a_unit() -> None:
    spec = parse_unit(
        "[Service]\n"
        'Environment="A=1 2" B=%%x\n'
        "ExecStart=/usr/bin/llama-server \\\n"
        "    # the model\n"
        "    -m /m.gguf \\\n"
        "    -np 4\n"
    )
    values = [literal_word(w) for w in SAFE_FOR_DUMP]
    edited = spec.with_argv([*spec.argv, "--alias", *values]).with_env(
        {"C": literal_env_value("50% $HOME ;x")}, {"A"}
    )
    argvs, env_entries, _ = systemd_parse(edited.text)
    assert argvs == [[resolve_specifiers(w) for w in edited.argv]]
    # The rest ($$ -> $) happens at exec time, which the nspawn tests run for real.
    assert expand_words(edited.argv, {"HOME": "/root"})[6:] == SAFE_FOR_DUMP
    assert env_entries == [f"{k}={v}" for k, v in expand_env(edited.env).items()]
