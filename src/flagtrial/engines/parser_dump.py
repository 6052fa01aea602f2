"""An engine's own argument parser, dumped as a flag table (the format of the sourceread package).

flagtrial runs this very file on the engine's host with the engine's interpreter
(`python -c SOURCE BUILDER`): BUILDER is the engine adapter's code that imports the engine's
parser module and binds `parser` (building it reads no GPU). Every action of that parser
becomes one flag; value types are what the action's `type` callable accepts, tried on
sample words, so helpers such as `optional_type(int)` read as what they take.
Only the standard library is imported here; the engine is imported by BUILDER alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

_KINDS = {
    argparse._StoreAction: "store",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._StoreConstAction: "store_const",
    argparse._AppendAction: "append",
    argparse._CountAction: "count",
}


def _accepts(fn: Any, word: str) -> tuple[bool, Any]:
    try:
        return True, fn(word)
    except Exception:
        return False, None


def value_type(fn: Any) -> str:
    """`int`, `float`, `int_hr` (an integer with a k/m/g suffix), `json` or `str`, by what
    the callable takes: argparse's own conversion, as the engine applies it."""
    if fn is None or fn is str:
        return "str"
    ok_json, as_json = _accepts(fn, "{}")  # JSON, or a config class built from it
    if ok_json and not isinstance(as_json, str | list | tuple):
        return "json"
    if _accepts(fn, "zz")[0] or _accepts(fn, "auto")[0]:
        return "str"  # words (also a number or `auto`: vLLM's human_readable_int_or_auto)
    ok_int, as_int = _accepts(fn, "7")
    if ok_int and isinstance(as_int, int) and not isinstance(as_int, bool):
        return "int_hr" if _accepts(fn, "4k")[0] else "int"
    if ok_int and isinstance(as_int, float):
        return "float"
    return "str"


def _kind(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "boolean_optional"
    for cls, name in _KINDS.items():
        if type(action) is cls:
            return name
    return f"custom:{type(action).__name__}"


def _negative(action: argparse.Action, kind: str, names: list[str]) -> list[str]:
    if kind != "boolean_optional":
        return []
    # BooleanOptionalAction: `--no-x`; vLLM's EnableDisableAction also `--disable-x` for
    # `--enable-x` (and back): the spellings that store False.
    probe = argparse.Namespace()
    negative = []
    for name in names:
        action(argparse.ArgumentParser(), probe, None, name)
        if getattr(probe, action.dest) is False:
            negative.append(name)
    return negative


def flag(action: argparse.Action, deprecated: bool, spellings: list[str]) -> dict[str, Any]:
    """`spellings`: every option string the parser accepts for this action."""
    kind = _kind(action)
    names = spellings or [action.dest]
    choices = action.choices
    spec: dict[str, Any] = {
        "names": names,
        "negative": _negative(action, kind, names),
        "dest": action.dest,
        "action": kind,
        "nargs": 0 if action.nargs == 0 else action.nargs,
        "type": value_type(action.type),
        "choices": None if choices is None else [c for c in choices if c is not None],
        "help": "" if action.help in (None, argparse.SUPPRESS) else str(action.help),
        "default": None if action.default is None else repr(action.default),
        # SGLang's Deprecated*Action keeps its replacement (`new_flag`)
        "deprecated": (getattr(action, "new_flag", None) or "") if deprecated else None,
        "removed": False,
        "settings": [action.dest],
        "where": "",
    }
    if not action.option_strings:
        spec["positional"] = True
    if action.required:
        spec["required"] = True
    return spec


def _deprecated(action: argparse.Action, marked: set[argparse.Action]) -> bool:
    """Python >= 3.13 keeps `deprecated` on the action; vLLM's parser keeps a set before
    that; a flag may also have an action of its own that warns (`Deprecated...Action`)."""
    if action in marked or getattr(action, "deprecated", False) is True:
        return True
    return type(action).__name__.startswith("Deprecated")


def dump(parser: argparse.ArgumentParser) -> dict[str, Any]:
    marked: set[Any] = getattr(parser, "_deprecated", set())
    # vLLM 0.33's EnableDisableAction registers `--no-enable-x` but leaves it out of the
    # action's option strings (hidden from help): what the parser accepts is its table.
    spellings: dict[int, list[str]] = {}
    for option, action in parser._option_string_actions.items():
        spellings.setdefault(id(action), []).append(option)
    flags = [
        flag(a, _deprecated(a, marked), spellings.get(id(a), []))
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction)
    ]
    return {"flags": flags, "resolvers": {}}


def main(argv: list[str]) -> int:
    scope: dict[str, Any] = {}
    try:
        exec(argv[0], scope)
        table = dump(scope["parser"])
    except Exception as e:
        print("\nflagtrial-parser " + json.dumps({"error": f"{type(e).__name__}: {e}"[:500]}))
        return 4
    print("\nflagtrial-parser " + json.dumps(table))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
