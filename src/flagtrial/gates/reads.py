"""What a read of an edited setting does: what it controls (an effect on what runs, a
mapping to other settings, a validation that only raises, the setting's own resolution),
and whether this host rules it out (a guard false here, code of another platform, no
difference for this value)."""

from __future__ import annotations

import ast
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from flagtrial.gates.sites import Guard, ReadSite, all_hold
from flagtrial.gates.values import UNKNOWN, Val
from flagtrial.sourceread.fields import FlagTable


@dataclass
class Effect:
    site: ReadSite
    # "alive", "hw" (ruled out by the host), "foreign" (code of another platform), "value"
    # (no difference for this value)
    status: str
    deciding: Val | None = None
    guard: Guard | None = None


def consumer(
    site: ReadSite, fields: Container[str], bound: Container[str]
) -> tuple[str, dict[str, ast.expr]]:
    """What a read controls: 'effect', 'mapping' (sets other fields), 'self' (only
    resolves its own fields), 'validation' (only raises), 'none'."""
    stmt, node = site.stmt, site.context or site.node
    # the `if`'s test is the read, or an expression around it (`if x.f and is_sm90():`)
    if isinstance(stmt, ast.If) and stmt.test is (site.context or site.node):
        if leaves(stmt.body) and not stmt.orelse:
            return "effect", {}  # the rest of the function runs or not
        truth = site.ctx.new.truth() if site.ctx else None
        # Either branch can differ from before; only those taken with the edit map values.
        kind, _ = branches_kind([stmt.body, stmt.orelse], fields, bound)
        if kind != "mapping":
            return kind, {}
        taken = [b for b, t in ((stmt.body, True), (stmt.orelse, False)) if truth in (t, None)]
        return branches_kind(taken, fields, bound)
    if site.context is not None and isinstance(stmt, ast.Assert):
        return "validation", {}
    parent = site.parents.get(id(node))
    target = None
    if isinstance(parent, ast.keyword) and parent.arg:
        target = parent.arg
    elif isinstance(parent, ast.Dict):
        key = next((k for k, v in zip(parent.keys, parent.values, strict=True) if v is node), None)
        target = key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None
    elif isinstance(stmt, ast.Assign) and stmt.value is node:
        attrs = [t.attr for t in stmt.targets if isinstance(t, ast.Attribute)]
        target = attrs[0] if attrs else None
    if isinstance(target, str) and target in fields:
        if target in bound:
            return "self", {}
        return "mapping", {target: node}
    return "effect", {}


def branches_kind(
    branches: list[list[ast.stmt]], fields: Container[str], bound: Container[str]
) -> tuple[str, dict[str, ast.expr]]:
    writes: dict[str, ast.expr] = {}
    kinds: set[str] = set()
    for body in branches:
        for stmt in body:
            kinds.add(statement_kind(stmt, writes, fields))
    if "effect" in kinds:
        return "effect", {}
    others = {k: v for k, v in writes.items() if k not in bound}
    if others:
        return "mapping", others
    if "raise" in kinds:
        return "validation", {}
    return ("self" if writes else "none"), {}


def statement_kind(stmt: ast.stmt, writes: dict[str, ast.expr], fields: Container[str]) -> str:
    if isinstance(stmt, ast.Pass | ast.Continue) or (
        isinstance(stmt, ast.Return) and (stmt.value is None or is_none(stmt.value))
    ):
        return "none"
    if isinstance(stmt, ast.Raise):
        return "raise"
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        name = call.func.attr if isinstance(call.func, ast.Attribute) else ""
        name = name or getattr(call.func, "id", "")
        if name in ("warning", "info", "debug", "warn", "print", "error", "warning_once"):
            return "none"
        named = {k.arg: k.value for k in call.keywords if k.arg}
        if named and all(k in fields for k in named):
            # declare_resolution(server_args, "source", field=value)
            writes.update(named)
            return "write"
    if isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.Dict):
        keys = [
            k.value
            for k in stmt.value.keys
            if isinstance(k, ast.Constant) and isinstance(k.value, str)
        ]
        if keys and len(keys) == len(stmt.value.keys) and all(k in fields for k in keys):
            writes.update(zip(keys, stmt.value.values, strict=True))
            return "write"
    if isinstance(stmt, ast.Assign) and all(
        isinstance(t, ast.Attribute) and t.attr in fields for t in stmt.targets
    ):
        for t in stmt.targets:
            assert isinstance(t, ast.Attribute)
            writes[t.attr] = stmt.value
        return "write"
    return "effect"


def declaration_read(site: ReadSite, table: FlagTable) -> bool:
    """`ServerArgs.f` (`default=ServerArgs.f` in the parser): the class's declared
    default, the same with or without the edit."""
    fdef = table.field(site.field)
    node = site.node
    return (
        fdef is not None
        and isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == fdef.owner
    )


def classify(site: ReadSite, foreign: str | None) -> Effect:
    """How a read that acts fares on this host (`foreign`: why its module never runs here)."""
    if foreign is not None:
        return Effect(site, "foreign", Val(False, True, (("note", -1, 0, foreign),)))
    for guard in site.guards:
        if guard.holds_new is False:
            return Effect(site, "hw" if guard.new.hw else "value", guard.new, guard)
    if site.ctx is not None:
        a = site.ctx.new
        b = site.ctx.old if site.ctx.tainted else a
        if a.known and b.known and equal(a.value, b.value):
            return Effect(site, "hw" if a.hw else "value", a)
    return Effect(site, "alive")


def shown(site: ReadSite) -> bool:
    """Every guard of the read holds with the edit on this host: it runs whenever its
    function does."""
    return all_hold(g.holds_new for g in site.guards) is True


def writes_field(node: ast.AST, name: str) -> bool:
    """`x.name = ...`, `name=...` in a call, or `{"name": ...}`."""
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
        return node.attr == name
    if isinstance(node, ast.keyword):
        return node.arg == name
    return isinstance(node, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value == name for k in node.keys
    )


def leaves(body: list[ast.stmt]) -> bool:
    return any(isinstance(s, ast.Return | ast.Raise | ast.Continue | ast.Break) for s in body)


def is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def equal(a: Any, b: Any) -> bool:
    if a is UNKNOWN or b is UNKNOWN:
        return False
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:
        return False
