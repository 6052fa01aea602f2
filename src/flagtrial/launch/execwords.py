"""systemd command-line words: ExecStart= splitting, quoting and exec-time expansion.

This follows systemd's own code (extract_first_word with EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE,
config_parse_exec, replace_env_argv), not POSIX shell, and was checked against systemd 252
(`systemd --test` dumps the argv it parsed from a unit).

Three layers are kept apart on purpose:

    source text --split_words--> words --expand_words--> argv the process receives
    source text <--quote_word--- words <--literal_word-- a literal value a user asked for

split_words/quote_word deal only with quotes and C escapes and round-trip every word.
Words keep specifiers (`%n`, `%%`) and environment references (`${X}`, `$X`, `$$`) exactly
as written: that is how systemd itself holds them after unquoting, and a unit's own
`${MODEL}` must survive an edit untouched. Turning a user's literal value into a word that
systemd delivers verbatim is literal_word's job, and it cannot be done by quoting:
systemd resolves specifiers on each word *after* unquoting (so `"50%"` is still a
specifier) and substitutes the environment at exec time on the unquoted words (so
`"$(touch x)"` is still a `$` reference). Hence `%` -> `%%` and `$` -> `$$` in
literal_word, and quote_word leaves both alone.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass

from flagtrial.errors import SpecError

# systemd's WHITESPACE: Unicode spaces are ordinary characters to it.
WHITESPACE = " \t\n\r"

_SIMPLE_ESCAPES = {
    "a": b"\a",
    "b": b"\b",
    "f": b"\f",
    "n": b"\n",
    "r": b"\r",
    "t": b"\t",
    "v": b"\v",
    "\\": b"\\",
    '"': b'"',
    "'": b"'",
    "s": b" ",
}
_HEX = frozenset(string.hexdigits)
_OCT = frozenset("01234567")
# Characters that never need quoting in a command line or an Environment= line. `#` and
# `;` are absent: a word starting a continuation line with them would turn that line into
# a comment, and a lone `;` separates commands.
_BARE = frozenset(string.ascii_letters + string.digits + "_-+=.,/:@%$")
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_")


@dataclass(frozen=True)
class Word:
    """One word and where its source text lies in the string it was split from."""

    text: str
    start: int
    end: int


def env_name_is_valid(name: str) -> bool:
    """systemd's rule (it follows bash): letters, digits, `_`, not starting with a digit."""
    return bool(name) and not name[0].isdigit() and all(c in _NAME_CHARS for c in name)


def _unichar_is_valid(c: int) -> bool:
    return (
        c < 0x110000
        and not 0xD800 <= c <= 0xDFFF
        and not 0xFDD0 <= c <= 0xFDEF
        and (c & 0xFFFE) != 0xFFFE
    )


def _unescape_one(s: str, j: int) -> tuple[int, bytes] | None:
    """Decode the escape whose letter is at s[j] (cunescape_one); None when systemd rejects it.

    Returns the number of characters consumed after the backslash and the bytes produced.
    `\\xNN` and octal escapes yield raw bytes (systemd's "eight_bit"), `\\u`/`\\U` UTF-8.
    """
    c = s[j]
    if c in _SIMPLE_ESCAPES:
        return 1, _SIMPLE_ESCAPES[c]
    if c == "x":
        digits = s[j + 1 : j + 3]
        if len(digits) == 2 and set(digits) <= _HEX and int(digits, 16) != 0:
            return 3, bytes([int(digits, 16)])
        return None
    if c in "uU":
        width = 4 if c == "u" else 8
        digits = s[j + 1 : j + 1 + width]
        if len(digits) != width or not set(digits) <= _HEX:
            return None
        code = int(digits, 16)
        # systemd only range-checks \U; a \u surrogate comes out as its CESU bytes.
        if code == 0 or (c == "U" and not _unichar_is_valid(code)):
            return None
        return 1 + width, chr(code).encode("utf-8", "surrogatepass")
    if c in _OCT:
        digits = s[j : j + 3]
        if len(digits) == 3 and set(digits) <= _OCT and 0 < int(digits, 8) <= 255:
            return 3, bytes([int(digits, 8)])
    return None


def _encode(c: str) -> bytes:
    try:
        return c.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise SpecError(f"character {c!r} cannot be encoded as UTF-8") from None


def scan_words(s: str, *, exec_rules: bool = True, relax_escapes: bool = True) -> list[Word]:
    """Split like systemd's extract_first_word(EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE).

    Quotes may open anywhere in a word and are concatenated (`a"b c"d` is `ab cd`); C escapes
    work inside both kinds of quotes. With relax_escapes an unknown escape is kept verbatim
    with its backslash (what ExecStart= does after a warning); without it the word is
    refused (Environment= drops the rest of such a line, so refusing is the honest answer).
    exec_rules adds ExecStart='s command separator: a bare `;` word starts a second command
    and a bare `\\;` word is a literal `;`. Raw bytes from `\\xNN` come back
    surrogate-escaped, as os.fsdecode would give them.
    """
    words: list[Word] = []
    i, n = 0, len(s)
    while True:
        while i < n and s[i] in WHITESPACE:
            i += 1
        if i >= n:
            return words
        start = i
        if exec_rules and s[i] == ";" and (i + 1 == n or s[i + 1] in WHITESPACE):
            raise SpecError(
                'a bare ";" separates commands and only one command is supported '
                '(write ";" in quotes for a literal semicolon)'
            )
        if exec_rules and s.startswith("\\;", i) and (i + 2 == n or s[i + 2] in WHITESPACE):
            words.append(Word(";", start, i + 2))
            i += 2
            continue
        text, i = _scan_word(s, i, relax_escapes=relax_escapes)
        words.append(Word(text, start, i))


def _scan_word(s: str, i: int, *, relax_escapes: bool) -> tuple[str, int]:
    """The word starting at s[i], unquoted and unescaped, and where it ends."""
    n = len(s)
    buf = bytearray()
    quote = ""
    while i < n:
        c = s[i]
        if not quote and c in WHITESPACE:
            break
        if not quote and c in "'\"":
            quote = c
            i += 1
            continue
        if quote and c == quote:
            quote = ""
            i += 1
            continue
        if c != "\\":
            buf += _encode(c)
            i += 1
            continue
        if i + 1 >= n:
            if quote:
                break  # reported as unbalanced quoting below, as systemd does
            buf += b"\\"  # an unquoted trailing backslash is kept
            i += 1
            continue
        decoded = _unescape_one(s, i + 1)
        if decoded is None:
            if not relax_escapes:
                raise SpecError(f"unknown escape sequence \\{s[i + 1]} in {s!r}")
            buf += b"\\" + _encode(s[i + 1])
            i += 2
        else:
            buf += decoded[1]
            i += 1 + decoded[0]
    if quote:
        raise SpecError(f"unbalanced quoting in {s!r}")
    return buf.decode("utf-8", "surrogateescape"), i


def split_words(s: str) -> list[str]:
    """The words of one ExecStart= command line (quotes and escapes removed)."""
    return [w.text for w in scan_words(s)]


def _escape_char(c: str) -> str:
    if c == "\\":
        return "\\\\"
    if c == '"':
        return '\\"'
    if c == "\n":
        return "\\n"
    if c == "\t":
        return "\\t"
    if c == "\r":
        return "\\r"
    if c == "\0":
        raise SpecError("an argument cannot contain a NUL character")
    if 0xDC80 <= ord(c) <= 0xDCFF:  # a surrogate-escaped raw byte
        return f"\\x{ord(c) - 0xDC00:02x}"
    if c.isprintable():
        return c
    # Other control and invisible characters: spell out their UTF-8 bytes, which every
    # systemd version decodes the same way, and which keeps the unit on one line.
    return "".join(f"\\x{b:02x}" for b in _encode(c))


def quote_word(w: str, *, always: bool = False) -> str:
    """Source text that split_words turns back into exactly [w].

    Bare when every character is plainly safe, otherwise double quotes with C escapes.
    `%` and `$` are left as they are (see the module docstring: use literal_word first when
    w is a literal value). A NUL cannot be an argument at all and raises SpecError.
    """
    bare = all(c in _BARE or (ord(c) > 127 and c.isprintable()) for c in w)
    if w and bare and not always:
        return w
    return '"' + "".join(_escape_char(c) for c in w) + '"'


def literal_word(value: str) -> str:
    """The ExecStart= word that systemd passes to the process as exactly `value`."""
    return value.replace("%", "%%").replace("$", "$$")


def literal_env_value(value: str) -> str:
    """The Environment= value that becomes exactly `value` (specifiers only, no `$` there)."""
    return value.replace("%", "%%")


def unliteral_word(word: str) -> str | None:
    """The literal value a word stands for, or None when it depends on the environment or unit.

    The inverse of literal_word for words made of plain text, `%%` and `$$`.
    """
    out: list[str] = []
    i = 0
    while i < len(word):
        c = word[i]
        if c in "%$":
            if word[i + 1 : i + 2] != c:
                return None
            i += 2
        else:
            i += 1
        out.append(c)
    return "".join(out)


def resolve_specifiers(word: str, specifiers: Mapping[str, str] | None = None) -> str:
    """Resolve `%X` specifiers like systemd's specifier_printf: `%%` is `%`, a stray `%`
    at the end stays, and any other specifier must be in `specifiers` (flagtrial has no
    unit context to resolve `%n`, `%h`... itself) or SpecError is raised."""
    table = specifiers or {}
    out: list[str] = []
    i = 0
    while i < len(word):
        c = word[i]
        if c != "%" or i + 1 == len(word):
            out.append(c)
            i += 1
            continue
        spec = word[i + 1]
        if spec == "%":
            out.append("%")
        elif spec in table:
            out.append(table[spec])
        else:
            raise SpecError(f"specifier %{spec} in {word!r} cannot be resolved here")
        i += 2
    return "".join(out)


def expand_env(
    env: Mapping[str, str], specifiers: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The values Environment= gives the process: specifiers resolved (`%%` -> `%`), `$` kept."""
    return {name: resolve_specifiers(value, specifiers) for name, value in env.items()}


def _substitute_in_word(word: str, env: Mapping[str, str]) -> str:
    """replace_env_full without extensions: `${X}` in place, `$$` -> `$`, the rest literal.

    `$X` inside a word, `${X:-y}` and an unterminated `${X` are not substitutions in
    ExecStart= and stay as written; an unset or invalid name in `${...}` becomes "".
    """
    out: list[str] = []
    i, n = 0, len(word)
    while i < n:
        if word[i] != "$" or i + 1 == n:
            out.append(word[i])
            i += 1
            continue
        nxt = word[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
            continue
        if nxt != "{":
            out.append(word[i : i + 2])
            i += 2
            continue
        j = i + 2
        while j < n and word[j] not in "}:":
            j += 1
        if j < n and word[j] == "}":
            name = word[i + 2 : j]
            out.append(env.get(name, "") if env_name_is_valid(name) else "")
        else:
            out.append(word[i : j + 1])
        i = j + 1
    return "".join(out)


def _split_env_value(value: str) -> list[str]:
    """strv_split_full(EXTRACT_RELAX|EXTRACT_UNQUOTE): quotes group, `\\x` is just x."""
    words: list[str] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in WHITESPACE:
            i += 1
        if i >= n:
            return words
        buf: list[str] = []
        quote = ""
        while i < n:
            c = value[i]
            if not quote and c in WHITESPACE:
                break
            i += 1
            if c == "\\":
                if i < n:
                    buf.append(value[i])
                    i += 1
            elif not quote and c in "'\"":
                quote = c
            elif quote and c == quote:
                quote = ""
            else:
                buf.append(c)
        words.append("".join(buf))


def expand_words(
    words: list[str],
    env: Mapping[str, str],
    *,
    specifiers: Mapping[str, str] | None = None,
    substitute_env: bool = True,
) -> list[str]:
    """The argv systemd hands to the process for these words.

    Specifiers first (systemd resolves them when it loads the unit), then the environment
    (at exec time, skipped for commands with the `:` prefix: pass substitute_env=False).
    A word that is `$NAME` on its own becomes the variable's value split at whitespace
    (zero words when unset); `${NAME}` inside a word is replaced in place.
    """
    argv: list[str] = []
    for raw in words:
        word = resolve_specifiers(raw, specifiers)
        if not substitute_env:
            argv.append(word)
        elif word.startswith("$") and word[1:2] not in ("{", "$"):
            name = word[1:]
            if env_name_is_valid(name) and name in env:
                argv.extend(_split_env_value(env[name]))
        else:
            argv.append(_substitute_in_word(word, env))
    return argv
