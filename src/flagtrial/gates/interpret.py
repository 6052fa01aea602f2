"""Interpreting a helper's body over known values: its parameters bound (arguments,
`functools.partial` keywords, defaults), its statements run in order, a branch taken where
its test is decided, both compared where it is not; the result or UNKNOWN."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

from flagtrial.gates.definitions import bind_import
from flagtrial.gates.values import (
    UNKNOWN,
    ClassRef,
    FuncRef,
    Scope,
    Trace,
    Val,
    assign,
    derived,
    same,
)

if TYPE_CHECKING:
    from flagtrial.gates.capability import Evaluator

_MAX_LINES = 120  # longer functions are not capability probes: not interpreted


def interpret(
    ev: Evaluator, func: Val, ref: FuncRef, args: list[Val], kwargs: dict[str, Val]
) -> Val:
    """Run a function body over known values; its result, or UNKNOWN."""
    fn = ev.index.func((ref.fi, ref.ni))
    if fn.end - fn.start > _MAX_LINES or ev.budget <= 0 or ev.depth > 12:
        return derived(UNKNOWN, func)
    try:
        key: Any = (
            ref,
            ev.in_startup,
            tuple(a.value for a in args),
            tuple(sorted((k, v.value) for k, v in kwargs.items())),
        )
        hash(key)
    except TypeError:
        key = None
    if key is not None and key in ev.memo:
        return ev.memo[key]
    if key is not None and key in ev.active:
        return Val(UNKNOWN)
    stmts = ev.reader.unit(ref.fi, fn.start, fn.end)
    if not stmts or not isinstance(stmts[0], ast.FunctionDef | ast.AsyncFunctionDef):
        return Val(UNKNOWN)
    ev.budget -= 1
    ev.depth += 1
    if key is not None:
        ev.active.add(key)
    try:
        scope = bind(ev, ref, stmts[0], args, kwargs)
        result = run(ev, stmts[0].body, scope) or Val(None)
    finally:
        ev.depth -= 1
        if key is not None:
            ev.active.discard(key)
    result = derived(result.value, result, func)
    if result.hw:
        # A helper whose answer depends on the host: part of the evidence chain.
        note = f"{fn.name}() -> {result.value!r}"
        extra: list[Trace] = [("helper", ref.fi, fn.start, note)]
        if ref.origin:
            extra.insert(0, ref.origin)
        result = Val(result.value, True, result.traces + tuple(extra))
    if key is not None:
        ev.memo[key] = result
    return result


def bind(
    ev: Evaluator,
    ref: FuncRef,
    node: ast.FunctionDef | ast.AsyncFunctionDef,
    args: list[Val],
    kwargs: dict[str, Val],
) -> Scope:
    fn = ev.index.func((ref.fi, ref.ni))
    cls = ClassRef(ref.fi, fn.cls) if fn.cls else None
    scope = Scope(ref.fi, cls=cls, owner=ref.owner)
    a = node.args
    params = [p.arg for p in (*a.posonlyargs, *a.args)]
    if ref.owner is not None and params and "staticmethod" not in fn.decorators:
        scope.locals[params[0]] = Val(ref.owner)
        params = params[1:]
    defaults = dict(zip(reversed(params), reversed(a.defaults), strict=False))
    bound = dict(ref.bound)
    for i, name in enumerate(params):
        if i < len(args):
            scope.locals[name] = args[i]
        elif name in kwargs:
            scope.locals[name] = kwargs[name]
        elif name in bound:
            scope.locals[name] = Val(bound[name])
        elif name in defaults:
            scope.locals[name] = ev.expr(defaults[name], Scope(ref.fi))
        else:
            scope.locals[name] = Val(UNKNOWN)
    for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        if p.arg in kwargs:
            scope.locals[p.arg] = kwargs[p.arg]
        elif p.arg in bound:
            scope.locals[p.arg] = Val(bound[p.arg])
        else:
            scope.locals[p.arg] = ev.expr(d, Scope(ref.fi)) if d else Val(UNKNOWN)
    for extra in (a.vararg, a.kwarg):
        if extra:
            scope.locals[extra.arg] = Val(UNKNOWN)
    return scope


def run(ev: Evaluator, stmts: list[ast.stmt], scope: Scope) -> Val | None:
    """The value a block returns, None when it falls through (UNKNOWN when undecided)."""
    for stmt in stmts:
        match stmt:
            case ast.Return(value=value):
                return ev.expr(value, scope) if value else Val(None)
            case ast.If(test=test, body=body, orelse=orelse):
                tv = ev.expr(test, scope)
                truth = tv.truth()
                if truth is not None:
                    result = run(ev, body if truth else orelse, scope)
                    if result is not None:
                        return derived(result.value, tv, result)
                    continue
                a = run(ev, body, Scope(scope.fi, dict(scope.locals), scope.cls, scope.owner))
                b = run(ev, orelse, Scope(scope.fi, dict(scope.locals), scope.cls, scope.owner))
                if a is None and b is None:
                    for name in _assigned_names([*body, *orelse]):
                        scope.locals[name] = derived(UNKNOWN, tv)
                    continue
                if a is not None and b is not None and same(a, b):
                    return derived(a.value, tv, a, b)
                return derived(UNKNOWN, tv, *(r for r in (a, b) if r))
            case ast.Assign(targets=targets, value=value):
                assign(scope, targets, ev.expr(value, scope))
            case ast.AnnAssign(target=target, value=value) if value is not None:
                assign(scope, [target], ev.expr(value, scope))
            case ast.Import() | ast.ImportFrom():
                bind_import(ev, scope, stmt)
            case ast.Try(body=body) | ast.With(body=body):
                # Probes are read as if nothing raised (a healthy GPU host).
                result = run(ev, body, scope)
                if result is not None:
                    return result
            case ast.Expr() | ast.Pass() | ast.Assert() | ast.Global() | ast.Nonlocal():
                continue
            case ast.FunctionDef() | ast.AsyncFunctionDef() | ast.ClassDef():
                scope.locals[stmt.name] = Val(UNKNOWN)
            case _:
                return Val(UNKNOWN)
    return None


def _assigned_names(stmts: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names
