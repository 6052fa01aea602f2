"""Following the engine's own definitions: a name to what its module binds it to (imports,
module-level assignments such as `lru_cache(...)(partial(f, ...))`, star imports, the
platform object), classes and their bases, enum members, a `__getattr__` probe table; and a
function's body interpreted over known values (its parameters bound, its branches taken
where decided)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from flagtrial.gates.compare import BUILTINS, EXTERNAL
from flagtrial.gates.platforms import EXTRA_PLATFORMS
from flagtrial.gates.probes import primitive_attr
from flagtrial.gates.values import (
    UNKNOWN,
    Builtin,
    ClassRef,
    EnumMember,
    FuncRef,
    ModuleRef,
    Scope,
    Trace,
    Val,
    assign,
    derived,
    same,
)
from flagtrial.sourceread.common import absolute

if TYPE_CHECKING:
    from flagtrial.gates.capability import Evaluator

_MAX_LINES = 120  # longer functions are not capability probes: not interpreted


def global_name(ev: Evaluator, fi: int, name: str) -> Val:
    """A module-level name of file `fi`, as its definition says (memoized)."""
    key = (fi, name)
    if key in ev.globals_memo:
        return ev.globals_memo[key]
    if key in ev.active:
        return Val(UNKNOWN)
    ev.active.add(key)
    try:
        val = _global_name(ev, fi, name)
    finally:
        ev.active.discard(key)
    ev.globals_memo[key] = val
    return val


def _global_name(ev: Evaluator, fi: int, name: str) -> Val:
    info = ev.index.files[fi]
    ni = ev.index.top_level(fi, name)
    if ni is not None and name not in info.assigns:
        return Val(FuncRef(fi, ni))
    if name in info.classes and name not in info.assigns:
        return Val(ClassRef(fi, name))
    sites = info.assigns.get(name)
    if sites:
        start, end, conditional = sites[0]
        if len(sites) > 1 or conditional:
            return Val(UNKNOWN)  # assigned in branches: which one is not known here
        return _assigned(ev, fi, start, end, name)
    if name in info.imports:
        return import_target(ev, info.imports[name])
    for module in info.stars:
        target = ev.index.modules.get(module)
        if target is not None:
            val = global_name(ev, target, name)
            if val.known:
                return val
    platform_obj = ev.index.layout.platform_objects.get(name)
    if platform_obj and info.module == platform_obj[0]:
        return _platform_object(ev, name)
    if name in BUILTINS:
        return Val(Builtin(name))
    return Val(UNKNOWN)


def _platform_object(ev: Evaluator, name: str) -> Val:
    """vLLM's `current_platform` is chosen at run time by plugin discovery: bind it to
    the class the host's runtime selects (`CudaPlatform` on CUDA)."""
    module, classes = ev.index.layout.platform_objects[name]
    qual = classes.get(ev.host.platform) or EXTRA_PLATFORMS.get(ev.host.platform)
    if qual is None or not qual.startswith(module):
        return Val(UNKNOWN)
    mod, cls = qual.split(":")
    fi = ev.index.modules.get(mod)
    if fi is None or cls not in ev.index.files[fi].classes:
        return Val(UNKNOWN)
    start = ev.index.files[fi].classes[cls].start
    note = f"{module}.{name} on a {ev.host.platform} host is {cls}"
    return Val(ClassRef(fi, cls), True, (("helper", fi, start, note),))


def import_target(ev: Evaluator, target: str) -> Val:
    module, _, name = target.partition(":")
    if not name:
        return Val(ModuleRef(module))
    sub = f"{module}.{name}"
    if sub in ev.index.modules:
        return Val(ModuleRef(sub))
    fi = ev.index.modules.get(module)
    if fi is not None:
        return global_name(ev, fi, name)
    if sub in EXTERNAL:
        return Val(Builtin(EXTERNAL[sub]))
    return Val(ModuleRef(sub))


def _assigned(ev: Evaluator, fi: int, start: int, end: int, name: str) -> Val:
    stmts = ev.reader.unit(fi, start, end)
    if not stmts:
        return Val(UNKNOWN)
    stmt = stmts[0]
    value = getattr(stmt, "value", None)
    if value is None:
        return Val(UNKNOWN)
    val = ev.expr(value, Scope(fi))
    if isinstance(val.value, FuncRef) and val.value.origin is None:
        origin: Trace = ("helper", fi, start, f"{name} is defined here")
        val = replace(val, value=replace(val.value, origin=origin))
    if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Tuple):
        return Val(UNKNOWN)
    return val


def module_attr(ev: Evaluator, module: ModuleRef, attr: str) -> Val:
    sub = f"{module.name}.{attr}"
    if sub in ev.index.modules:
        return Val(ModuleRef(sub))
    fi = ev.index.modules.get(module.name)
    if fi is not None:
        return global_name(ev, fi, attr)
    prim = primitive_attr(ev, sub)
    if prim is not None:
        return prim
    if sub in EXTERNAL:
        return Val(Builtin(EXTERNAL[sub]))
    return Val(ModuleRef(sub))


# ----------------------------------------------------------------- classes


def mro(
    ev: Evaluator, cls: ClassRef, seen: frozenset[ClassRef] = frozenset()
) -> Iterator[ClassRef]:
    yield cls
    info = ev.index.files[cls.fi].classes.get(cls.name)
    if info is None:
        return
    for base in info.bases:
        head, *rest = base.split(".")
        val = global_name(ev, cls.fi, head)
        for part in rest:
            val = ev.attribute(val, part)
        if isinstance(val.value, ClassRef) and val.value not in seen:
            yield from mro(ev, val.value, seen | {cls})


def is_enum(ev: Evaluator, cls: ClassRef) -> bool:
    for c in mro(ev, cls):
        info = ev.index.files[c.fi].classes.get(c.name)
        if info and any(b.rsplit(".", 1)[-1].endswith("Enum") for b in info.bases):
            return True
    return False


def class_attr(ev: Evaluator, cls: ClassRef, attr: str, owner: Any) -> Val:
    if is_enum(ev, cls) and not attr.startswith("_"):
        enum = ev.index.files[cls.fi].classes[cls.name]
        if attr in enum.attrs:
            return Val(EnumMember(cls.name, attr, _mixin_value(ev, cls, *enum.attrs[attr])))
    for c in mro(ev, cls):
        info = ev.index.files[c.fi].classes.get(c.name)
        if info is None:
            continue
        if attr in info.methods:
            ni = info.methods[attr]
            fn = ev.index.files[c.fi].funcs[ni]
            ref = FuncRef(c.fi, ni, owner=owner if "staticmethod" not in fn.decorators else None)
            if "property" in fn.decorators or "cached_property" in fn.decorators:
                return ev.apply(Val(ref), [], {})
            return Val(ref)
        if attr in info.attrs:
            start, end = info.attrs[attr]
            stmts = ev.reader.unit(c.fi, start, end)
            value = getattr(stmts[0], "value", None) if stmts else None
            if value is not None:
                return ev.expr(value, Scope(c.fi, cls=c, owner=owner))
            return Val(UNKNOWN)
    return _probe_table(ev, cls, attr)


def _mixin_value(ev: Evaluator, cls: ClassRef, start: int, end: int) -> Any:
    """A member's literal value in an enum that mixes in str or int, else UNKNOWN."""
    mixins = {"str": str, "int": int, "StrEnum": str, "IntEnum": int}
    kinds = {
        mixins[b.rsplit(".", 1)[-1]]
        for c in mro(ev, cls)
        for b in getattr(ev.index.files[c.fi].classes.get(c.name), "bases", ())
        if b.rsplit(".", 1)[-1] in mixins
    }
    stmts = ev.reader.unit(cls.fi, start, end)
    value = getattr(stmts[0], "value", None) if stmts else None
    if len(kinds) == 1 and isinstance(value, ast.Constant):
        kind = kinds.pop()
        if type(value.value) is kind:
            return value.value
    return UNKNOWN


def _probe_table(ev: Evaluator, cls: ClassRef, attr: str) -> Val:
    """A class whose `__getattr__` maps names through a module-level dict of strings to
    functions (SGLang's `get_platform().is_sm90` -> `is_sm90_supported()`)."""
    key = ("probe", cls, attr)
    if key not in ev.memo:
        ev.memo[key] = _probe(ev, cls, attr)
    return ev.memo[key]


def _probe(ev: Evaluator, cls: ClassRef, attr: str) -> Val:
    for c in mro(ev, cls):
        info = ev.index.files[c.fi].classes.get(c.name)
        if info is None or "__getattr__" not in info.methods:
            continue
        fn = ev.index.files[c.fi].funcs[info.methods["__getattr__"]]
        modules, tables = ev.reader.getattr_tables(c.fi, fn.start, fn.end)
        for table_name in tables:
            table = global_name(ev, c.fi, table_name)
            target = table.value.get(attr) if isinstance(table.value, dict) else None
            if not isinstance(target, str):
                continue
            func = _named_function(ev, target, modules)
            if func is None:
                return Val(UNKNOWN)
            site = ev.index.files[c.fi].assigns[table_name][0]
            note = f".{attr} -> {target}()"
            result = ev.apply(func, [], {})
            if result.hw:
                result = derived(
                    result.value, result, Val(None, True, (("helper", c.fi, site[0], note),))
                )
            return result
    return Val(UNKNOWN)


def _named_function(ev: Evaluator, name: str, modules: list[str]) -> Val | None:
    for module in modules:
        for candidate in (module, *(f"{module}.{m}" for m in ("common",))):
            fi = ev.index.modules.get(candidate)
            if fi is not None:
                val = global_name(ev, fi, name)
                if val.known:
                    return val
    refs = [r for r in ev.index.defs.get(name, []) if ev.index.func(r).top]
    return Val(FuncRef(*refs[0])) if len(refs) == 1 else None


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


def bind_import(ev: Evaluator, scope: Scope, stmt: ast.Import | ast.ImportFrom) -> None:
    """A function-local import binds names like a module-level one would."""
    if isinstance(stmt, ast.Import):
        for alias in stmt.names:
            name = alias.asname or alias.name.split(".")[0]
            scope.locals[name] = Val(ModuleRef(alias.name if alias.asname else name))
        return
    info = ev.index.files[scope.fi]
    module = absolute(info.module, info.path.endswith("__init__.py"), stmt.level, stmt.module)
    for alias in stmt.names:
        if alias.name != "*":
            scope.locals[alias.asname or alias.name] = import_target(ev, f"{module}:{alias.name}")


def _assigned_names(stmts: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names
