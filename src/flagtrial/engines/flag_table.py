"""A Python engine's flag table (read from its source by `sourceread`) as a FlagSchema.

`EngineSchema` is the FlagSchema that `apply_change` checks edits against, plus what argparse
itself would say at start: the engine and version in every error, flags an older version had
and this one removed, deprecated flags and their replacements, and value types checked by
a real `argparse.ArgumentParser` built from the same table (`check_argv`).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from typing import Any

from flagtrial.errors import ChangeError, UnknownFlagError
from flagtrial.launch.helptext import FlagDef
from flagtrial.launch.schema import FlagSchema
from flagtrial.launch.spec import LaunchSpec
from flagtrial.sourceread.flags import canonical

_HUMAN_INT = re.compile(r"-?\d+(\.\d+)?[kKmMgGtT]?")


def _human_int(text: str) -> str:
    """`human_readable_int` accepts `4096`, `4k`, `1.5M`."""
    if not _HUMAN_INT.fullmatch(text):
        raise ValueError(text)
    return text


_TYPES: dict[str, Any] = {"int": int, "float": float, "int_hr": _human_int}


def _flag_def(spec: dict[str, Any]) -> FlagDef:
    nargs = spec["nargs"]
    takes_value = nargs != 0
    negative = tuple(spec["negative"])
    choices = spec["choices"]
    return FlagDef(
        names=tuple(spec["names"]),
        canonical=canonical(spec),
        takes_value=takes_value,
        optional_value=nargs in ("?", "*"),
        choices=tuple(str(c) for c in choices) if choices is not None else None,
        metavar=spec["dest"].upper() if takes_value else None,
        help=spec["help"],
        negative_names=negative,
        nargs=nargs if isinstance(nargs, int) else int(takes_value),
        variadic=nargs in ("+", "*"),
        repeatable=spec["action"] in ("append", "extend", "count"),
    )


class _ArgvError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print and exit
        raise _ArgvError(message)


class _Switch(argparse.Action):
    """A switch with negative spellings (BooleanOptionalAction, vLLM's EnableDisableAction)."""

    def __init__(self, option_strings: list[str], dest: str, negative: list[str], **kw: Any):
        self.negative = set(negative)
        super().__init__(option_strings, dest, nargs=0, **kw)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, option_string not in self.negative)


def build_parser(
    flags: list[dict[str, Any]], parser: argparse.ArgumentParser
) -> argparse.ArgumentParser:
    """Add every flag of the table to a real argparse parser: argparse's own prefix matching,
    ambiguity, type and choice errors, exactly as the engine's parser reports them."""
    for spec in flags:
        kw: dict[str, Any] = {"dest": spec["dest"], "help": argparse.SUPPRESS}
        nargs, action = spec["nargs"], spec["action"]
        if spec.get("positional"):
            parser.add_argument(spec["dest"], nargs=nargs or "?", help=argparse.SUPPRESS)
            continue
        if nargs == 0:
            negative = spec["names"] if action == "store_false" else spec["negative"]
            parser.add_argument(*spec["names"], action=_Switch, negative=negative, **kw)
            continue
        if nargs is not None:
            kw["nargs"] = nargs
        if spec.get("required"):
            kw["required"] = True
        if action == "append":
            kw["action"] = "append"
        kind = _TYPES.get(spec["type"])
        if kind is not None:
            kw["type"] = kind
        if spec["choices"] is not None:
            # Values arrive as words; compare them as the words argparse would convert.
            kw["choices"] = [
                kind(c) if kind and kind is not _human_int else str(c) for c in spec["choices"]
            ]
            kw.setdefault("type", str)
        parser.add_argument(*spec["names"], **kw)
    return parser


@dataclass(frozen=True)
class EngineSchema(FlagSchema):
    """The flag schema of one engine version. `removed` maps a flag this version rejects to
    the older version whose table had it; `underscores` accepts `--a_b` for `--a-b` and
    `dotted` accepts `--json-flag.key` for `--json-flag` (vLLM's FlexibleArgumentParser)."""

    engine: str = ""
    version: str = ""
    table: tuple[dict[str, Any], ...] = ()
    resolvers: dict[str, list[str]] = field(default_factory=dict)
    removed: dict[str, str] = field(default_factory=dict)
    underscores: bool = False
    dotted: bool = False

    @classmethod
    def from_table(
        cls,
        engine: str,
        version: str,
        table: dict[str, Any],
        removed: dict[str, str],
        underscores: bool = False,
        dotted: bool = False,
    ) -> EngineSchema:
        flags = [s for s in table["flags"] if not s.get("positional")]
        return cls(
            program=f"{engine} {version}",
            style="argparse",
            flags=tuple(_flag_def(s) for s in flags),
            help_text="",
            engine=engine,
            version=version,
            table=tuple(table["flags"]),
            resolvers=dict(table.get("resolvers") or {}),
            removed=removed,
            underscores=underscores,
            dotted=dotted,
        )

    def _normalise(self, token: str) -> str:
        name, eq, value = token.partition("=")
        if not name.startswith("--"):
            return token
        if self.dotted and "." in name:
            name = name.split(".", 1)[0]
        if self.underscores:
            name = name.replace("_", "-")
        return name + eq + value

    def resolve(self, token: str) -> tuple[FlagDef, str, str | None]:
        token = self._normalise(token)
        name = token.partition("=")[0]
        if name in self.removed and name not in self.names:
            raise UnknownFlagError(
                f"{self.program} removed {name} ({self.removed[name]} had it)"
                + self._now_prefix_of(name)
            )
        spec = self.spec(name)
        if spec is not None and spec["removed"]:
            raise UnknownFlagError(f"{self.program} removed {name}: {spec['help']}")
        return super().resolve(token)

    def _now_prefix_of(self, name: str) -> str:
        longer = sorted(n for n in self.names if n.startswith(name))
        return f"; as a prefix it now names {', '.join(longer)}" if longer else ""

    def spec(self, name: str) -> dict[str, Any] | None:
        """The table entry of a flag spelled exactly `name`."""
        return next((s for s in self.table if name in s["names"]), None)

    def deprecation(self, name: str) -> str | None:
        """`--x is deprecated in sglang 0.5.23; use --y` for a deprecated flag, else None."""
        spec = self.spec(self.lookup(name).canonical)
        if spec is None or spec["deprecated"] is None:
            return None
        use = f"; use {spec['deprecated']}" if spec["deprecated"] else ""
        return f"{name} is deprecated in {self.program}{use}"

    def settings_for(self, canonical: str) -> set[str]:
        """Resolved-settings keys a flag sets; a deprecated flag also names its replacement's."""
        spec = self.spec(canonical)
        if spec is None:
            return set()
        keys = set(spec["settings"])
        if spec["deprecated"]:
            replacement = spec["deprecated"].split("=", 1)[0]
            other = self.spec(replacement)
            if other is not None:
                keys |= set(other["settings"])
        return keys

    def check_argv(self, args: list[str]) -> list[str]:
        """Parse the engine's arguments (after the program words) as the engine's argparse
        would; raises ChangeError naming the version; returns deprecation notes."""
        words = [self._normalise(w) if w.startswith("--") else w for w in args]
        for word in words:
            if word.startswith("--"):
                self.resolve(word)  # removed flags first: their message names the version
        try:
            parser = _Parser(prog=self.program, add_help=False, allow_abbrev=True)
            build_parser(list(self.table), parser).parse_args(words)
        except _ArgvError as e:
            raise ChangeError(f"{self.program} rejects the command line: {e}") from None
        notes = []
        for word in words:
            if word.startswith("-") and len(word) > 1 and not word[1].isdigit():
                note = self.deprecation(word.partition("=")[0])
                if note:
                    notes.append(note)
        return list(dict.fromkeys(notes))


def check_candidate(schema: FlagSchema, candidate: LaunchSpec) -> list[str]:
    """Preflight of a whole candidate command line against an engine's own parser (types,
    required flags, removed flags); deprecation notes to show. Schemas read from `--help`
    (llama.cpp) have no parser to run: nothing to add."""
    if not isinstance(schema, EngineSchema):
        return []
    return schema.check_argv(candidate.argv[candidate.program_words :])
