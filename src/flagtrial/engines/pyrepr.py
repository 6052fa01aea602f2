"""Settings from the Python reprs engines log: `{'tp_size': 4, ...}`, `ServerArgs(tp_size=4,
...)`, `model='m', max_seq_len=4096, ...`.

Values that are Python literals become scalars; anything else (a nested record, an enum, a
`torch.dtype`) is kept as its text, which is stable between two starts and diffs cleanly.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from flagtrial.facts import Scalar

_CLOSE = {"(": ")", "[": "]", "{": "}"}
_CALL = re.compile(r"[A-Za-z_][\w.]*\(")


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split at `sep` outside brackets and string literals."""
    parts: list[str] = []
    depth: list[str] = []
    quote: str | None = None
    start = i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in _CLOSE:
            depth.append(_CLOSE[c])
        elif depth and c == depth[-1]:
            depth.pop()
        elif c == sep and not depth:
            parts.append(text[start:i].strip())
            start = i + 1
        i += 1
    tail = text[start:].strip()
    if tail:
        parts.append(tail)
    return parts


def scalar(text: str) -> Scalar:
    """A literal's value when it is a scalar; lists and dicts as compact JSON; else the text."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    if value is None or isinstance(value, str | int | float | bool):
        return value
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return text


def parse_kwargs(text: str) -> dict[str, Scalar]:
    """`a=1, b='x', c=Foo(d=2)` -> {"a": 1, "b": "x", "c": "Foo(d=2)"}."""
    out: dict[str, Scalar] = {}
    for part in split_top(text):
        key, eq, value = part.partition("=")
        if eq and key.strip().isidentifier():
            out[key.strip()] = scalar(value.strip())
    return out


def parse_dict(text: str) -> dict[str, Scalar]:
    """`{'a': 1, 'b': None}` -> {"a": 1, "b": None}, tolerating non-literal values."""
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    out: dict[str, Scalar] = {}
    for part in split_top(body):
        key, colon, value = part.partition(":")
        name = scalar(key.strip())
        if colon and isinstance(name, str):
            out[name] = scalar(value.strip())
    return out


def parse_repr(text: str) -> dict[str, Scalar]:
    """A dict repr, a `Name(k=v, ...)` record repr, or bare `k=v, ...` pairs."""
    body = text.strip()
    if body.startswith("{"):
        return parse_dict(body)
    if (m := _CALL.match(body)) and body.endswith(")"):
        return parse_kwargs(body[m.end() : -1])
    return parse_kwargs(body)


def flatten(body: dict[str, Any], prefix: str = "") -> dict[str, Scalar]:
    """A resolved record (JSON) as settings: nested records become dotted keys, a list its
    repr's scalar."""
    out: dict[str, Scalar] = {}
    for key, value in body.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, list):
            out[name] = scalar(repr(value))
        else:
            out[name] = value
    return out
