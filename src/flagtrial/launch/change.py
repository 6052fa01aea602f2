"""A change to a launch spec: flag and environment edits, validated against the engine's flags.

Values in edits are literal: what the server process must receive. apply_change turns them
into systemd words (`%` -> `%%`, `$` -> `$$` in arguments, `%` -> `%%` in Environment=), so a
value such as `$(touch /tmp/x)` or `50%` reaches the process verbatim and nothing in it is
ever expanded.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from flagtrial.errors import ChangeError, SpecError, UnknownFlagError
from flagtrial.launch.execwords import (
    env_name_is_valid,
    literal_env_value,
    literal_word,
    resolve_specifiers,
    unliteral_word,
)
from flagtrial.launch.helptext import FlagDef
from flagtrial.launch.schema import ArgItem, FlagSchema, parse_argv
from flagtrial.launch.spec import LaunchSpec
from flagtrial.launch.values import value_problem

EditOp = Literal["add", "remove", "set", "setenv", "unsetenv"]

_FLAG_OPS = ("add", "remove", "set")


class Edit(BaseModel):
    """One edit. name is a flag as typed (any alias) or an environment variable name."""

    model_config = ConfigDict(frozen=True)

    op: EditOp
    name: str
    value: str | None = None


def _split_flag(item: str) -> tuple[str, str | None]:
    """`--parallel=4`, `--parallel 4`, `-np 4` or `--cont-batching` -> (name, value)."""
    m = re.fullmatch(r"\s*(-[^\s=]+)(?:=(.*)|\s+(.*))?", item, re.S)
    if not m or m.group(1).strip("-") == "":
        raise ChangeError(f"not a flag: {item!r} (flags start with - or --)")
    # After `=` the value is taken verbatim; after a space, from its first non-space.
    return m.group(1), m.group(2) if m.group(2) is not None else m.group(3)


def _shown(word: str) -> str:
    """An argument word for display: the literal it stands for when it has one."""
    literal = unliteral_word(word)
    return word if literal is None else literal


def _shown_env(value: str) -> str:
    """An Environment= value for display: specifiers resolved where that needs no unit."""
    try:
        return resolve_specifiers(value)
    except SpecError:
        return value


class Change(BaseModel):
    """An ordered list of edits (JSON round-trips with model_dump_json/model_validate_json)."""

    model_config = ConfigDict(frozen=True)

    edits: list[Edit]

    @classmethod
    def from_cli(
        cls,
        add: Sequence[str] = (),
        set_: Sequence[str] = (),
        remove: Sequence[str] = (),
        env: Sequence[str] = (),
        unset_env: Sequence[str] = (),
    ) -> Change:
        """Edits in the order remove, set, add, env, unset-env, so that removing
        `--no-cont-batching` and adding `--cont-batching` in one change works."""
        edits: list[Edit] = []
        for item in remove:
            name, value = _split_flag(item)
            if value is not None:
                raise ChangeError(f"remove takes a flag name only, not {item!r}")
            edits.append(Edit(op="remove", name=name))
        for item in set_:
            name, value = _split_flag(item)
            if value is None:
                raise ChangeError(f"set needs a value: {item!r} (write {name}=VALUE)")
            edits.append(Edit(op="set", name=name, value=value))
        for item in add:
            name, value = _split_flag(item)
            edits.append(Edit(op="add", name=name, value=value))
        for item in env:
            name, eq, value = item.partition("=")
            if not eq or not env_name_is_valid(name):
                raise ChangeError(f"not an environment assignment: {item!r} (write NAME=VALUE)")
            edits.append(Edit(op="setenv", name=name, value=value))
        for name in unset_env:
            if not env_name_is_valid(name):
                raise ChangeError(f"not an environment variable name: {name!r}")
            edits.append(Edit(op="unsetenv", name=name))
        return cls(edits=edits)

    def describe(self, spec: LaunchSpec | None = None, schema: FlagSchema | None = None) -> str:
        """One line per edit: `+ --cont-batching`, `~ --parallel 8 -> -1`, `- --mlock`,
        `env + OMP_NUM_THREADS=1`. Old values are shown when spec and schema are given."""
        items = _items(spec, schema) if spec and schema else []
        env = spec.env if spec else {}
        lines: list[str] = []
        for e in self.edits:
            if e.op == "add":
                lines.append(f"+ {e.name}" + (f" {e.value}" if e.value is not None else ""))
            elif e.op == "remove":
                lines.append(f"- {e.name}")
            elif e.op == "set":
                old = [it.value for it in items if it.flag is _known(schema, e.name)]
                was = f"{_shown(old[-1])} -> " if old and old[-1] is not None else ""
                lines.append(f"~ {e.name} {was}{e.value}")
            elif e.op == "setenv":
                if e.name in env:
                    lines.append(f"env ~ {e.name} {_shown_env(env[e.name])} -> {e.value}")
                else:
                    lines.append(f"env + {e.name}={e.value}")
            else:
                lines.append(f"env - {e.name}")
        return "\n".join(lines)


def _known(schema: FlagSchema | None, name: str) -> FlagDef | None:
    """The flag, or None where it cannot be known: describe() must not fail on a typo."""
    try:
        return schema.lookup(name) if schema else None
    except UnknownFlagError:
        return None


def _items(spec: LaunchSpec, schema: FlagSchema) -> list[ArgItem]:
    return parse_argv(spec.argv[spec.program_words - 1 :], schema)


def _check_value(flag: FlagDef, name: str, value: str | None) -> list[str]:
    """The literal values an edit gives flag, validated; [] for a switch."""
    negated = name in flag.negative_names
    if not flag.takes_value or negated:
        if value is not None:
            raise ChangeError(f"{name} takes no value (given {value!r})")
        return []
    if value is None:
        if flag.optional_value:
            return []
        raise ChangeError(f"{name} needs a value ({flag.metavar or 'VALUE'})")
    values = value.split() if flag.nargs > 1 or flag.variadic else [value]
    if not flag.variadic and len(values) != max(flag.nargs, 1):
        raise ChangeError(f"{name} takes {flag.nargs} values ({flag.metavar}), given {value!r}")
    if flag.choices is not None:
        for v in values:
            if v not in flag.choices:
                raise ChangeError(f"{name} {v}: not one of {', '.join(flag.choices)}")
    problem = value_problem(flag, name, value)
    if problem is not None:
        raise ChangeError(problem)
    return values


def checkable_args(change: Change, schema: FlagSchema) -> list[str]:
    """The added and set flags whose values have a known kind or choice list, as arguments for
    the engine's own parser (free-text values such as paths are left out)."""
    args: list[str] = []
    for e in change.edits:
        if e.op in ("add", "set") and e.value is not None:
            flag = schema.lookup(e.name)
            if flag.kind is not None or flag.choices is not None:
                args += [e.name, *_check_value(flag, e.name, e.value)]
    return args


def _flag_words(schema: FlagSchema, name: str, values: list[str]) -> tuple[str, ...]:
    words = [literal_word(v) for v in values]
    # argparse would read a value starting with "-" as a flag unless it is attached.
    if schema.accepts_equals and len(words) == 1 and words[0].startswith("-"):
        return (f"{name}={words[0]}",)
    return (name, *words)


def _spelling(schema: FlagSchema, name: str) -> tuple[FlagDef, str]:
    """The flag and the exact spelling to write: the one given, unless it is an abbreviation."""
    flag, full, attached = schema.resolve(name)
    if attached is not None:
        raise ChangeError(f"give the value separately from the flag name: {name!r}")
    return flag, full


def apply_change(spec: LaunchSpec, change: Change, schema: FlagSchema) -> LaunchSpec:
    """The spec with change applied, every flag checked against schema.

    add appends (a flag already present under any spelling is an error unless the engine
    accumulates repeats, argparse `append`); set rewrites the value where the flag is,
    keeping how it was written (`-np 4`, `--x=v`), or appends `canonical value`; remove
    deletes every occurrence under any spelling, negative ones included (an error when there
    is none). Unknown flags raise UnknownFlagError naming close matches.
    """
    head = spec.program_words - 1
    items = _items(spec, schema)
    env_set: dict[str, str] = {}
    env_unset: set[str] = set()
    env = spec.env
    edited: dict[object, Edit] = {}  # flag or variable -> its last edit so far
    for e in change.edits:
        key: object = _spelling(schema, e.name)[0] if e.op in _FLAG_OPS else ("env", e.name)
        if (before := edited.get(key)) is not None and not _may_follow(before, e, key):
            # Which of the two would win is an accident of order: say so instead.
            raise ChangeError(
                f"{e.name} is edited twice in this change ({Change(edits=[before]).describe()}, "
                f"then {Change(edits=[e]).describe()}): give one edit per flag or variable"
            )
        edited[key] = e
        if e.op in _FLAG_OPS:
            items = _apply_flag_edit(items, e, schema)
        elif e.op == "setenv":
            assert e.value is not None
            env_set[e.name] = literal_env_value(e.value)
            env_unset.discard(e.name)
        else:
            if e.name not in env and e.name not in env_set:
                raise ChangeError(f"environment variable {e.name} is not set")
            env_set.pop(e.name, None)
            if e.name in env:
                env_unset.add(e.name)
    argv = spec.argv[:head] + [w for it in items for w in it.words]
    result = spec.with_argv(argv)
    if env_set or env_unset:
        result = result.with_env(env_set, env_unset)
    return result


def _may_follow(before: Edit, after: Edit, key: object) -> bool:
    """Two edits of one flag that say one thing: a remove and then its replacement (a switch
    flipped, `--remove --no-x --add --x`), or another value of a flag the engine repeats."""
    if before.op == "remove" and after.op in ("add", "set"):
        return True
    return after.op == "add" and isinstance(key, FlagDef) and key.repeatable


def _apply_flag_edit(items: list[ArgItem], e: Edit, schema: FlagSchema) -> list[ArgItem]:
    flag, name = _spelling(schema, e.name)
    present = [k for k, it in enumerate(items) if it.flag is flag]
    if e.op == "remove":
        if e.value is not None:
            raise ChangeError(f"remove takes a flag name only ({e.name} {e.value!r})")
        if not present:
            raise ChangeError(f"{e.name} is not on the command line")
        return [it for k, it in enumerate(items) if k not in present]

    values = _check_value(flag, name, e.value)
    if e.op == "add":
        if present and not flag.repeatable:
            # The engine would take only the last of the two: that is a set, and says so.
            there = " ".join(_shown(w) for w in items[present[0]].words)
            hint = f"; use --set {name}=VALUE to change it" if flag.takes_value else ""
            raise ChangeError(f"{e.name} is already on the command line (as {there}){hint}")
        words = _flag_words(schema, name, values)
        return [*items, ArgItem(flag, words, tuple(literal_word(v) for v in values), name)]

    # set
    if not flag.takes_value or name in flag.negative_names:
        raise ChangeError(f"{e.name} takes no value; use add or remove")
    if not values:
        raise ChangeError(f"set needs a value for {e.name}")
    if len(present) > 1:
        raise ChangeError(
            f"{e.name} appears {len(present)} times; remove it and add the values wanted"
        )
    new_values = tuple(literal_word(v) for v in values)
    if not present:
        words = _flag_words(schema, flag.canonical, values)
        return [*items, ArgItem(flag, words, new_values, flag.canonical)]
    k = present[0]
    used = items[k].name or flag.canonical
    kept: tuple[str, ...]
    if items[k].attached and len(new_values) == 1:
        kept = (f"{used}={new_values[0]}",)
    else:
        kept = _flag_words(schema, used, values)
    new = ArgItem(flag, kept, new_values, used, attached=len(kept) == 1 and bool(new_values))
    return [*items[:k], new, *items[k + 1 :]]


def check_listen_address(
    spec: LaunchSpec,
    candidate: LaunchSpec,
    schema: FlagSchema,
    endpoint: str,
    default_port: int | None,
) -> None:
    """Refuse a candidate that listens on another port or address than the spec: flagtrial
    measures at the project's endpoint, and a server moved off it would only look dead."""
    port = str(default_port) if default_port is not None else None
    for canonical, default in (("--port", port), ("--host", None)):
        try:
            flag = schema.lookup(canonical)
        except UnknownFlagError:
            continue
        before = last_value(spec, schema, flag) or default
        given = last_value(candidate, schema, flag)
        if before != (given or default):
            shown = f"{canonical} {given}" if given is not None else f"removing {canonical}"
            if given is None and default is not None:
                shown += f" (the engine's default is {default})"
            raise ChangeError(
                f"{shown} would move the server off the endpoint {endpoint} "
                f"(it listens with {canonical} {before} now); change where it listens and the "
                "project's endpoint together, outside a trial"
            )


def last_value(spec: LaunchSpec, schema: FlagSchema, flag: FlagDef) -> str | None:
    """The value the engine uses for flag (the last occurrence wins), as a literal."""
    values = [it.value for it in _items(spec, schema) if it.flag is flag]
    return _shown(values[-1]) if values and values[-1] is not None else None


def names_touched(change: Change, schema: FlagSchema) -> set[str]:
    """Canonical names of the flags the change names (environment edits excluded)."""
    return {schema.lookup(e.name).canonical for e in change.edits if e.op in _FLAG_OPS}
