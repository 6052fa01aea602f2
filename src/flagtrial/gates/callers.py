"""A read in a function whose every call is behind a test false on this host never runs.

`aiter_ar_fusion_enabled_for(mode)` reads `enable_aiter_allreduce_fusion`, and its one call
is `_use_aiter and ... and aiter_ar_fusion_enabled_for(...)`: on CUDA `_use_aiter` is False,
so the call never happens. Followed only where every call can be seen: a module-level
function that no other file imports (by name, or its module whole), every mention of it in
its own file a call, each evaluated with the launch's environment (else unset) and this
platform's packages installed, as the platform's pick is. One level: a caller's own callers
are not followed.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from flagtrial.gates.bodies import BodyEvaluator, body_evaluator
from flagtrial.gates.modelfiles import imported_elsewhere
from flagtrial.gates.scan import FuncInfo
from flagtrial.gates.sites import ReadSite
from flagtrial.gates.values import Scope, Val, derived

if TYPE_CHECKING:
    from flagtrial.gates.analysis import Analysis


def never_called_here(a: Analysis, site: ReadSite) -> Val | None:
    """A host-decided False when no call of the function holding the read runs on this
    host; None when that is not shown."""
    fn = _holder(a, site)
    if fn is None or fn.decorators or imported_elsewhere(a.index, site.fi, fn.name):
        return None
    ev = body_evaluator(a, a.new)
    word = re.compile(rf"\b{re.escape(fn.name)}\b")
    facts: list[Val] = []
    calls = 0
    for line, text in enumerate(a.reader.lines(site.fi), 1):
        if line == fn.start or not word.search(text):
            continue
        if fn.start < line <= fn.end:
            continue  # its own recursion
        blocked = _call_blocked(a, ev, site.fi, line, fn.name)
        if blocked is None:
            return None
        note = f"calls {fn.name}() (imported by no other file) only behind a test false here"
        facts += [blocked, Val(False, False, (("call", site.fi, line, note),))]
        calls += 1
    if not calls or not any(f.hw for f in facts):
        return None
    return derived(False, *facts)


def _holder(a: Analysis, site: ReadSite) -> FuncInfo | None:
    """The innermost function holding the read, when it is a module-level function."""
    line = site.node.lineno
    inside = [f for f in a.index.files[site.fi].funcs if f.start <= line <= f.end]
    fn = max(inside, key=lambda f: f.start, default=None)
    return fn if fn is not None and fn.top else None


def _call_blocked(a: Analysis, ev: BodyEvaluator, fi: int, line: int, name: str) -> Val | None:
    """The test, false on this host, that every mention of `name` on `line` sits behind;
    None when a mention is not a call, or is not shown blocked."""
    info = a.index.files[fi]
    units = [(f.start, f.end) for f in info.funcs if f.start <= line <= f.end]
    start, end = max(units, default=(line, line))
    stmts = a.reader.unit(fi, start, end)
    if not stmts:
        return None
    parents: dict[int, ast.AST] = {}
    names = []
    for root in stmts:
        for node in ast.walk(root):
            for child in ast.iter_child_nodes(node):
                parents[id(child)] = node
            if isinstance(node, ast.Name) and node.id == name and node.lineno == line:
                names.append(node)
    if not names:
        return None  # in a string or a comment: the text match says nothing
    scope = Scope(fi)
    found = None
    for node in names:
        call = parents.get(id(node))
        if not (isinstance(call, ast.Call) and call.func is node):
            return None
        found = _false_test(ev, scope, call, parents)
        if found is None:
            return None
    return found


def _false_test(
    ev: BodyEvaluator, scope: Scope, node: ast.AST, parents: dict[int, ast.AST]
) -> Val | None:
    """The first enclosing condition the call needs that evaluates the other way here."""
    child = node
    while id(child) in parents:
        parent = parents[id(child)]
        needed: list[tuple[ast.expr, bool]] = []
        if isinstance(parent, ast.BoolOp):
            before = parent.values[: parent.values.index(child)] if child in parent.values else []
            truth = isinstance(parent.op, ast.And)
            needed = [(v, truth) for v in before]
        elif isinstance(parent, ast.If | ast.IfExp) and child is not parent.test:
            body = parent.body if isinstance(parent, ast.If) else [parent.body]
            needed = [(parent.test, any(child is b for b in body))]
        for test, want in needed:
            val = ev.expr(test, scope)
            if val.truth() is (not want):
                return val
        child = parent
    return None
