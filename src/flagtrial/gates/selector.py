"""vLLM's attention-backend selector: a backend the command names is validated alone.

`Platform.get_attn_backend_cls` (vllm/platforms/cuda.py, 0.30 .. 0.33) checks an explicitly
selected backend with its class's `validate_configuration` and raises ValueError when it
reports any reason, instead of falling back to the priority list. One reason is the class's
`supports_compute_capability(capability)`; where that is a plain expression of the
capability, it is evaluated for the host, and False means the server dies while the model's
attention layers are built. Anything this module cannot read leaves the decision to the
general analysis (it returns None).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flagtrial.gates.compare import COMPARISONS
from flagtrial.gates.index import SourceIndex
from flagtrial.gates.platforms import platform_module
from flagtrial.gates.reader import SourceReader

_UNREAD = object()


def _in(a: Any, b: Any) -> bool:
    return a in b


def _not_in(a: Any, b: Any) -> bool:
    return a not in b


_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    **COMPARISONS,
    ast.In: _in,
    ast.NotIn: _not_in,
}


@dataclass(frozen=True)
class SelectorFailure:
    """Where the selector raises, and the capability check of the backend that fails."""

    raise_fi: int
    raise_line: int
    check_fi: int
    check_line: int
    backend: str
    check: str


def selected_backend_failure(
    index: SourceIndex, reader: SourceReader, platform: str, cap: tuple[int, int], value: str
) -> SelectorFailure | None:
    """The selector's raise for backend `value` on a host of compute capability `cap`, when
    the backend's own capability check is shown False there."""
    raised = _selected_raise(index, reader, platform)
    target = _backend_class(index, reader, value)
    if raised is None or target is None:
        return None
    check = _method(index, reader, target[0], target[1], "supports_compute_capability")
    if check is None:
        return None
    fi, fn = check
    body = [
        s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    params = [a.arg for a in fn.args.args]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or len(params) != 2:
        return None
    ret = body[0]
    if ret.value is None or _eval(ret.value, params[1], cap) is not False:
        return None
    return SelectorFailure(raised[0], raised[1], fi, ret.lineno, value, ast.unparse(ret.value))


def _selected_raise(
    index: SourceIndex, reader: SourceReader, platform: str
) -> tuple[int, int] | None:
    """`if selected_backend is not None: ... validate_configuration(...) ... raise` in the
    host platform's `get_attn_backend_cls`: (file, line of the raise)."""
    module = platform_module(index, platform)
    fi = index.modules.get(module or "", -1)
    if fi < 0:
        return None
    for fn in index.files[fi].funcs:
        if fn.name != "get_attn_backend_cls":
            continue
        for stmt in reader.unit(fi, fn.start, fn.end):
            for node in ast.walk(stmt):
                if not (isinstance(node, ast.If) and _is_selected_test(node.test)):
                    continue
                inner = [n for s in node.body for n in ast.walk(s)]
                validates = any(
                    isinstance(n, ast.Attribute) and n.attr == "validate_configuration"
                    for n in inner
                )
                # the raise on reported reasons, not the one for an import error
                raises = [
                    r.lineno
                    for s in node.body
                    if isinstance(s, ast.If)
                    for r in ast.walk(s)
                    if isinstance(r, ast.Raise)
                ]
                if validates and raises:
                    return fi, raises[0]
    return None


def _is_selected_test(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "selected_backend"
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.IsNot)
    )


def _backend_class(index: SourceIndex, reader: SourceReader, value: str) -> tuple[int, str] | None:
    """The class `AttentionBackendEnum.<VALUE> = "module.Class"` names (file, class name)."""
    for fi, info in enumerate(index.files):
        enum = info.classes.get("AttentionBackendEnum")
        if enum is None:
            continue
        for stmt in reader.unit(fi, enum.start, enum.end):
            if not isinstance(stmt, ast.ClassDef):
                continue
            for item in stmt.body:
                if (
                    isinstance(item, ast.Assign)
                    and isinstance(item.targets[0], ast.Name)
                    and item.targets[0].id == value.upper()
                    and isinstance(item.value, ast.Constant)
                    and isinstance(item.value.value, str)
                ):
                    module, _, cls = item.value.value.rpartition(".")
                    target = index.modules.get(module, -1)
                    if target >= 0 and cls in index.files[target].classes:
                        return target, cls
    return None


def _method(
    index: SourceIndex, reader: SourceReader, fi: int, cls: str, name: str, depth: int = 0
) -> tuple[int, ast.FunctionDef] | None:
    """Method `name` of class `cls` in file `fi`, or of its first base that defines it."""
    info = index.files[fi].classes.get(cls)
    if info is None or depth > 6:
        return None
    if name in info.methods:
        fn = index.files[fi].funcs[info.methods[name]]
        stmts = reader.unit(fi, fn.start, fn.end)
        return (fi, stmts[0]) if stmts and isinstance(stmts[0], ast.FunctionDef) else None
    for base in info.bases:
        last = base.rsplit(".", 1)[-1]
        found = _base_file(index, fi, last)
        if found is not None:
            hit = _method(index, reader, found, last, name, depth + 1)
            if hit is not None:
                return hit
    return None


def _base_file(index: SourceIndex, fi: int, name: str) -> int | None:
    if name in index.files[fi].classes:
        return fi
    target = index.files[fi].imports.get(name, "")
    module, _, attr = target.partition(":")
    other = index.modules.get(module, -1)
    if other >= 0 and (attr or name) in index.files[other].classes:
        return other
    return None


def _eval(node: ast.expr, param: str, cap: tuple[int, int]) -> Any:
    """A capability check's value: `capability.major in [9, 10]`, `capability.to_int() >=
    80`, `capability >= DeviceCapability(8, 0)`; _UNREAD for anything else."""
    match node:
        case ast.Constant(value=v):
            return v
        case ast.Name(id=n) if n == param:
            return cap
        case ast.Attribute(value=ast.Name(id=n), attr="major" | "minor" as a) if n == param:
            return cap[0] if a == "major" else cap[1]
        case ast.Call(func=ast.Attribute(value=ast.Name(id=n), attr="to_int"), args=[]) if (
            n == param
        ):
            return cap[0] * 10 + cap[1]
        case ast.Call(func=ast.Name(id="DeviceCapability"), args=[a, b], keywords=[]):
            major, minor = _eval(a, param, cap), _eval(b, param, cap)
            return (major, minor) if isinstance(major, int) and isinstance(minor, int) else _UNREAD
        case ast.List(elts=elts) | ast.Tuple(elts=elts) | ast.Set(elts=elts):
            items = [_eval(e, param, cap) for e in elts]
            return _UNREAD if _UNREAD in items else tuple(items)
        case ast.UnaryOp(op=ast.Not(), operand=x):
            v = _eval(x, param, cap)
            return _UNREAD if v is _UNREAD else not v
        case ast.BoolOp(op=op, values=values):
            vals = [_eval(v, param, cap) for v in values]
            if _UNREAD in vals:
                return _UNREAD
            return all(vals) if isinstance(op, ast.And) else any(vals)
        case ast.Compare(left=left, ops=ops, comparators=rest):
            a = _eval(left, param, cap)
            for cmp, right in zip(ops, rest, strict=True):
                b = _eval(right, param, cap)
                fn = _COMPARE.get(type(cmp))
                if a is _UNREAD or b is _UNREAD or fn is None:
                    return _UNREAD
                try:
                    if not fn(a, b):
                        return False
                except TypeError:
                    return _UNREAD
                a = b
            return True
    return _UNREAD
