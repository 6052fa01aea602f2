"""The tables the evaluator applies to known values: comparisons (three-valued: None when what
is known does not decide), arithmetic, the builtins and functools helpers it runs, the str
methods it calls."""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from typing import Any

from flagtrial.gates.values import NOT_NONE, PLAIN, UNKNOWN, Builtin, EnumMember, plain

BUILTINS = {
    "isinstance",
    "tuple",
    "list",
    "map",
    "int",
    "str",
    "float",
    "bool",
    "len",
    "any",
    "all",
    "min",
    "max",
    "hasattr",
    "dict",
    "getattr",
    "set",
    "frozenset",
    "sorted",
}
EXTERNAL = {
    "re.match": "re_match",
    "re.fullmatch": "re_fullmatch",
    "re.search": "re_search",
    "functools.partial": "partial",
    "functools.lru_cache": "lru_cache",
    "functools.cache": "lru_cache",
    "functools.wraps": "lru_cache",
    "functools.cached_property": "property",
}
COMPARISONS: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Div: operator.truediv,
}
STR_METHODS = {"split", "startswith", "endswith", "lower", "upper", "strip", "get", "index"}


def call_builtin(f: Builtin, vals: list[Any]) -> Any:
    if f.bound is not None:
        return as_tuple(getattr(f.bound, f.name)(*vals))
    if f.name == "isinstance":
        kinds = vals[1] if isinstance(vals[1], tuple) else (vals[1],)
        types = {"tuple": tuple, "int": int, "str": str, "float": float, "bool": bool}
        if all(isinstance(k, Builtin) and k.name in types for k in kinds):
            return isinstance(vals[0], tuple(types[k.name] for k in kinds))
        return UNKNOWN
    if f.name == "map" and isinstance(vals[0], Builtin):
        conv = {"int": int, "str": str, "float": float}[vals[0].name]
        return tuple(conv(v) for v in vals[1])
    if f.name in ("hasattr", "getattr"):
        return UNKNOWN
    table: dict[str, Callable[..., Any]] = {
        "tuple": tuple,
        "list": tuple,
        "int": int,
        "str": str,
        "float": float,
        "bool": bool,
        "len": len,
        "any": any,
        "all": all,
        "min": min,
        "max": max,
        "set": frozenset,
        "frozenset": frozenset,
        "sorted": lambda x: tuple(sorted(x)),
        "re_match": lambda *a: _found(re.match(*a)),
        "re_fullmatch": lambda *a: _found(re.fullmatch(*a)),
        "re_search": lambda *a: _found(re.search(*a)),
    }
    return table[f.name](*vals)


def _found(match: re.Match[str] | None) -> Any:
    # A match object is not modelled: that there is one is what is known.
    return None if match is None else NOT_NONE


def as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def compare_values(op: ast.cmpop, left: Any, right: Any) -> bool | None:
    """A comparison of two values, None when it is not decided by what is known."""
    if isinstance(op, ast.Is | ast.IsNot):
        if left is UNKNOWN or right is UNKNOWN:
            return None
        if left is NOT_NONE or right is NOT_NONE:
            if right is None or left is None:
                return isinstance(op, ast.IsNot)
            return None
        if isinstance(left, PLAIN) and isinstance(right, PLAIN):
            same = left is right or (left == right and type(left) is type(right))
            return same if isinstance(op, ast.Is) else not same
        if isinstance(left, EnumMember) or isinstance(right, EnumMember):
            same = left == right
            return same if isinstance(op, ast.Is) else not same
        return None
    if isinstance(op, ast.In | ast.NotIn):
        if isinstance(right, tuple | frozenset | dict | str) and left is not UNKNOWN:
            members = tuple(right) if not isinstance(right, str) else None
            if members is not None and any(m is UNKNOWN or m is NOT_NONE for m in members):
                if left in [m for m in members if m is not UNKNOWN]:
                    return isinstance(op, ast.In)
                return None
            try:
                found = left in right
            except TypeError:
                return None
            return found if isinstance(op, ast.In) else not found
        return None
    fn = COMPARISONS.get(type(op))
    if fn is None:
        return None
    if isinstance(left, EnumMember) is not isinstance(right, EnumMember):
        # a str/int enum's member against a plain value compares as its value
        left, right = (x.value if isinstance(x, EnumMember) else x for x in (left, right))
    if isinstance(left, EnumMember) and isinstance(right, EnumMember):
        if isinstance(op, ast.Eq | ast.NotEq):
            return bool(fn(left, right))
        return None
    if not (plain(left) and plain(right)) or left is NOT_NONE or right is NOT_NONE:
        # Only `<some value> == None` is decided.
        if (left is None or right is None) and (left is NOT_NONE or right is NOT_NONE):
            return isinstance(op, ast.NotEq) if isinstance(op, ast.Eq | ast.NotEq) else None
        return None
    try:
        return bool(fn(left, right))
    except TypeError:
        return None
