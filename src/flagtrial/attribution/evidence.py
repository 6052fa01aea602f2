"""What is known of an edit without a restart: whether it leaves the server as it is, by the
engine's own --help (a switch added that the known-good already runs, a value set to the one
the known-good already takes). Such an edit can move no fact and no measurement: it is left
out of every search, and is useless by the help's own words."""

from __future__ import annotations

import re

from flagtrial.launch.change import Edit
from flagtrial.launch.helptext import FlagDef
from flagtrial.launch.schema import FlagSchema, parse_argv

_DEFAULT = re.compile(r"\(default:\s*([^,)]+?)\s*[,)]")
_ON, _OFF = "enabled", "disabled"


def help_default(flag: FlagDef) -> str | None:
    """The default the flag's help states (`(default: enabled)`, `(default: -1, -1 = auto)`)."""
    found = _DEFAULT.search(" ".join(flag.help.split()))
    return found.group(1) if found else None


def _effective(flag: FlagDef, argv: list[str], schema: FlagSchema) -> str | None:
    """What the known-good runs the flag's setting at: its last occurrence in argv, else the
    help's default (a switch reads as enabled / disabled)."""
    value = None
    for item in parse_argv(argv, schema):
        if item.flag is not flag:
            continue
        switch = _OFF if item.negated else _ON
        value = item.value if flag.takes_value else switch
    return value if value is not None else help_default(flag)


def inert(edit: Edit, argv: list[str], schema: FlagSchema) -> str | None:
    """Why `edit` cannot change what the known-good (running `argv`) does, or None."""
    if edit.op not in ("add", "set") or not edit.name.startswith("-"):
        return None
    flag = schema.lookup(edit.name)
    asked = edit.value if flag.takes_value else (_OFF if edit.name in flag.negative_names else _ON)
    runs = _effective(flag, argv, schema)
    if asked is None or runs is None or asked != runs:
        return None
    default = help_default(flag)
    source = f"{schema.program} --help: default: {runs}" if runs == default else "its own flags"
    shown = f"{edit.name} {asked}" if flag.takes_value else edit.name
    return f"{shown} is what the known-good already runs ({source})"
