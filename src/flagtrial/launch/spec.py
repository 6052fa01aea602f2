"""The launch spec: a server's command line held in a systemd unit (or drop-in) or a command file.

The text is read as systemd reads it (lexer.py for lines and directives, reader.py for what
they mean) and edited losslessly (render.py): every physical line an edit does not touch
keeps its exact bytes, and an edit re-renders only the lines holding the words it changes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from pathlib import PurePath
from typing import Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr, model_validator

from flagtrial.errors import SpecError
from flagtrial.launch.execwords import env_name_is_valid, quote_word
from flagtrial.launch.reader import EnvAssign, Parsed, read_command, read_unit
from flagtrial.launch.render import WordEdits, argv_edits, assemble, render_directive

SpecKind = Literal["unit", "command"]


# A spec's text holds the file's exact bytes: UTF-8, any undecodable byte kept as a surrogate
# escape, no newline translation. Every read, write, hash and ledger copy goes through these.
def encode_spec(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def decode_spec(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def printable(text: str) -> str:
    """Spec text for a terminal, whatever its encoding: a non-UTF-8 byte shown as \\xNN."""
    return encode_spec(text).decode("utf-8", "backslashreplace")


def spec_sha256(text: str) -> str:
    """The one hash of spec text: of its exact bytes."""
    return hashlib.sha256(encode_spec(text)).hexdigest()


def byte_difference(expected: str, actual: str) -> str | None:
    """Where two spec texts first differ as bytes, for a message; None when identical."""
    a, b = encode_spec(expected), encode_spec(actual)
    if a == b:
        return None
    at = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    return (
        f"the spec's bytes differ at byte {at} of {len(a)}: "
        f"expected {a[at : at + 12]!r}, found {b[at : at + 12]!r}"
    )


# ---------------------------------------------------------------------------- the model


class LaunchSpec(BaseModel):
    """A server's launch command as written in a unit file, drop-in or command file.

    Only `kind`, `text` and `dropin` are stored; everything else is derived from the text,
    which stays the single source of truth (and what gets hashed, stored and deployed).
    Words (argv, env values) are systemd words: quotes and escapes removed, specifiers
    and `$` references as written (see execwords).
    """

    model_config = ConfigDict(frozen=True)

    kind: SpecKind
    text: str
    dropin: bool = False

    _parsed: Parsed = PrivateAttr()

    @model_validator(mode="after")
    def _parse(self) -> LaunchSpec:
        if self.kind == "command" and self.dropin:
            raise SpecError("a command file cannot be a drop-in")
        self._parsed = (
            read_unit(self.text, dropin=self.dropin)
            if self.kind == "unit"
            else read_command(self.text)
        )
        return self

    @property
    def argv(self) -> list[str]:
        """The command's words, prefix characters stripped; [] for a drop-in without ExecStart=."""
        return list(self._parsed.argv)

    @property
    def prefix(self) -> str:
        """ExecStart='s special prefix characters (`-@:+!`), "" when none."""
        return self._parsed.prefix

    @property
    def program_words(self) -> int:
        """How many leading argv words come before the engine's own arguments.

        1 for a plain program; one more with the `@` prefix (path, then argv[0]); two more
        for `python -m module` (how SGLang and vLLM servers are usually started).
        """
        argv = self._parsed.argv
        n = 2 if "@" in self._parsed.prefix else 1
        if re.fullmatch(r"python[0-9.]*", PurePath(argv[0]).name if argv else "") and (
            argv[n : n + 1] == ["-m"] and len(argv) > n + 1
        ):
            n += 2
        return n

    @property
    def program(self) -> list[str]:
        """The words that start the engine, runnable as a command (`@`'s argv[0] dropped)."""
        words = self.argv[: self.program_words]
        return [words[0], *words[2:]] if "@" in self.prefix else words

    @property
    def env(self) -> dict[str, str]:
        """Environment= assignments (or a command's leading NAME=value words), later wins."""
        return dict(self._parsed.env)

    @property
    def environment_files(self) -> list[str]:
        """EnvironmentFile= values as written; a leading `-` marks an optional file."""
        return list(self._parsed.environment_files)

    def _derive(self, text: str) -> LaunchSpec:
        return LaunchSpec(kind=self.kind, text=text, dropin=self.dropin)

    def with_argv(self, new_argv: list[str]) -> LaunchSpec:
        """This spec with the command's words replaced, re-rendering only the lines that change."""
        p = self._parsed
        if p.exec_index is None:
            raise SpecError("the drop-in has no ExecStart= to edit")
        if not new_argv:
            raise SpecError("the new command is empty")
        if new_argv == p.argv:
            return self
        d = p.directives[p.exec_index]
        old = [w.text for w in p.words[p.env_words :]]
        new = [p.prefix + new_argv[0], *new_argv[1:]]
        edits = argv_edits(old, new, p.env_words)
        replaced = render_directive(p.lines, d, p.words, edits)
        spec = self._derive(assemble(p.lines, replaced, {}))
        if spec.argv != new_argv:
            raise SpecError(f"rendering the command changed it: {spec.argv!r} != {new_argv!r}")
        return spec

    def with_env(self, set: Mapping[str, str], unset: Iterable[str] = ()) -> LaunchSpec:
        """This spec with environment variables set or removed.

        Values are words as Environment= holds them (`%%` for a literal `%`; see
        execwords.literal_env_value).

        A set variable is rewritten where it is defined, or appended as a new
        `Environment="K=V"` line after the last Environment= (else after ExecStart=) in a
        unit, or as a NAME=value word before a command's program.
        """
        unset = frozenset(unset)
        for name in [*set, *unset]:
            if not env_name_is_valid(name):
                raise SpecError(f"invalid environment variable name {name!r}")
        both = unset & frozenset(set)
        if both:
            raise SpecError(f"{sorted(both)[0]} is both set and unset")
        if all(self._parsed.env.get(k) == v for k, v in set.items()) and not (
            unset & self._parsed.env.keys()
        ):
            return self
        p = self._parsed
        text = (
            self._with_env_command(set, unset)
            if self.kind == "command"
            else self._with_env_unit(set, unset)
        )
        spec = self._derive(text)
        want = {k: v for k, v in {**p.env, **set}.items() if k not in unset}
        if spec.env != want or spec.argv != p.argv:
            raise SpecError("rendering the environment changed something else")
        return spec

    def _with_env_command(self, set: Mapping[str, str], unset: frozenset[str]) -> str:
        p = self._parsed
        d = p.directives[0]
        edits = WordEdits()
        last = {a.name: a.word for a in p.env_live}
        for a in p.env_live:
            if a.name in unset:
                edits.delete.add(a.word)
        for name, value in set.items():
            source = quote_word(f"{name}={value}")
            if name in last:
                edits.replace[last[name]] = source
            elif p.env_words:
                edits.after.setdefault(p.env_words - 1, []).append(source)
            else:
                edits.before_first.append(source)
        return assemble(p.lines, render_directive(p.lines, d, p.words, edits), {})

    def _with_env_unit(self, set: Mapping[str, str], unset: frozenset[str]) -> str:
        p = self._parsed
        per_directive: dict[int, WordEdits] = {}

        def edits_for(a: EnvAssign) -> WordEdits:
            return per_directive.setdefault(a.directive, WordEdits(drop_if_empty=True))

        last: dict[str, EnvAssign] = {a.name: a for a in p.env_live}
        for a in p.env_live:
            if a.name in unset:
                edits_for(a).delete.add(a.word)
        new_lines: list[str] = []
        for name, value in set.items():
            source = quote_word(f"{name}={value}", always=True)
            if name in last:
                edits_for(last[name]).replace[last[name].word] = source
            else:
                new_lines.append(f"Environment={source}")
        replaced: dict[int, list[str]] = {}
        for di, edits in per_directive.items():
            d = p.directives[di]
            words = d.words(exec_rules=False, relax_escapes=False)
            replaced.update(render_directive(p.lines, d, words, edits))
        appended = {self._env_anchor(): new_lines} if new_lines else {}
        return assemble(p.lines, replaced, appended)

    def _env_anchor(self) -> int:
        """The physical line new Environment= lines go after."""
        p = self._parsed
        if p.env_directives:
            return p.directives[p.env_directives[-1]].lines[-1]
        if p.exec_index is not None:
            return p.directives[p.exec_index].lines[-1]
        assert p.service_header is not None  # a unit always has [Service] once parsed
        return p.service_header


def parse_unit(text: str, *, dropin: bool = False) -> LaunchSpec:
    """A unit file (or, with dropin=True, a drop-in that may lack ExecStart=)."""
    return LaunchSpec(kind="unit", text=text, dropin=dropin)


def parse_command(text: str) -> LaunchSpec:
    """A command file: one command over one or more lines, systemd word rules, no shell."""
    return LaunchSpec(kind="command", text=text)


def parse(text: str, kind: SpecKind) -> LaunchSpec:
    return LaunchSpec(kind=kind, text=text)
