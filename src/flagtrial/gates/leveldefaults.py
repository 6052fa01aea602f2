"""A setting left unset filled from a module-level table of defaults chosen by another
setting: vLLM's `OPTIMIZATION_LEVEL_TO_CONFIG[self.optimization_level]`, applied by
`VllmConfig._apply_optimization_level_defaults` to every key still None
(`setattr(config_obj, key, value(self) if callable(value) else value)`, vllm/config/vllm.py).
An edit that sets the value the table gives on this host changes nothing: without it the
engine fills in the same value before anything that serves reads it.

The table's entry is evaluated for this host with the settings the command leaves out at
their defaults (`enable_allreduce_rms_fusion(cfg)`: tensor-parallel size, platform,
capability, environment unset, the platform's packages installed). Argument resolution may
read the setting before the table is applied; such a read sees None without the edit, so
each one must only log, or sit in a method the applying function calls after the table."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flagtrial.gates.bodies import logs
from flagtrial.gates.capability import Evaluator
from flagtrial.gates.model import GateFinding, Outcome
from flagtrial.gates.paths import Walker
from flagtrial.gates.reads import declaration_read, equal
from flagtrial.gates.sites import ReadSite
from flagtrial.gates.values import UNKNOWN, ClassRef, FuncRef, Instance, Scope, Val
from flagtrial.sourceread.modules import module_name

if TYPE_CHECKING:
    from flagtrial.gates.analysis import Analysis


@dataclass(frozen=True)
class Applied:
    """Where a table of defaults is chosen: `SELECTOR[self.attr]` in `func` of file `fi`."""

    fi: int
    selector: str
    key: ast.expr
    func: ast.FunctionDef
    cls: str
    stmt_line: int  # the top-level statement of `func` that holds the subscript


def level_default(a: Analysis, walker: Walker) -> GateFinding | None:
    """NO-OP when the edited key's declared default is None and the table of defaults the
    engine applies to it gives the edited value on this host."""
    if len(a.path) < 2 or a.old[a.dest].value is not None:
        return None
    new = a.new[a.dest].value
    for applied in _applications(a):
        value = _entry(a, a.platform_evaluator(), applied)
        if value is None or not value.known or not equal(value.value, new):
            continue
        if not all(_before_is_harmless(a, applied, r) for r in _startup_reads(a, walker)):
            return None
        a.chain.add(
            "gate",
            applied.fi,
            applied.stmt_line,
            f"{applied.selector}[...] fills {a.dest} when it is None",
        )
        for trace in value.traces:
            a.chain.trace(trace)
        return a.finding(
            Outcome.NO_OP,
            f"{a.index.files[applied.fi].path}:{applied.stmt_line}: without the flag the"
            f" engine's defaults table gives {a.dest}={value.value!r} on this host anyway",
        )
    return None


def _applications(a: Analysis) -> list[Applied]:
    """The tables of defaults in argument resolution that name the edited key
    (`"key": value` in a module-level dict), and where each is chosen."""
    found = []
    needle = f'"{a.dest}":'
    for fi, info in enumerate(a.index.files):
        if not a.startup_file(fi):
            continue
        lines = a.reader.lines(fi)
        hits = [n for n, text in enumerate(lines, 1) if needle in text]
        if not hits:
            continue
        tables = {
            name
            for name, sites in info.assigns.items()
            if len(sites) == 1
            and not sites[0][2]
            and any(sites[0][0] <= n <= sites[0][1] for n in hits)
        }
        for selector in _selectors(a, fi, tables):
            applied = _chosen_at(a, fi, selector)
            if applied is not None:
                found.append(applied)
    return found


def _selectors(a: Analysis, fi: int, tables: set[str]) -> list[str]:
    """Module-level dicts of file `fi` whose every value is one of `tables`."""
    out = []
    lines = a.reader.lines(fi)
    for name, sites in a.index.files[fi].assigns.items():
        if len(sites) != 1 or sites[0][2]:
            continue
        start, end, _ = sites[0]
        if not any(t in line for t in tables for line in lines[start - 1 : end]):
            continue
        stmts = a.reader.unit(fi, start, end)
        value = getattr(stmts[0], "value", None) if stmts else None
        if (
            isinstance(value, ast.Dict)
            and value.values
            and all(isinstance(v, ast.Name) and v.id in tables for v in value.values)
        ):
            out.append(name)
    return out


def _chosen_at(a: Analysis, fi: int, selector: str) -> Applied | None:
    """`selector[self.<attr>]` inside a method of file `fi`: the method and the statement."""
    lines = a.reader.lines(fi)
    for number, text in enumerate(lines, 1):
        if f"{selector}[" not in text:
            continue
        funcs = [f for f in a.index.files[fi].funcs if f.cls and f.start <= number <= f.end]
        if not funcs:
            continue
        fn = max(funcs, key=lambda f: f.start)
        stmts = a.reader.unit(fi, fn.start, fn.end)
        node = stmts[0] if stmts else None
        if not isinstance(node, ast.FunctionDef) or fn.cls is None:
            continue
        for i, stmt in enumerate(node.body):
            # chosen on every run: a plain statement, no return possible before it
            if not isinstance(stmt, ast.Assign | ast.Expr) or not _no_return(
                a, fi, fn.cls, node.body[:i]
            ):
                continue
            for sub in ast.walk(stmt):
                if (
                    isinstance(sub, ast.Subscript)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == selector
                ):
                    return Applied(fi, selector, sub.slice, node, fn.cls, stmt.lineno)
    return None


def _no_return(a: Analysis, fi: int, cls: str, stmts: list[ast.stmt]) -> bool:
    """None of `stmts` may return: a return inside a nested `def` is that function's, one
    under an `if` whose test is false with the settings left out at their defaults is not
    taken (`if self.model_config.is_submodel_config: return`)."""
    ev = a.platform_evaluator()
    scope = Scope(fi, owner=Instance(ClassRef(fi, cls)), cls=ClassRef(fi, cls))
    for stmt in stmts:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if not any(isinstance(n, ast.Return) for n in ast.walk(stmt)):
            continue
        if not (
            isinstance(stmt, ast.If)
            and not stmt.orelse
            and ev.expr(stmt.test, scope).truth() is False
        ):
            return False
    return True


def _entry(a: Analysis, ev: Evaluator, applied: Applied) -> Val | None:
    """The table's value for the edited key on this host: the selector's row for the key
    setting (from the command, else its declared default), down the edited key's path, a
    callable entry called with the configuration object."""
    me = Val(Instance(ClassRef(applied.fi, applied.cls)))
    scope = Scope(applied.fi, owner=me.value, cls=ClassRef(applied.fi, applied.cls))
    key = _key_value(a, ev, applied, scope)
    selector = ev.expr(ast.Name(id=applied.selector), Scope(applied.fi))
    if key is None or not isinstance(selector.value, dict):
        return None
    row: Any = next(
        (v for k, v in selector.value.items() if k is not UNKNOWN and equal(k, key.value)), None
    )
    for part in a.path:
        if not isinstance(row, dict) or part not in row:
            return None
        row = row[part]
    if isinstance(row, FuncRef):
        return ev.apply(Val(row), [me], {})
    return Val(row) if row is not UNKNOWN else None


def _key_value(a: Analysis, ev: Evaluator, applied: Applied, scope: Scope) -> Val | None:
    """`self.<attr>`: left out of the command, its declared default's expression."""
    key = applied.key
    if not (isinstance(key, ast.Attribute) and isinstance(key.value, ast.Name)):
        return None
    if key.attr in a.others:
        return None  # given on the command line: its parsed form is not compared here
    fdef = a.index.table.field(key.attr)
    fi = a.index.modules.get(module_name(fdef.file)) if fdef else None
    if fdef is None or fi is None:
        return None
    stmts = a.reader.unit(fi, fdef.line, fdef.line)
    value = getattr(stmts[0], "value", None) if stmts else None
    if value is None:
        return None
    val = ev.expr(value, Scope(fi))
    return val if val.known else None


def _startup_reads(a: Analysis, walker: Walker) -> list[ReadSite]:
    return [
        r
        for r in walker.reads
        if r.field == a.dest and r.runs_at_startup and not declaration_read(r, a.index.table)
    ]


def _before_is_harmless(a: Analysis, applied: Applied, site: ReadSite) -> bool:
    """A read in argument resolution sees None without the edit if it runs before the
    table is applied: harmless when its `if` only logs, or when it sits in a method the
    applying function calls (`self.m()`) after the table."""
    stmt = site.stmt
    if isinstance(stmt, ast.If) and stmt.test is site.node and all(logs(s) for s in stmt.body):
        return True
    if not a.new[a.dest].value and _truth_only(site):
        return True  # None and a false edit test the same
    line = site.node.lineno
    funcs = [f for f in a.index.files[site.fi].funcs if f.start <= line <= f.end]
    if site.fi != applied.fi or not funcs:
        return False
    end = applied.func.end_lineno or applied.func.lineno
    if applied.stmt_line < line <= end and site.stmt in applied.func.body:
        return True  # later in the function that applies the table, at its top level
    name = max(funcs, key=lambda f: f.start).name
    return any(
        isinstance(s, ast.Expr)
        and isinstance(s.value, ast.Call)
        and isinstance(s.value.func, ast.Attribute)
        and s.value.func.attr == name
        and isinstance(s.value.func.value, ast.Name)
        and s.value.func.value.id == "self"
        and s.lineno > applied.stmt_line
        for s in applied.func.body
    )


def _truth_only(site: ReadSite) -> bool:
    """The read is used for its truth alone: inside an `if` test through `and`/`or`/`not`
    only (`if self.f and not is_rocm():`)."""
    test = getattr(site.stmt, "test", None)
    if not isinstance(site.stmt, ast.If | ast.While) or test is None:
        return False
    node: ast.AST = site.node
    while node is not test:
        parent = site.parents.get(id(node))
        if not isinstance(parent, ast.BoolOp | ast.UnaryOp) or (
            isinstance(parent, ast.UnaryOp) and not isinstance(parent.op, ast.Not)
        ):
            return False
        node = parent
    return True
