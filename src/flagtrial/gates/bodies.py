"""What the body of an `if <setting>:` does on this host, followed statement by statement:
its local assignments evaluated, its branches taken where the host decides them, logging
ignored. The read is ruled out when nothing in the body can act here:

- every effect sits under a test false on this host once the body's locals are known
  (vLLM's `_set_compile_ranges`: `max_size = pass_config.flashinfer_max_size(tp)` is None
  on SM120, so `if max_size is not None: ...` never runs);
- the body only builds objects that disable themselves in their constructor on this host
  (vLLM's `AllReduceFusionPass.__init__`: `self.disabled = True`, then `if max_size is None:
  return` before `self.disabled = False`, and `__call__` starts with `if self.disabled:
  return`).

Evaluated with the variables the launch sets, the environment otherwise unset, and the
platform's packages installed (as the platform's own pick is), the command's settings bound
and the others at their declared defaults where argument resolution never writes them; a
parameter or attribute named like a configuration field declared once
(`config.compilation_config.pass_config`) is an instance of the class its annotation
names."""

from __future__ import annotations

import ast
import copy
from typing import TYPE_CHECKING

from flagtrial.gates.capability import Evaluator
from flagtrial.gates.definitions import bind_import, global_name
from flagtrial.gates.sites import LOG_CALLS, ReadSite
from flagtrial.gates.values import (
    ClassRef,
    FieldBinding,
    Instance,
    Scope,
    Val,
    assign,
    derived,
)
from flagtrial.sourceread.modules import module_name

if TYPE_CHECKING:
    from flagtrial.gates.analysis import Analysis

MAX_DEPTH = 3


class BodyEvaluator(Evaluator):
    """An Evaluator that types an unknown object's attribute by the configuration field of
    that name (declared once, annotated with an engine class)."""

    tp = 1

    def call(self, node: ast.Call, scope: Scope) -> Val:
        # the tensor-parallel group's size is the command's tensor-parallel size
        name = (
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        )
        if name == "get_tensor_model_parallel_world_size" and not node.args:
            return Val(self.tp)
        return super().call(node, scope)

    def attribute(self, base: Val, attr: str) -> Val:
        val = super().attribute(base, attr)
        if val.known or (base.known and not isinstance(base.value, Instance)):
            return val
        cls = field_class(self, attr)
        return derived(Instance(cls), base) if cls is not None else val


def field_class(ev: Evaluator, attr: str) -> ClassRef | None:
    table = ev.index.table
    fdef = table.field(attr)
    if fdef is None or table.declared.get(attr) != 1:
        return None
    fi = ev.index.modules.get(module_name(fdef.file))
    if fi is None:
        return None
    stmts = ev.reader.unit(fi, fdef.line, fdef.line)
    stmt = stmts[0] if stmts else None
    ann = stmt.annotation if isinstance(stmt, ast.AnnAssign) else None
    if not isinstance(ann, ast.Name):
        return None
    cls = global_name(ev, fi, ann.id).value
    return cls if isinstance(cls, ClassRef) else None


def body_evaluator(
    a: Analysis, bound: dict[str, FieldBinding], *, in_startup: bool = False
) -> BodyEvaluator:
    """An evaluator of code on this host with `bound` settings: the launch's environment (else
    unset), the platform's packages installed, unbound settings at the defaults argument
    resolution leaves them (read in startup code only when `in_startup`)."""
    ev = BodyEvaluator(
        a.index,
        a.reader,
        a.host,
        bound,
        model=a.model,
        env=a.env,
        defaults={},
        resolution_defaults=a.defaults(bound),
    )
    ev.in_startup = in_startup
    ev.tp = a.tp
    return ev


def ruled_out_inside(a: Analysis, site: ReadSite) -> Val | None:
    """A host-decided Val (False) when the `if` the read is the test of does nothing that
    acts on this host; None when that is not shown."""
    stmt = site.stmt
    if not isinstance(stmt, ast.If) or stmt.orelse or stmt.test is not site.node:
        return None
    ev = body_evaluator(a, a.new, in_startup=site.runs_at_startup)
    scope = site.scope_new.snapshot()
    facts: list[Val] = []
    if not _inert(ev, stmt.body, scope, facts, 0):
        return None
    return derived(False, *facts) if any(f.hw for f in facts) else None


def _inert(ev: Evaluator, body: list[ast.stmt], scope: Scope, facts: list[Val], depth: int) -> bool:
    """Nothing in `body` acts: locals, imports, logging, branches decided here whose taken
    side is inert, objects that disable themselves."""
    for stmt in body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            bind_import(ev, scope, stmt)
        elif isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            assign(scope, stmt.targets, ev.expr(stmt.value, scope))
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if stmt.value is not None:
                assign(scope, [stmt.target], ev.expr(stmt.value, scope))
        elif isinstance(stmt, ast.If):
            test = ev.expr(stmt.test, scope)
            if test.truth() is None:
                return False
            facts.append(test)
            if not _inert(ev, stmt.body if test.truth() else stmt.orelse, scope, facts, depth):
                return False
        elif logs(stmt):
            continue
        elif not _builds_disabled(ev, stmt, scope, facts, depth):
            return False
    return True


def _builds_disabled(
    ev: Evaluator, stmt: ast.stmt, scope: Scope, facts: list[Val], depth: int
) -> bool:
    """`self.passes += [C(config)]` or `x.append(C(config))`, every C disabling itself."""
    calls: list[ast.expr] = []
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.value, ast.List):
        calls = list(stmt.value.elts)
    elif (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and stmt.value.func.attr == "append"
    ):
        calls = list(stmt.value.args)
    if not calls or depth >= MAX_DEPTH:
        return False
    for call in calls:
        if not isinstance(call, ast.Call):
            return False
        cls = ev.expr(call.func, scope).value
        if not isinstance(cls, ClassRef) or not _disables_itself(ev, cls, call, scope, facts):
            return False
    return True


def _disables_itself(
    ev: Evaluator, cls: ClassRef, call: ast.Call, scope: Scope, facts: list[Val]
) -> bool:
    """C's `__init__` sets `self.<flag> = True`, then returns under a test true on this
    host before any `self.<flag> = False`, and C's `__call__` returns at once while the
    flag is set."""
    info = ev.index.files[cls.fi].classes.get(cls.name)
    if info is None or "__init__" not in info.methods or "__call__" not in info.methods:
        return False
    init = _method(ev, cls, info.methods["__init__"])
    entry = _method(ev, cls, info.methods["__call__"])
    if (
        init is None
        or entry is None
        or not init.args.args
        or len(call.args) > len(init.args.args) - 1
    ):
        return False
    me = Scope(cls.fi, cls=cls, owner=Instance(cls))
    for param, arg in zip(init.args.args[1:], call.args, strict=False):
        me.locals[param.arg] = ev.expr(arg, scope)
    flag: str | None = None
    for stmt in init.body:
        if flag is None:
            flag = _sets_self(stmt, True)
            continue
        if _sets_self(stmt, False) == flag:
            return False
        if any(isinstance(n, ast.Raise) for n in ast.walk(stmt)):
            return False
        if isinstance(stmt, ast.If) and any(isinstance(s, ast.Return) for s in stmt.body):
            test = ev.expr(_selfless(stmt.test, me), me)
            if test.truth() is True:
                facts.append(test)
                return _guarded_entry(entry, flag)
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            value = ev.expr(_selfless(stmt.value, me), me)
            assign(me, [_selfless(stmt.targets[0], None)], value)
    return False


def _selfless(node: ast.expr, scope: Scope | None) -> ast.expr:
    """`self.x` as a local named `self.x`, so that what `__init__` assigned to it is known
    (every one in an assignment's target, `scope=None`; else those assigned so far)."""

    class Rename(ast.NodeTransformer):
        def visit_Attribute(self, n: ast.Attribute) -> ast.AST:
            if (
                isinstance(n.value, ast.Name)
                and n.value.id == "self"
                and (scope is None or f"self.{n.attr}" in scope.locals)
            ):
                return ast.copy_location(ast.Name(id=f"self.{n.attr}", ctx=n.ctx), n)
            return self.generic_visit(n)

    renamed: ast.expr = Rename().visit(copy.deepcopy(node))
    return renamed


def _method(ev: Evaluator, cls: ClassRef, ni: int) -> ast.FunctionDef | None:
    fn = ev.index.files[cls.fi].funcs[ni]
    stmts = ev.reader.unit(cls.fi, fn.start, fn.end)
    node = stmts[0] if stmts else None
    return node if isinstance(node, ast.FunctionDef) else None


def _sets_self(stmt: ast.stmt, value: bool) -> str | None:
    """`self.<name> = True` (or False): the name."""
    if (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Attribute)
        and isinstance(stmt.targets[0].value, ast.Name)
        and stmt.targets[0].value.id == "self"
        and isinstance(stmt.value, ast.Constant)
        and stmt.value.value is value
    ):
        return stmt.targets[0].attr
    return None


def _guarded_entry(entry: ast.FunctionDef, flag: str) -> bool:
    """The entry point's first statement is `if self.<flag>: ... return`."""
    body = [
        s for s in entry.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    first = body[0] if body else None
    return (
        isinstance(first, ast.If)
        and isinstance(first.test, ast.Attribute)
        and first.test.attr == flag
        and isinstance(first.test.value, ast.Name)
        and first.test.value.id == "self"
        and isinstance(first.body[-1], ast.Return)
    )


def logs(stmt: ast.stmt) -> bool:
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    func = call.func if isinstance(call, ast.Call) else None
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in LOG_CALLS
