"""Following the engine's own definitions: a name to what its module binds it to (imports,
module-level assignments such as `lru_cache(...)(partial(f, ...))`, star imports, the
platform object), classes and their bases, enum members, a `__getattr__` probe table (a
function's body is interpreted in interpret.py)."""

from __future__ import annotations

import ast
import re
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
    derived,
)
from flagtrial.sourceread.modules import absolute

if TYPE_CHECKING:
    from flagtrial.gates.capability import Evaluator


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
    sites = [s for s in info.assigns.get(name, []) if not _type_only(ev, fi, s)]
    if sites:
        start, end, conditional = sites[0]
        if len(sites) > 1 or conditional or _rebound(ev, fi, name):
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
    return _module_getattr(ev, fi, name)


_GLOBAL = re.compile(r"^\s+global\s+([\w\s,]+?)\s*(?:#.*)?$")


def _rebound(ev: Evaluator, fi: int, name: str) -> bool:
    """A function of the module rebinds the name at run time (`global _current_vllm_config`
    in `set_current_vllm_config`): its module-level value is only the initial one."""
    for line in ev.reader.lines(fi):
        m = _GLOBAL.match(line)
        if m and name in (n.strip() for n in m.group(1).split(",")):
            return True
    return False


def _type_only(ev: Evaluator, fi: int, site: tuple[int, int, bool]) -> bool:
    """An assignment inside a top-level `if TYPE_CHECKING:`: it never runs."""
    start, _, conditional = site
    if not conditional:
        return False
    lines = ev.reader.lines(fi)
    for text in reversed(lines[: start - 1]):
        if text[:1] not in ("", " ", "\t", "#", "\n", "\r"):
            return text.split("#")[0].strip() in ("if TYPE_CHECKING:", "if typing.TYPE_CHECKING:")
    return False


def _module_getattr(ev: Evaluator, fi: int, name: str) -> Val:
    """A name the module does not bind, answered by its own `__getattr__(name)` (PEP 562:
    vLLM's `envs.VLLM_X` runs `environment_variables[name]()`, `os.getenv` with its
    default when the platform's pick is computed); UNKNOWN where there is none."""
    ni = ev.index.top_level(fi, "__getattr__")
    if ni is None or name.startswith("__"):
        return Val(UNKNOWN)
    # imported here: interpret.py imports this module
    from flagtrial.gates.interpret import interpret

    func = Val(FuncRef(fi, ni))
    return interpret(ev, func, FuncRef(fi, ni), [Val(name)], {})


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
