"""The flags an engine's `--help` text declares (FlagDef), in llama.cpp's format or in
Python argparse's (see schema.py for how the two differ): names and their negative
spellings, metavars, choices, the env var, and how llama-server reads a value.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from flagtrial.errors import SpecError

HelpStyle = Literal["llama", "argparse"]
# How llama.cpp reads a value (see values.value_problem): std::stoi, std::stof, either of the two
# (an `N` whose help shows no default), or a toggle word.
ValueKind = Literal["int", "float", "number", "toggle"]

_NAME = re.compile(r"-{1,2}[A-Za-z0-9][\w.\-]*")
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


def parse_flags(help_text: str, style: HelpStyle) -> list[FlagDef]:
    return _parse_llama(help_text) if style == "llama" else _parse_argparse(help_text)
