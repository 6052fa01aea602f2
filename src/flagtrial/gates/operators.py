"""Operators and displays of an expression, over the values the evaluator gives their
operands: three-valued `and`/`or`/`not`, comparisons, arithmetic, conditional expressions,
subscripts and slices, dict/tuple displays and one-`for` comprehensions."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from flagtrial.gates.compare import BINOPS, compare_values
from flagtrial.gates.definitions import is_enum
from flagtrial.gates.values import UNKNOWN, ClassRef, EnumMember, Scope, Val, derived, plain, same

if TYPE_CHECKING:
    from flagtrial.gates.capability import Evaluator


def dict_display(ev: Evaluator, node: ast.Dict, scope: Scope) -> Val:
    if any(k is None for k in node.keys):
        return Val(UNKNOWN)
    ks = [ev.expr(k, scope) for k in node.keys if k is not None]
    vs = [ev.expr(v, scope) for v in node.values]
    if not all(k.known for k in ks):
        return Val(UNKNOWN)
    try:
        pairs = zip((k.value for k in ks), (v.value for v in vs), strict=True)
        return derived(dict(pairs), *ks)
    except TypeError:
        return Val(UNKNOWN)


def unary(ev: Evaluator, node: ast.UnaryOp, scope: Scope) -> Val:
    val = ev.expr(node.operand, scope)
    if isinstance(node.op, ast.Not):
        truth = val.truth()
        return derived(UNKNOWN if truth is None else not truth, val)
    if isinstance(node.op, ast.USub) and isinstance(val.value, int | float):
        return derived(-val.value, val)
    return derived(UNKNOWN, val)


def binop(ev: Evaluator, node: ast.BinOp, scope: Scope) -> Val:
    lv, rv = ev.expr(node.left, scope), ev.expr(node.right, scope)
    fn = BINOPS.get(type(node.op))
    if fn and plain(lv.value) and plain(rv.value):
        try:
            return derived(fn(lv.value, rv.value), lv, rv)
        except Exception:
            pass
    return derived(UNKNOWN, lv, rv)


def ifexp(ev: Evaluator, node: ast.IfExp, scope: Scope) -> Val:
    tv = ev.expr(node.test, scope)
    truth = tv.truth()
    if truth is not None:
        branch = ev.expr(node.body if truth else node.orelse, scope)
        return derived(branch.value, tv, branch)
    a, b = ev.expr(node.body, scope), ev.expr(node.orelse, scope)
    return derived(a.value if same(a, b) else UNKNOWN, tv, a, b)


def comprehension(
    ev: Evaluator, node: ast.GeneratorExp | ast.ListComp | ast.SetComp, scope: Scope
) -> Val:
    """`any(g in arch for g in ["gfx95"])`: one `for` over a known sequence, every item
    known, else UNKNOWN (a partly known list would mislead any()/all())."""
    if len(node.generators) != 1 or not isinstance(node.generators[0].target, ast.Name):
        return Val(UNKNOWN)
    gen = node.generators[0]
    assert isinstance(gen.target, ast.Name)
    seq = ev.expr(gen.iter, scope)
    if not isinstance(seq.value, tuple | frozenset | str) or len(seq.value) > 64:
        return derived(UNKNOWN, seq)
    inner = scope.snapshot()
    items, vals = [], [seq]
    for item in seq.value:
        inner.locals[gen.target.id] = Val(item)
        conds = [ev.expr(c, inner) for c in gen.ifs]
        vals += conds
        if any(c.truth() is None for c in conds):
            return derived(UNKNOWN, *vals)
        if all(c.truth() for c in conds):
            val = ev.expr(node.elt, inner)
            vals.append(val)
            if not val.known:
                return derived(UNKNOWN, *vals)
            items.append(val.value)
    result = frozenset(items) if isinstance(node, ast.SetComp) else tuple(items)
    return derived(result, *vals)


def boolop(ev: Evaluator, is_and: bool, values: list[ast.expr], scope: Scope) -> Val:
    """Three-valued `and`/`or`; a decided result carries only what decided it."""
    seen: list[Val] = []
    unknown = False
    for node in values:
        val = ev.expr(node, scope)
        truth = val.truth()
        if truth is None:
            unknown = True
        elif truth != is_and:
            # `False and ...`, `True or ...`: this operand decides whatever came before.
            return val
        seen.append(val)
    if unknown:
        return derived(UNKNOWN, *seen)
    return derived(seen[-1].value, *seen)


def compare(ev: Evaluator, node: ast.Compare, scope: Scope) -> Val:
    left = ev.expr(node.left, scope)
    vals = [left]
    result: bool | None = True
    for op, comp in zip(node.ops, node.comparators, strict=True):
        right = ev.expr(comp, scope)
        vals.append(right)
        outcome = compare_values(op, left.value, right.value)
        if outcome is False:
            return derived(False, left, right)
        if outcome is None:
            result = None
        left = right
    return derived(UNKNOWN if result is None else True, *vals)


def subscript(ev: Evaluator, value: ast.expr, index: ast.expr, scope: Scope) -> Val:
    base = ev.expr(value, scope)
    if isinstance(index, ast.Slice):
        parts = [ev.expr(p, scope) if p else Val(None) for p in (index.lower, index.upper)]
        if isinstance(base.value, tuple | str) and all(plain(p.value) for p in parts):
            try:
                return derived(base.value[parts[0].value : parts[1].value], base, *parts)
            except TypeError:
                pass
        return derived(UNKNOWN, base)
    key = ev.expr(index, scope)
    if isinstance(base.value, tuple | str | dict) and key.known:
        try:
            return derived(base.value[key.value], base, key)
        except (LookupError, TypeError):
            pass
    if isinstance(base.value, ClassRef) and isinstance(key.value, str) and is_enum(ev, base.value):
        return derived(EnumMember(base.value.name, key.value), base, key)
    return derived(UNKNOWN, base, key)
