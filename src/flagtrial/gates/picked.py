"""A read that only sets a local which this host gives the same value without the edit:

- the local is set from the read, then the platform's pick turns the default into the
  edited value (SGLang 0.5.23 fp8_utils.py: `backend = ...fp8_gemm_runner_backend`, then
  `if backend == "auto" and get_platform().is_sm120: backend = "cutlass"`; 0.5.10 picks
  `triton` there);
- the platform's pick comes first and the read only replaces it when given (vLLM
  fa_utils.py: `fa_version = 2` on SM80, then `if config.flash_attn_version is not None:
  fa_version = config.flash_attn_version`): `2` there is the pick itself.

Followed only over one block: the statements before the read's (locals, imports, asserts,
logging and `if`s decided here), the statement that sets the local from the read, and the
`if`s right after it whose every branch only sets that local, no value a call; each test
decided here with and without the edit, or both its branches leaving the local the same, and
at least one fact of the host read on the way.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flagtrial.gates.bodies import BodyEvaluator, body_evaluator, logs
from flagtrial.gates.definitions import bind_import
from flagtrial.gates.reads import equal
from flagtrial.gates.sites import ReadSite
from flagtrial.gates.values import UNKNOWN, Scope, Val, assign, derived

if TYPE_CHECKING:
    from flagtrial.gates.analysis import Analysis
    from flagtrial.gates.values import FieldBinding


@dataclass(frozen=True)
class Holding:
    """The block around the read: `before` it, the statement that sets `local` from the
    read (an assignment, or an `if` whose branches only set it), and the picks `after`."""

    before: list[ast.stmt]
    sets: ast.stmt
    after: list[ast.If]
    local: str


def picked_anyway(a: Analysis, site: ReadSite) -> Val | None:
    """A host-decided False when the local the read sets ends with the same value with and
    without the edit; None when that is not shown."""
    held = _holding(a, site)
    if held is None or site.scope_old is None:
        return None
    old = _through(a, a.old, held, site, site.scope_old)
    new = _through(a, a.new, held, site, site.scope_new)
    if old is None or new is None or not (old.hw or new.hw):
        return None
    if not (old.known and new.known and equal(old.value, new.value)):
        return None
    last = held.after[-1] if held.after else held.sets
    note = f"{held.local} is {new.value!r} here with or without the flag"
    return derived(False, old, new, Val(False, True, (("gate", site.fi, last.lineno, note),)))


def _holding(a: Analysis, site: ReadSite) -> Holding | None:
    line = site.stmt.lineno
    funcs = [f for f in a.index.files[site.fi].funcs if f.start <= line <= f.end]
    fn = max(funcs, key=lambda f: f.start, default=None)
    if fn is None:
        return None
    blocks = [
        block
        for root in a.reader.unit(site.fi, fn.start, fn.end)
        for node in ast.walk(root)
        for block in (getattr(node, n, None) for n in ("body", "orelse", "finalbody"))
        if isinstance(block, list)
    ]
    for block in blocks:
        for i, stmt in enumerate(block):
            if stmt.lineno != line or type(stmt) is not type(site.stmt):
                continue
            local = _sets_local(stmt)
            if local is None:
                return None
            if isinstance(stmt, ast.Assign):  # inside `if <read> is not None: local = <read>`?
                outer = _enclosing_if(blocks, block)
                if outer is not None and _sets_local(outer[0][outer[1]]) == local:
                    block, i = outer
            held = Holding(block[:i], block[i], _picks(block[i + 1 :], local), local)
            # a call in a value may act on what it is given, whatever the local ends up as
            # (not the read itself: `get_exec().kernel.f`)
            values = [n.value for s in (held.sets, *held.after) for n in ast.walk(s)
                      if isinstance(n, ast.Assign) and not _reads(n.value, site.field)]  # fmt: skip
            calls = [n for v in values for n in ast.walk(v) if isinstance(n, ast.Call)]
            return None if calls else held
    return None


def _reads(node: ast.expr, field: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == field


def _enclosing_if(
    blocks: list[list[ast.stmt]], inner: list[ast.stmt]
) -> tuple[list[ast.stmt], int] | None:
    for block in blocks:
        for i, stmt in enumerate(block):
            if isinstance(stmt, ast.If) and stmt.body is inner:
                return block, i
    return None


def _sets_local(stmt: ast.stmt) -> str | None:
    """The one local an assignment, or every branch of an `if` chain, sets; else None."""
    if isinstance(stmt, ast.Assign):
        names = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
        return names[0] if len(names) == len(stmt.targets) == 1 else None
    if not isinstance(stmt, ast.If):
        return None
    found: set[str | None] = set()
    for body in (stmt.body, stmt.orelse):
        if not body:
            continue
        if len(body) != 1 or not isinstance(body[0], ast.Assign | ast.If):
            return None
        if isinstance(body[0], ast.If) and body is stmt.body:
            return None
        found.add(_sets_local(body[0]))
    return found.pop() if len(found) == 1 else None


def _picks(stmts: list[ast.stmt], local: str) -> list[ast.If]:
    out = []
    for stmt in stmts:
        if not isinstance(stmt, ast.If) or _sets_local(stmt) != local:
            break
        out.append(stmt)
    return out


def _through(
    a: Analysis, bound: dict[str, FieldBinding], held: Holding, site: ReadSite, scope: Scope
) -> Val | None:
    """The local's value after the picks with `bound`; None when it is not decided here."""
    ev = body_evaluator(a, bound, in_startup=site.runs_at_startup)
    scope = scope.snapshot()
    facts: list[Val] = []
    if isinstance(held.sets, ast.If):  # the local's value before it counts too
        scope.locals.pop(held.local, None)
        if not _run(a, ev, held.before, scope, facts):
            return None
    if not _run(a, ev, [held.sets, *held.after], scope, facts):
        return None
    final = scope.locals.get(held.local)
    if not isinstance(final, Val) or not final.known:
        return None
    return derived(final.value, *facts)


def _run(
    a: Analysis, ev: BodyEvaluator, stmts: list[ast.stmt], scope: Scope, facts: list[Val]
) -> bool:
    """Follow `stmts` here: False when a branch is not decided and binds something."""
    for stmt in stmts:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            bind_import(ev, scope, stmt)
        elif isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            value = ev.expr(stmt.value, scope)
            facts.append(value)
            assign(scope, stmt.targets, value)
        elif isinstance(stmt, ast.If):
            test = ev.expr(stmt.test, scope)
            if test.truth() is None:  # either branch may run: they must bind the same
                if not _either(a, ev, stmt, scope, facts):
                    return False
                continue
            facts.append(test)
            if not _run(a, ev, stmt.body if test.truth() else stmt.orelse, scope, facts):
                return False
        elif isinstance(stmt, ast.Assert | ast.Pass) or logs(stmt):
            continue
        else:
            for name in a.reader.stores(stmt):
                scope.locals[name] = Val(UNKNOWN)
    return True


def _either(a: Analysis, ev: BodyEvaluator, stmt: ast.If, scope: Scope, facts: list[Val]) -> bool:
    """An `if` not decided here: True (`scope` updated) when both branches bind every name
    they bind to the same known value (`vllm_config is not None and ...`: without a config
    the pick stays, with one the read replaces it by the same value)."""
    ends = []
    for body in (stmt.body, stmt.orelse):
        branch = scope.snapshot()
        if not _run(a, ev, body, branch, facts):
            return False
        ends.append(branch)
    for name in a.reader.stores(stmt):
        one, two = (end.locals.get(name) for end in ends)
        if not (isinstance(one, Val) and isinstance(two, Val) and one.known and two.known):
            return False
        if not equal(one.value, two.value):
            return False
        scope.locals[name] = derived(one.value, one, two)
    return True
