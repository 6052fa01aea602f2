"""An engine's flags, read from its own `--help` text (helptext.py), and argv parsed against them.

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
from dataclasses import dataclass, field
from pathlib import PurePath

from flagtrial.errors import SpecError, UnknownFlagError
from flagtrial.launch.helptext import FlagDef, HelpStyle, detect_style, parse_flags

_NUMBER = re.compile(r"-\d+(\.\d*)?([eE][-+]?\d+)?|-\.\d+")


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
        flags = parse_flags(help_text, style)
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
