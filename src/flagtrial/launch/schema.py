"""An engine's flags, read from its own `--help` text, and argv parsed against them.

Two help formats are understood: llama.cpp's (llama-server: `-np,   --parallel N   text`,
help continued at column 40, `(env: LLAMA_ARG_...)`) and Python argparse's (SGLang, vLLM:
`  --tp-size TP_SIZE`, `{a,b}` choices, `[X]` optional values). The two differ in ways that
matter for editing, all checked against the real parsers:

- llama.cpp takes no `--flag=value` (`--parallel=4` is "invalid argument") and always
  consumes the next word as the value, even `-1` or `--version`; `[on|off|auto]` is not
  an optional value but a toggle that also takes `1`, `true`, `enabled`, `-1`...
  (`-fa 1` is accepted), `<0|1>` is a hint (`--cpu-strict 5` is accepted), while `{a,b}`
  and "allowed values:" are enforced. An `N` is read with std::stoi or std::stof: which
  one shows in the default the help prints (`default: 4` or `default: 0.80`); both skip
  leading blanks and ignore what follows the number (`-t 1.5` runs 1 thread).
- argparse takes `--flag=value`, unique prefixes of long flags (`--tp` for `--tp-size`),
  `[X]` as an optional value, and `X [X ...]` / `[X ...]` as several values.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Literal

from flagtrial.errors import SpecError, UnknownFlagError

HelpStyle = Literal["llama", "argparse"]
# How llama.cpp reads a value (see values.value_problem): std::stoi, std::stof, either of the two
# (an `N` whose help shows no default), or a toggle word.
ValueKind = Literal["int", "float", "number", "toggle"]

_NAME = re.compile(r"-{1,2}[A-Za-z0-9][\w.\-]*")
_NUMBER = re.compile(r"-\d+(\.\d*)?([eE][-+]?\d+)?|-\.\d+")
_ENV = re.compile(r"\(env: ([A-Za-z_][A-Za-z0-9_]*)\)")
_ALLOWED = "allowed values:"
_OPEN = {"<": ">", "[": "]", "{": "}", "(": ")"}
_INT_METAVARS = {"N", "PORT", "<0|1>", "<0...100>"}
_DEFAULT = re.compile(r"default: (-?\d+(\.\d+)?)\b")
# A help text that gives a negative value a meaning: `-1 = auto`, `default: -1`.
_NEGATIVE = re.compile(r"(?<![\w.])-\d")


@dataclass(frozen=True)
class FlagDef:
    """One flag as the engine's help declares it.

    names holds every spelling, negative ones (`--no-cont-batching`, which turn the same
    setting off) included and also listed in negative_names. nargs is how many values the
    flag consumes (0 for a switch, 2 for llama's `--control-vector-layer-range START END`);
    variadic flags (argparse `+`/`*`) consume every following word that is not a flag.
    """

    names: tuple[str, ...]
    canonical: str
    takes_value: bool
    optional_value: bool = False
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    help: str = ""
    env_var: str | None = None
    negative_names: tuple[str, ...] = ()
    nargs: int = 0
    variadic: bool = False
    # How the engine reads the value (None: free text, not checked); minimum is the least
    # value an `int` takes (0 where the help gives no negative value a meaning).
    kind: ValueKind | None = None
    minimum: int | None = None
    # The engine accumulates repeats (argparse `append`); elsewhere the last one wins.
    repeatable: bool = False


@dataclass(frozen=True)
class ArgItem:
    """One flag with its value words, or one positional word (flag None).

    words are the original words (`--x=v` is one word, `-np 4` two); name is the spelling
    used (an argparse abbreviation stays abbreviated); attached says the value was written
    `--x=v`; negated that a negative name was used.
    """

    flag: FlagDef | None
    words: tuple[str, ...]
    values: tuple[str, ...] = ()
    name: str | None = None
    attached: bool = False
    negated: bool = False

    @property
    def value(self) -> str | None:
        return " ".join(self.values) if self.values else None


def _split_top(s: str) -> list[str]:
    """Split at spaces outside <>, [], {} and () (`<tensor name pattern>=<buffer>` is one)."""
    tokens: list[str] = []
    depth: list[str] = []
    cur: list[str] = []
    for c in s:
        if c == " " and not depth:
            if cur:
                tokens.append("".join(cur))
            cur = []
            continue
        if c in _OPEN:
            depth.append(_OPEN[c])
        elif depth and c == depth[-1]:
            depth.pop()
        cur.append(c)
    if cur:
        tokens.append("".join(cur))
    return tokens


def _braced_choices(token: str) -> tuple[str, ...] | None:
    if token.startswith("{") and token.endswith("}") and len(token) > 2:
        return tuple(c.strip() for c in token[1:-1].split(","))
    return None


def _negatives(names: list[str]) -> tuple[str, ...]:
    """The negative spellings: every name after the last positive long one, when some of them
    are `--no-...` (llama prints `-kvo, --kv-offload, -nkvo, --no-kv-offload`)."""
    positive_longs = [
        i for i, n in enumerate(names) if n.startswith("--") and not n.startswith("--no-")
    ]
    if not positive_longs:
        return ()
    tail = names[positive_longs[-1] + 1 :]
    return tuple(tail) if any(n.startswith("--no-") for n in tail) else ()


def _allowed_values(help_lines: list[str]) -> tuple[str, ...] | None:
    """llama's enforced `allowed values: a, b, c` list, which may wrap after a comma."""
    text: str | None = None
    for line in help_lines:
        stripped = line.strip()
        if text is None:
            if stripped.startswith(_ALLOWED):
                text = stripped[len(_ALLOWED) :]
        else:
            text += " " + stripped
        if text is not None and not text.endswith(","):
            break
    if text is None:
        return None
    return tuple(v.strip() for v in text.split(",") if v.strip())


def _make_flag(names: list[str], metavar: str, help_lines: list[str], style: HelpStyle) -> FlagDef:
    help_text = " ".join(line.strip() for line in help_lines if line.strip())
    env = _ENV.search(help_text)
    canonical = next((n for n in names if n.startswith("--")), names[0])
    optional = variadic = False
    choices: tuple[str, ...] | None = None
    tokens = _split_top(metavar)
    if style == "argparse":
        if m := re.fullmatch(r"\[(\S+) \.\.\.\]", metavar):
            optional = variadic = True
            tokens = [m.group(1)]
        elif m := re.fullmatch(r"(\S+) \[(\S+) \.\.\.\]", metavar):
            variadic = True
            tokens = [m.group(1)]
        elif m := re.fullmatch(r"\[(\S+)\]", metavar):
            optional = True
            tokens = [m.group(1)]
    if tokens:
        choices = _braced_choices(tokens[0])
    if choices is None:
        choices = _allowed_values(help_lines)
    kind, minimum = _value_kind(metavar, help_text) if style == "llama" else (None, None)
    return FlagDef(
        names=tuple(names),
        canonical=canonical,
        takes_value=bool(tokens),
        optional_value=optional,
        choices=choices,
        metavar=metavar or None,
        help=help_text,
        env_var=env.group(1) if env else None,
        negative_names=_negatives(names),
        nargs=len(tokens),
        variadic=variadic,
        kind=kind,
        minimum=minimum,
    )


def _value_kind(metavar: str, help_text: str) -> tuple[ValueKind | None, int | None]:
    """How llama-server reads a value, from its metavar and the default its help prints."""
    if metavar in ("[on|off]", "[on|off|auto]"):
        return "toggle", None
    if metavar not in _INT_METAVARS or "DEPRECATED" in help_text or "has been removed" in help_text:
        return None, None
    default = _DEFAULT.search(help_text)
    if metavar == "N" and default is None:
        return "number", None
    if metavar == "N" and default is not None and default.group(2):
        return "float", None
    return "int", None if _NEGATIVE.search(help_text) else 0


def _entries(
    lines: list[str], is_start: re.Pattern[str], is_help: re.Pattern[str]
) -> Iterator[tuple[str, list[str]]]:
    """(first line, following help lines) for every option entry."""
    current: tuple[str, list[str]] | None = None
    for line in lines:
        if is_start.match(line):
            if current:
                yield current
            current = (line, [])
        elif current and is_help.match(line):
            current[1].append(line)
        elif line.strip():
            if current:
                yield current
            current = None
    if current:
        yield current


def _parse_llama(text: str) -> list[FlagDef]:
    flags: list[FlagDef] = []
    for first, more in _entries(
        text.splitlines(), re.compile(r"-{1,2}[A-Za-z0-9]"), re.compile(r"\s")
    ):
        # The header ends at the first run of 2+ spaces not right after a comma (llama pads
        # a short first name to 7 columns: `-np,   --parallel N`).
        m = re.search(r"(?<=[^,\s])\s{2,}", first)
        header, help_first = (first[: m.start()], first[m.end() :]) if m else (first.rstrip(), "")
        parts = re.split(r",\s+", header.strip())
        last_name, _, metavar = parts[-1].partition(" ")
        names = [*parts[:-1], last_name]
        if not all(_NAME.fullmatch(n) for n in names):
            raise SpecError(f"cannot read the flag names in help line {first.strip()!r}")
        flags.append(_make_flag(names, metavar.strip(), [help_first, *more], "llama"))
    return flags


def _parse_argparse(text: str) -> list[FlagDef]:
    lines = text.splitlines()
    # Skip the usage block: its continuation lines list the flags again.
    if lines and lines[0].lstrip().startswith("usage:"):
        while lines and lines[0].strip():
            lines.pop(0)
    flags: list[FlagDef] = []
    for first, more in _entries(lines, re.compile(r"  -{1,2}[A-Za-z0-9]"), re.compile(r"   ")):
        invocation, _, help_first = first.strip().partition("  ")
        names: list[str] = []
        metavar = ""
        for part in invocation.split(", "):
            name, _, args = part.partition(" ")
            if not _NAME.fullmatch(name):
                raise SpecError(f"cannot read the flag names in help line {first.strip()!r}")
            names.append(name)
            metavar = metavar or args.strip()
        flags.append(_make_flag(names, metavar, [help_first, *more], "argparse"))
    return flags


def detect_style(help_text: str) -> HelpStyle:
    head = help_text.lstrip()
    if head.startswith("usage:") or re.search(r"^(options|optional arguments):$", help_text, re.M):
        return "argparse"
    return "llama"


@dataclass(frozen=True)
class FlagSchema:
    """An engine's flags. help_text is the artefact to cache (per engine version); program
    is the name errors use (`unknown flag --paralel for llama-server`)."""

    program: str
    style: HelpStyle
    flags: tuple[FlagDef, ...]
    help_text: str
    _by_name: dict[str, FlagDef] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, FlagDef] = {}
        for f in self.flags:
            for n in f.names:
                # The first declaration wins, as a later duplicate could never be reached.
                by_name.setdefault(n, f)
        object.__setattr__(self, "_by_name", by_name)

    @classmethod
    def parse_help(cls, help_text: str, program: str, style: HelpStyle | None = None) -> FlagSchema:
        """The schema in `program --help` output; program may be a path (its name is kept)."""
        name = PurePath(program).name or program
        style = style or detect_style(help_text)
        flags = _parse_llama(help_text) if style == "llama" else _parse_argparse(help_text)
        if not flags:
            raise SpecError(f"no flags found in the --help output of {name}")
        return cls(program=name, style=style, flags=tuple(flags), help_text=help_text)

    @property
    def accepts_equals(self) -> bool:
        """Whether the engine takes `--flag=value` (argparse does, llama.cpp does not)."""
        return self.style == "argparse"

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def _unknown(self, token: str) -> UnknownFlagError:
        # Longer spellings of what was typed first (`--ctx` -> `--ctx-size`), then typos.
        longer = sorted((n for n in self.names if n.startswith(token)), key=len)
        typos = difflib.get_close_matches(token, self.names, n=3, cutoff=0.75)
        close = list(dict.fromkeys([*longer, *typos]))[:3]
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        return UnknownFlagError(f"unknown flag {token} for {self.program}{hint}")

    def resolve(self, token: str) -> tuple[FlagDef, str, str | None]:
        """(flag, name as the engine reads it, value attached with `=` or None) for a flag word."""
        if token in self._by_name:
            return self._by_name[token], token, None
        name, eq, value = token.partition("=")
        if eq and name in self._by_name:
            if not self.accepts_equals:
                raise UnknownFlagError(
                    f"{self.program} does not accept {name}=VALUE; write {name} {value}"
                )
            return self._by_name[name], name, value
        if self.style == "argparse" and name.startswith("--"):
            # argparse's allow_abbrev: a unique prefix of a long flag names it.
            hits = {self._by_name[n].canonical: n for n in self.names if n.startswith(name)}
            if len(hits) == 1:
                full = next(iter(hits.values()))
                return self._by_name[full], full, value if eq else None
            if len(hits) > 1:
                raise UnknownFlagError(
                    f"ambiguous flag {name} for {self.program}: "
                    f"could be {', '.join(sorted(hits.values()))}"
                )
        raise self._unknown(name if eq else token)

    def lookup(self, token: str) -> FlagDef:
        """The flag a word names (any alias, `--x=v`, or an argparse abbreviation)."""
        return self.resolve(token)[0]


def looks_like_flag(word: str) -> bool:
    """A word that a parser reads as a flag rather than a value (negative numbers are values)."""
    return len(word) > 1 and word.startswith("-") and not _NUMBER.fullmatch(word)


def parse_argv(argv: list[str], schema: FlagSchema) -> list[ArgItem]:
    """Group argv (program first) into the program, flags with their values, and positionals.

    Raises UnknownFlagError for a flag the engine does not know and SpecError for a flag
    missing its value, both naming the word.
    """
    if not argv:
        raise SpecError("empty command line")
    items = [ArgItem(flag=None, words=(argv[0],))]
    i = 1
    only_positionals = False
    while i < len(argv):
        word = argv[i]
        i += 1
        if only_positionals or not looks_like_flag(word):
            items.append(ArgItem(flag=None, words=(word,)))
            continue
        if word == "--" and schema.style == "argparse":
            only_positionals = True
            items.append(ArgItem(flag=None, words=(word,)))
            continue
        flag, full, attached = schema.resolve(word)
        negated = full in flag.negative_names
        name = word.partition("=")[0] if attached is not None else word  # as written
        if attached is not None:
            if not flag.takes_value or negated:
                raise SpecError(f"{name} takes no value but was given {word!r}")
            items.append(ArgItem(flag, (word,), (attached,), name, attached=True))
            continue
        if negated or not flag.takes_value:
            items.append(ArgItem(flag, (word,), (), name, negated=negated))
            continue
        values: list[str] = []
        if schema.style == "llama":
            # llama.cpp takes the next nargs words whatever they look like.
            values = argv[i : i + flag.nargs]
            if len(values) < flag.nargs:
                raise SpecError(f"{name} expects {flag.metavar or 'a value'} but the command ends")
        else:
            limit = len(argv) if flag.variadic else i + max(flag.nargs, 1)
            j = i
            while j < min(limit, len(argv)) and not looks_like_flag(argv[j]):
                j += 1
            values = argv[i:j]
            if len(values) < (0 if flag.optional_value else max(flag.nargs, 1)):
                raise SpecError(f"{name} expects {flag.metavar or 'a value'}")
        i += len(values)
        items.append(ArgItem(flag, (word, *values), tuple(values), name))
    return items


def flag_value(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the first of `names` in argv (`--f v` or `--f=v`), read without a schema:
    for the few flags flagtrial needs before it has one (ports, tensor parallel size)."""
    for i, word in enumerate(argv):
        name, eq, value = word.partition("=")
        if name in names:
            if eq:
                return value
            return argv[i + 1] if i + 1 < len(argv) else None
    return None
