"""A read copied into a local that this host then sets to the edited value anyway:

    backend = get_exec().kernel.fp8_gemm_runner_backend
    if backend == "auto" and get_platform().is_sm120:
        backend = "cutlass"

On SM120, `--fp8-gemm-backend cutlass` leaves `backend` as the default `auto` does, so the
read changes nothing that runs (SGLang 0.5.23 fp8_utils.py; 0.5.10 picks `triton` there).
Followed only over the `if` statements right after the read whose every branch only assigns
that local, each test decided here with and without the edit, and only where a test reads
a fact of the host.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from flagtrial.gates.bodies import BodyEvaluator
from flagtrial.gates.reads import equal
from flagtrial.gates.sites import ReadSite
from flagtrial.gates.values import Scope, Val, derived

if TYPE_CHECKING:
    from flagtrial.gates.analysis import Analysis
    from flagtrial.gates.values import FieldBinding


def picked_anyway(a: Analysis, site: ReadSite) -> Val | None:
    """A host-decided False when the local the read is copied into ends with the same value
    with and without the edit; None when that is not shown."""
    stmt = site.stmt
    if (
        site.scope_old is None
        or not isinstance(stmt, ast.Assign)
        or stmt.value is not site.node
        or len(stmt.targets) != 1
        or not isinstance(stmt.targets[0], ast.Name)
    ):
        return None
    local = stmt.targets[0].id
    picks = _picks(_following(a, site), local)
    if not picks:
        return None
    old = _through(a, a.old, picks, site, site.scope_old, local)
    new = _through(a, a.new, picks, site, site.scope_new, local)
    if old is None or new is None or not (old.hw or new.hw):
        return None
    if not (old.known and new.known and equal(old.value, new.value)):
        return None
    note = f"{local} is {new.value!r} here with or without the flag"
    return derived(False, old, new, Val(False, True, (("gate", site.fi, picks[0].lineno, note),)))


def _following(a: Analysis, site: ReadSite) -> list[ast.stmt]:
    """The statements after the read's, in the block of its function that holds it."""
    line = site.stmt.lineno
    funcs = [f for f in a.index.files[site.fi].funcs if f.start <= line <= f.end]
    fn = max(funcs, key=lambda f: f.start, default=None)
    if fn is None:
        return []
    for root in a.reader.unit(site.fi, fn.start, fn.end):
        for node in ast.walk(root):
            for name in ("body", "orelse", "finalbody"):
                block = getattr(node, name, None)
                if not isinstance(block, list):
                    continue
                at = [i for i, s in enumerate(block) if s.lineno == line]
                if at and type(block[at[0]]) is type(site.stmt):
                    return block[at[0] + 1 :]
    return []


def _picks(stmts: list[ast.stmt], local: str) -> list[ast.If]:
    """The `if` statements at the head of `stmts` whose every branch is `local = ...`."""
    out = []
    for stmt in stmts:
        if not isinstance(stmt, ast.If) or not _assigns_only(stmt, local):
            break
        out.append(stmt)
    return out


def _assigns_only(stmt: ast.If, local: str) -> bool:
    branches = [stmt.body] + ([stmt.orelse] if stmt.orelse else [])
    for body in branches:
        if len(body) == 1 and isinstance(body[0], ast.If) and body is stmt.orelse:
            if not _assigns_only(body[0], local):  # an elif
                return False
            continue
        if not (
            len(body) == 1
            and isinstance(body[0], ast.Assign)
            and [ast.dump(t) for t in body[0].targets] == [ast.dump(ast.Name(local, ast.Store()))]
        ):
            return False
    return True


def _through(
    a: Analysis,
    bound: dict[str, FieldBinding],
    picks: list[ast.If],
    site: ReadSite,
    scope: Scope,
    local: str,
) -> Val | None:
    """The local's value after the picks, the read evaluated with `bound`; None when a test
    is not decided here."""
    ev = BodyEvaluator(
        a.index, a.reader, a.host, bound, model=a.model, defaults={},
        resolution_defaults=a.defaults(bound),
    )  # fmt: skip
    ev.in_startup = site.runs_at_startup
    ev.tp = a.tp
    scope = scope.snapshot()
    value = ev.expr(site.node, scope)
    if not value.known:
        return None
    facts: list[Val] = [value]
    scope.locals[local] = value
    for stmt in picks:
        branch: ast.If | None = stmt
        while branch is not None:
            test = ev.expr(branch.test, scope)
            if test.truth() is None:
                return None
            facts.append(test)
            taken = branch.body if test.truth() else branch.orelse
            branch = None
            if len(taken) == 1 and isinstance(taken[0], ast.If):
                branch = taken[0]  # an elif
            elif taken:
                assign = taken[0]
                assert isinstance(assign, ast.Assign)  # _assigns_only
                scope.locals[local] = ev.expr(assign.value, scope)
                facts.append(scope.locals[local])  # type: ignore[arg-type]
    final = scope.locals[local]
    return derived(final.value, *facts) if isinstance(final, Val) and final.known else None
