"""Argument resolution rewriting the edited setting: it turns the setting off again on this
host (`if x.f and not is_sm90(): x.f = False`), replaces it at every launch (a method of
`__post_init__` that sets it whatever the command says), or, when it is left out, picks the
edited value anyway (`if x.f is None: x.f = <the platform's pick>`). Each makes the edit a
NO-OP on this host."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from flagtrial.gates.capability import Evaluator
from flagtrial.gates.model import GateFinding, Outcome
from flagtrial.gates.paths import Walker
from flagtrial.gates.reads import declaration_read, equal, statement_kind
from flagtrial.gates.sites import ReadSite, all_hold
from flagtrial.gates.values import UNKNOWN, ClassRef, Instance, Scope, Val, assign
from flagtrial.sourceread.fields import UNSET

if TYPE_CHECKING:
    from flagtrial.gates.analysis import Analysis


def resets(a: Analysis, site: ReadSite) -> bool:
    """`if <field set> and <not this GPU>: <field> = default` in code that runs at every
    launch: the engine undoes the edit here, so nothing later sees it."""
    stmt = site.stmt
    hook = a.platform_hook(site.fi, site.node.lineno)
    # In the platform's own hook a bare `if x.f: x.f = False` is this platform's doing.
    bare = hook and isinstance(stmt, ast.If) and stmt.test is site.node and site.ctx is None
    if not (
        site.runs_at_startup
        and isinstance(stmt, ast.If)
        and (
            bare
            or (
                site.ctx is not None
                and stmt.test is site.context
                and site.ctx.new.truth() is True
                and (site.ctx.new.hw or hook)
            )
        )
        and all_hold(g.holds_new for g in site.guards if not g.assumed) is True
    ):
        return False
    writes: dict[str, ast.expr] = {}
    kinds = {statement_kind(s, writes, a.index.table.fields) for s in stmt.body}
    if "effect" in kinds or "raise" in kinds or site.field not in writes:
        return False
    value = Evaluator(a.index, a.reader, a.host, a.new, model=a.model, env=a.env).expr(
        writes[site.field], site.scope_new
    )
    if not value.known:
        return False
    # Back to the default, or switched off (`self.fuse_x = False`).
    off = value.value in (False, None) and bool(a.new[site.field].value)
    return off or equal(value.value, a.old[site.field].value)


def overwritten(a: Analysis, walker: Walker) -> GateFinding | None:
    """`def _handle_amd_specifics(self): if is_hip(): self.f = 16`, called at the top
    level of `__post_init__`, every test true on this host: the edited setting is
    replaced at every launch. Only when argument resolution reads it nowhere else (such
    a read could act before the write) and the edit sets nothing else."""
    name = a.dest
    if a.edited != {name}:
        return None
    startup_reads = [
        r for r in walker.reads if r.runs_at_startup and not declaration_read(r, a.index.table)
    ]
    if startup_reads:
        return None
    ev = Evaluator(a.index, a.reader, a.host, a.new, model=a.model, env=a.env)
    for fi, _, start, end in a.index.mentions.get(name, []):
        if not a.startup_file(fi):
            continue
        fn = next((f for f in a.index.files[fi].funcs if f.start == start), None)
        stmts = a.reader.unit(fi, start, end)
        if fn is None or fn.cls is None or not stmts:
            continue
        node = stmts[0]
        if not isinstance(node, ast.FunctionDef) or not _called_at_init(a, ev, fi, fn.cls, fn.name):
            continue
        found = _unconditional_write(ev, Scope(fi), node.body, name)
        if found is None:
            continue
        write, tests = found
        for test, val in tests:
            a.chain.value(fi, test, val)
        a.chain.add("gate", fi, write.lineno, f"sets {name} whatever the command says")
        return a.finding(
            Outcome.NO_OP,
            f"{a.index.files[fi].path}:{write.lineno} ({fn.name}(), run by __post_init__)"
            f" replaces {name} at every launch on this host",
        )
    return None


def _called_at_init(a: Analysis, ev: Evaluator, fi: int, cls: str, method: str) -> bool:
    """`self.<method>()` is a top-level statement of the class's `__post_init__`, with
    no return before it but under a test false with this command (`if
    self.model_path.lower() in ["none", "dummy"]: return`)."""
    info = a.index.files[fi].classes.get(cls)
    if info is None or "__post_init__" not in info.methods:
        return False
    init = a.index.files[fi].funcs[info.methods["__post_init__"]]
    stmts = a.reader.unit(fi, init.start, init.end)
    if not stmts or not isinstance(stmts[0], ast.FunctionDef):
        return False
    for stmt in stmts[0].body:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == method
            and isinstance(call.func.value, ast.Name)
            and call.func.value.id == "self"
        ):
            return True
        if any(isinstance(n, ast.Return) for n in ast.walk(stmt)):
            skipped = (
                isinstance(stmt, ast.If)
                and not stmt.orelse
                and ev.expr(stmt.test, Scope(fi)).truth() is False
            )
            if not skipped:
                return False
    return False


def platform_choice(a: Analysis, walker: Walker) -> tuple[ReadSite, Val] | None:
    """`if x.f is None: x.f = <the platform's pick>` in argument resolution, taken only
    without the edit, picking the edited value on this host: the edit changes nothing.
    The pick is computed with the command's other settings and every other setting at
    its declared default."""
    name = a.dest
    new, old = a.new[name].value, a.old[name].value
    if new is UNSET or equal(new, old):
        return None
    ev = a.platform_evaluator()
    for site in walker.reads:
        stmt = site.stmt
        if (
            site.field != name
            or not site.runs_at_startup
            or site.ctx is None
            or site.scope_old is None
            or not isinstance(stmt, ast.If)
            or stmt.test is not site.context
            or site.ctx.new.truth() is not False
            or ev.expr(stmt.test, site.scope_old).truth() is not True
            or all_hold(g.holds(ev.expr(g.node, site.scope_old)) for g in site.guards) is not True
        ):
            continue
        value = _picked(ev, stmt.body, _method_scope(a, ev, site, site.scope_old), name)
        if value is not None and value.known and equal(value.value, new):
            return site, value
    return None


def _method_scope(a: Analysis, ev: Evaluator, site: ReadSite, scope: Scope) -> Scope:
    """The read's scope with `self` the instance of the class whose method holds it, so
    that `self._get_default_attn_backend(...)` is followed (server_args.py, 0.5.10);
    locals the walk could not know without `self` (`x = self.use_mla_backend()`, in
    the method's own body before the read) are evaluated again with it."""
    out = scope.snapshot()
    funcs = [
        f for f in a.index.files[site.fi].funcs if f.cls and f.start <= site.node.lineno <= f.end
    ]
    if not funcs:
        return out
    fn = max(funcs, key=lambda f: f.start)
    if "staticmethod" in fn.decorators or "classmethod" in fn.decorators:
        return out
    stmts = a.reader.unit(site.fi, fn.start, fn.end)
    node = stmts[0] if stmts else None
    if not isinstance(node, ast.FunctionDef) or not node.args.args:
        return out
    assert fn.cls is not None
    cls = ClassRef(site.fi, fn.cls)
    out.cls, out.owner = cls, Instance(cls)
    me = node.args.args[0].arg
    out.locals[me] = Val(out.owner)
    for stmt in node.body:
        if (stmt.end_lineno or stmt.lineno) >= site.stmt.lineno:
            break  # the statement that holds the read, or one after it
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
        ):
            local = out.locals.get(stmt.targets[0].id)
            if not isinstance(local, Val) or not local.known:
                out.locals[stmt.targets[0].id] = ev.expr(stmt.value, out)
        else:
            # a branch or loop may rebind a local (`self.x = ...` rebinds no `self`)
            for name in a.reader.stores(stmt) - {me}:
                out.locals[name] = Val(UNKNOWN)
    return out


def _picked(ev: Evaluator, body: list[ast.stmt], scope: Scope, name: str) -> Val | None:
    """The value a resolution branch gives field `name`: `return {"name": v}`,
    `x.name = v`, `overrides["name"] = v` or `declare_resolution(x, "why", name=v)`, after
    its local assignments."""
    for stmt in body:
        if isinstance(stmt, ast.Assign):
            target = stmt.targets[0]
            if (isinstance(target, ast.Attribute) and target.attr == name) or (
                isinstance(target, ast.Subscript)
                and isinstance(target.slice, ast.Constant)
                and target.slice.value == name
            ):
                return ev.expr(stmt.value, scope)
            assign(scope, stmt.targets, ev.expr(stmt.value, scope))
        elif isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.Dict):
            for key, value in zip(stmt.value.keys, stmt.value.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == name:
                    return ev.expr(value, scope)
            return None
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            for kw in stmt.value.keywords:
                if kw.arg == name:
                    return ev.expr(kw.value, scope)
        else:
            return None
    return None


def _unconditional_write(
    ev: Evaluator, scope: Scope, body: list[ast.stmt], name: str
) -> tuple[ast.stmt, list[tuple[ast.expr, Val]]] | None:
    """`self.<name> = <constant>` reached through `if` bodies whose tests are true on this
    host (and read nothing of the edit), with nothing before it that may return or raise:
    the write and the tests."""
    for stmt in body:
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Attribute)
            and stmt.targets[0].attr == name
            and isinstance(stmt.value, ast.Constant)
        ):
            return stmt, []
        if isinstance(stmt, ast.If) and not any(
            isinstance(n, ast.Attribute) and n.attr == name for n in ast.walk(stmt.test)
        ):
            inner = _unconditional_write(ev, scope, stmt.body, name)
            if inner is not None:
                val = ev.expr(stmt.test, scope)
                if val.truth() is True and val.hw:
                    return inner[0], [(stmt.test, val), *inner[1]]
                return None
        if any(isinstance(n, ast.Return | ast.Raise) for n in ast.walk(stmt)):
            return None
    return None
