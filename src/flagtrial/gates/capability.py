"""Evaluating engine expressions for one host, following the engine's own definitions.

`Evaluator.expr` gives a `Val`: a Python value, or UNKNOWN when the source does not decide it
here (a model config, an environment variable, an unset field). Capability helpers are not
known by name: a call is followed into the definition it resolves to (imports, module-level
assignments such as `lru_cache(...)(partial(f, ...))`, classes and their bases, a
`__getattr__` probe table) and interpreted, down to a few host facts:

- `get_device_capability()` (torch's, SGLang's, vLLM's Platform): the compute capability;
- `get_device_sm()`: the same as an integer (SM120 is 120);
- `torch.version.cuda` / `torch.version.hip`, `torch.cuda.is_available()`, `device_count()`.

Logic is three-valued: `False and UNKNOWN` is False, `True and UNKNOWN` is UNKNOWN. A value
that depended on a host fact is marked `hw`, and carries the definitions that decided it.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from flagtrial.gates.index import SourceIndex, SourceReader
from flagtrial.gates.model import GateHost, ModelFacts
from flagtrial.gates.platforms import dependency_platforms
from flagtrial.sourceread.fields import UNSET
from flagtrial.sourceread.modules import absolute

# (role, file index or -1, line, note): a link of the evidence chain, hashable.
Trace = tuple[str, int, int, str]


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


class _NotNone:
    """A value the host has but the facts do not give (the CUDA version when not told)."""

    def __repr__(self) -> str:
        return "<some value>"


UNKNOWN: Any = _Unknown()
NOT_NONE: Any = _NotNone()


def platform_module(index: SourceIndex, platform: str) -> str | None:
    """The module of the platform class a runtime selects (`vllm.platforms.cpu` on CPU)."""
    for _, classes in index.layout.platform_objects.values():
        qual = classes.get(platform) or _EXTRA_PLATFORMS.get(platform)
        if qual:
            return qual.split(":")[0]
    return None


class Capability(tuple[int, int]):
    """vLLM's DeviceCapability and torch's (major, minor) alike: a tuple with to_int()."""

    def to_int(self) -> int:
        return self[0] * 10 + self[1]


@dataclass(frozen=True)
class FuncRef:
    fi: int
    ni: int
    bound: tuple[tuple[str, Any], ...] = ()  # functools.partial keywords
    owner: Any = None  # the instance or class a method is bound to
    origin: Trace | None = None  # where this callable got its name (`x = partial(...)`)


@dataclass(frozen=True)
class ClassRef:
    fi: int
    name: str


@dataclass(frozen=True)
class Instance:
    cls: ClassRef


@dataclass(frozen=True)
class ModuleRef:
    name: str


@dataclass(frozen=True)
class EnumMember:
    cls: str
    name: str


@dataclass(frozen=True)
class Builtin:
    name: str
    bound: Any = None  # the receiver of a bound str/dict/tuple method


@dataclass(frozen=True)
class DeviceProps:
    """torch.cuda.get_device_properties(i): the facts the host gives, the rest unknown."""

    host: GateHost

    def attr(self, name: str) -> Any:
        cap = self.host.capability
        if name in ("major", "minor") and cap:
            return cap[0] if name == "major" else cap[1]
        if name == "gcnArchName":
            return (self.host.gfx or UNKNOWN) if self.host.platform == "rocm" else ""
        if name == "name":
            return self.host.gpu_name or UNKNOWN
        return UNKNOWN


@dataclass(frozen=True, eq=False)
class ModelView:
    """The engine's model config object (`model_config`, `hf_config`) for a known config.json:
    what the file says, and what the engine derives from it (MLA, MoE, the checkpoint's
    quantization). Attributes the file does not give are unknown."""

    facts: ModelFacts
    hf: bool  # the raw HF config rather than the engine's ModelConfig

    def attr(self, name: str) -> Any:
        f = self.facts
        if name in ("hf_config", "hf_text_config"):
            return ModelView(f, True)
        if name == "architectures":
            return f.architectures
        if not self.hf:
            derived = {
                "attention_arch": EnumMember("AttentionArch", "MLA" if f.mla else "MHA"),
                "use_mla": f.mla,
                "use_mla_backend": f.mla,
                "is_deepseek_mla": f.mla,
                "is_moe": f.moe,
                "quantization": f.quant_method,
                "has_attention_sinks": f.sinks,
                "has_asymmetric_kv": f.asymmetric_kv,
            }
            if name in derived:
                return derived[name]
        value = f.config.get(name, UNKNOWN)
        return value if _plain(value) else UNKNOWN


# helper name -> what it tells of the model (the engine reads the model's config through it)
_MODEL_PROBES = {"use_mla_backend": "mla", "model_config_of": "view", "get_model_config": "view"}
# the class both engines build from the model's config.json (vllm/config/model.py,
# sglang/srt/configs/model_config.py)
MODEL_CONFIG_CLASS = "ModelConfig"
# attributes that name the model config object whatever holds it (`runner.model_config`)
_MODEL_ATTRS = {"model_config", "hf_config", "hf_text_config", "use_mla_backend"}


@dataclass(frozen=True)
class Val:
    value: Any
    hw: bool = False
    traces: tuple[Trace, ...] = ()

    @property
    def known(self) -> bool:
        return self.value is not UNKNOWN

    def truth(self) -> bool | None:
        """True, False, or None when unknown."""
        v = self.value
        if v is UNKNOWN:
            return None
        if v is NOT_NONE:
            return True
        try:
            return bool(v)
        except Exception:
            return None


def _join(*vals: Val) -> tuple[bool, tuple[Trace, ...]]:
    hw = any(v.hw for v in vals)
    traces: tuple[Trace, ...] = ()
    for v in vals:
        traces += tuple(t for t in v.traces if t not in traces)
    return hw, traces


def _derived(value: Any, *vals: Val) -> Val:
    hw, traces = _join(*vals)
    return Val(value, hw, traces)


_BUILTINS = {
    "isinstance",
    "tuple",
    "list",
    "map",
    "int",
    "str",
    "float",
    "bool",
    "len",
    "any",
    "all",
    "min",
    "max",
    "hasattr",
    "dict",
    "getattr",
    "set",
    "frozenset",
    "sorted",
}
_EXTERNAL = {
    "functools.partial": "partial",
    "functools.lru_cache": "lru_cache",
    "functools.cache": "lru_cache",
    "functools.wraps": "lru_cache",
    "functools.cached_property": "property",
}
COMPARISONS: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_BINOP: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Div: operator.truediv,
}
_STR_METHODS = {"split", "startswith", "endswith", "lower", "upper", "strip", "get", "index"}
# vLLM reads the gfx architecture through amdsmi first: a probe of the host's fact.
_GCN_ARCH_PROBES = {"_get_gcn_arch", "_query_gcn_arch_from_amdsmi", "get_gcn_arch"}
# Runtimes the engine layout does not bind a platform class for.
_EXTRA_PLATFORMS = {"cpu": "vllm.platforms.cpu:CpuPlatform"}
_MAX_LINES = 120  # longer functions are not capability probes: not interpreted
_PLAIN = (bool, int, float, str, type(None), tuple, Capability, frozenset)


class Lazy:
    """A local bound to an expression, evaluated only if something reads it."""

    __slots__ = ("_val", "ev", "item", "node", "scope")

    def __init__(self, ev: Evaluator, node: ast.expr, scope: Scope, item: int | None = None):
        self.ev, self.node, self.scope, self.item = ev, node, scope, item
        self._val: Val | None = None

    def force(self) -> Val:
        if self._val is None:
            self._val = Val(UNKNOWN)  # a self-reference while evaluating stays unknown
            val = self.ev.expr(self.node, self.scope)
            if self.item is not None:
                items = val.value if isinstance(val.value, tuple) else None
                val = _derived(
                    items[self.item] if items and self.item < len(items) else UNKNOWN, val
                )
            self._val = val
        return self._val


@dataclass
class Scope:
    fi: int
    locals: dict[str, Val | Lazy] = field(default_factory=dict)
    cls: ClassRef | None = None  # for super() and class attributes
    owner: Any = None  # what `self` / `cls` is
    # Walked as part of argument resolution: a setting no binding gives reads as its
    # declared default there (the command leaves it out).
    startup: bool = False

    def snapshot(self) -> Scope:
        return Scope(self.fi, dict(self.locals), self.cls, self.owner, self.startup)


@dataclass(frozen=True)
class FieldBinding:
    """A field's value in this evaluation, optionally only through a receiver named like
    `attention_config` (vLLM's `AttentionConfig.backend` is too common a name otherwise)."""

    value: Any
    receiver: str | None = None


class Evaluator:
    """Evaluates expressions of one engine version for one host and one set of field values.

    Not shared between threads: each query makes its own (the index and reader are shared).
    """

    def __init__(
        self,
        index: SourceIndex,
        reader: SourceReader,
        host: GateHost,
        fields: dict[str, FieldBinding],
        budget: int = 3000,
        model: ModelFacts | None = None,
        defaults: dict[str, Any] | None = None,
        resolution_defaults: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        # Declared defaults of the settings the command leaves out, read in argument
        # resolution only (elsewhere a name like `page_size` may be anything's).
        self.resolution_defaults = resolution_defaults or {}
        self._in_startup = False
        # Set for computing what the platform picks: settings the command leaves out keep
        # their declared defaults, environment variables theirs, and the engine's own
        # dependencies for this platform are installed.
        self.defaults = defaults
        self.index = index
        self.reader = reader
        self.host = host
        self.fields = fields
        self.budget = budget
        self._globals: dict[tuple[int, str], Val] = {}
        self._memo: dict[Any, Val] = {}
        self._active: set[Any] = set()
        self._depth = 0

    # ----------------------------------------------------------------- host facts

    def _fact(self, value: Any, note: str) -> Val:
        return Val(value, True, (("fact", -1, 0, note),))

    def _cap_note(self) -> str:
        cap = self.host.capability
        return "host compute capability " + ("{}.{}".format(*cap) if cap else "unknown")

    def _primitive_call(self, node: ast.Call, scope: Scope) -> Val | None:
        func = node.func
        last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        host = self.host
        if last in ("get_device_capability", "get_device_sm") and host.gpu_count == 0:
            return self._fact(None, "host has no GPU")
        if last == "get_device_capability":
            cap = host.capability
            return self._fact(Capability(cap) if cap else UNKNOWN, self._cap_note())
        if last == "get_device_sm":
            cap = host.capability
            return self._fact(cap[0] * 10 + cap[1] if cap else UNKNOWN, self._cap_note())
        dotted = self._external_name(func, scope)
        if dotted == "torch.cuda.is_available":
            return self._fact(host.gpu_count > 0, f"host has {host.gpu_count} GPU(s)")
        if dotted == "torch.cuda.device_count":
            return self._fact(host.gpu_count, f"host has {host.gpu_count} GPU(s)")
        if dotted == "torch.cuda.get_device_name":
            return self._fact(host.gpu_name or UNKNOWN, "host GPU name")
        if self.defaults is not None:
            assumed = self._assumed_call(dotted, node, scope)
            if assumed is not None:
                return assumed
        if last in _GCN_ARCH_PROBES and host.platform == "rocm":
            return self._fact(host.gfx or UNKNOWN, "host gfx architecture")
        if dotted in ("torch.backends.mps.is_available", "torch.mps.is_available"):
            return self._fact(False, f"host runtime is {host.platform}")
        if dotted == "torch.cuda.get_device_properties":
            return self._fact(DeviceProps(host), "host GPU properties")
        return None

    def _assumed_call(self, dotted: str | None, node: ast.Call, scope: Scope) -> Val | None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "is_out_of_tree":
            return Val(False, True, (("fact", -1, 0, "no out-of-tree platform plugin"),))
        if dotted in ("os.getenv", "os.environ.get") and len(node.args) >= 1:
            default = node.args[1] if len(node.args) > 1 else None
            val = self.expr(default, scope) if default is not None else Val(None)
            return Val(val.value, True, (("fact", -1, 0, "environment variables unset"),))
        if dotted == "importlib.util.find_spec" and node.args:
            name = self.expr(node.args[0], scope).value
            if isinstance(name, str):
                installed = self.host.platform in dependency_platforms(name.split(".")[0])
                note = f"{name} {'is' if installed else 'is not'} installed on {self.host.platform}"
                return Val(NOT_NONE if installed else None, True, (("fact", -1, 0, note),))
        return None

    def _primitive_attr(self, dotted: str) -> Val | None:
        host = self.host
        if dotted == "torch.version.cuda":
            if host.platform != "cuda":
                return self._fact(None, f"host runtime is {host.platform}")
            if host.cuda_version is None:
                return self._fact(NOT_NONE, "host CUDA version not given")
            return self._fact("{}.{}".format(*host.cuda_version), "host CUDA version")
        if dotted == "torch.version.hip":
            if host.platform != "rocm":
                return self._fact(None, f"host runtime is {host.platform}")
            if host.rocm_version is None:
                return self._fact(NOT_NONE, "host runtime is ROCm")
            return self._fact("{}.{}".format(*host.rocm_version), "host ROCm version")
        if dotted in ("torch.version.musa", "torch.version.xpu"):
            return self._fact(None, f"host runtime is {host.platform}")
        return None

    def _external_name(self, node: ast.expr, scope: Scope) -> str | None:
        """`torch.version.cuda` when the chain's head is an import of a module outside."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id in scope.locals:
            return None
        head = self.global_name(scope.fi, node.id).value
        if not isinstance(head, ModuleRef):
            return None
        return ".".join([head.name, *reversed(parts)])

    # ----------------------------------------------------------------- names

    def global_name(self, fi: int, name: str) -> Val:
        """A module-level name of file `fi`, as its definition says (memoized)."""
        key = (fi, name)
        if key in self._globals:
            return self._globals[key]
        if key in self._active:
            return Val(UNKNOWN)
        self._active.add(key)
        try:
            val = self._global_name(fi, name)
        finally:
            self._active.discard(key)
        self._globals[key] = val
        return val

    def _global_name(self, fi: int, name: str) -> Val:
        info = self.index.files[fi]
        ni = self.index.top_level(fi, name)
        if ni is not None and name not in info.assigns:
            return Val(FuncRef(fi, ni))
        if name in info.classes and name not in info.assigns:
            return Val(ClassRef(fi, name))
        sites = info.assigns.get(name)
        if sites:
            start, end, conditional = sites[0]
            if len(sites) > 1 or conditional:
                return Val(UNKNOWN)  # assigned in branches: which one is not known here
            return self._assigned(fi, start, end, name)
        if name in info.imports:
            return self._import(info.imports[name])
        for module in info.stars:
            target = self.index.modules.get(module)
            if target is not None:
                val = self.global_name(target, name)
                if val.known:
                    return val
        platform_obj = self.index.layout.platform_objects.get(name)
        if platform_obj and info.module == platform_obj[0]:
            return self._platform_object(name)
        if name in _BUILTINS:
            return Val(Builtin(name))
        return Val(UNKNOWN)

    def _platform_object(self, name: str) -> Val:
        """vLLM's `current_platform` is chosen at run time by plugin discovery: bind it to
        the class the host's runtime selects (`CudaPlatform` on CUDA)."""
        module, classes = self.index.layout.platform_objects[name]
        qual = classes.get(self.host.platform) or _EXTRA_PLATFORMS.get(self.host.platform)
        if qual is None or not qual.startswith(module):
            return Val(UNKNOWN)
        mod, cls = qual.split(":")
        fi = self.index.modules.get(mod)
        if fi is None or cls not in self.index.files[fi].classes:
            return Val(UNKNOWN)
        start = self.index.files[fi].classes[cls].start
        note = f"{module}.{name} on a {self.host.platform} host is {cls}"
        return Val(ClassRef(fi, cls), True, (("helper", fi, start, note),))

    def _import(self, target: str) -> Val:
        module, _, name = target.partition(":")
        if not name:
            return Val(ModuleRef(module))
        sub = f"{module}.{name}"
        if sub in self.index.modules:
            return Val(ModuleRef(sub))
        fi = self.index.modules.get(module)
        if fi is not None:
            return self.global_name(fi, name)
        if sub in _EXTERNAL:
            return Val(Builtin(_EXTERNAL[sub]))
        return Val(ModuleRef(sub))

    def _assigned(self, fi: int, start: int, end: int, name: str) -> Val:
        stmts = self.reader.unit(fi, start, end)
        if not stmts:
            return Val(UNKNOWN)
        stmt = stmts[0]
        value = getattr(stmt, "value", None)
        if value is None:
            return Val(UNKNOWN)
        val = self.expr(value, Scope(fi))
        if isinstance(val.value, FuncRef) and val.value.origin is None:
            origin: Trace = ("helper", fi, start, f"{name} is defined here")
            val = replace(val, value=replace(val.value, origin=origin))
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Tuple):
            return Val(UNKNOWN)
        return val

    def module_attr(self, module: ModuleRef, attr: str) -> Val:
        sub = f"{module.name}.{attr}"
        if sub in self.index.modules:
            return Val(ModuleRef(sub))
        fi = self.index.modules.get(module.name)
        if fi is not None:
            return self.global_name(fi, attr)
        prim = self._primitive_attr(sub)
        if prim is not None:
            return prim
        if sub in _EXTERNAL:
            return Val(Builtin(_EXTERNAL[sub]))
        return Val(ModuleRef(sub))

    # ----------------------------------------------------------------- classes

    def mro(self, cls: ClassRef, seen: frozenset[ClassRef] = frozenset()) -> Iterator[ClassRef]:
        yield cls
        info = self.index.files[cls.fi].classes.get(cls.name)
        if info is None:
            return
        for base in info.bases:
            head, *rest = base.split(".")
            val = self.global_name(cls.fi, head)
            for part in rest:
                val = self.attribute(val, part)
            if isinstance(val.value, ClassRef) and val.value not in seen:
                yield from self.mro(val.value, seen | {cls})

    def _is_enum(self, cls: ClassRef) -> bool:
        for c in self.mro(cls):
            info = self.index.files[c.fi].classes.get(c.name)
            if info and any(b.rsplit(".", 1)[-1].endswith("Enum") for b in info.bases):
                return True
        return False

    def class_attr(self, cls: ClassRef, attr: str, owner: Any) -> Val:
        if self._is_enum(cls) and not attr.startswith("_"):
            enum = self.index.files[cls.fi].classes[cls.name]
            if attr in enum.attrs:
                return Val(EnumMember(cls.name, attr))
        for c in self.mro(cls):
            info = self.index.files[c.fi].classes.get(c.name)
            if info is None:
                continue
            if attr in info.methods:
                ni = info.methods[attr]
                fn = self.index.files[c.fi].funcs[ni]
                ref = FuncRef(
                    c.fi, ni, owner=owner if "staticmethod" not in fn.decorators else None
                )
                if "property" in fn.decorators or "cached_property" in fn.decorators:
                    return self.apply(Val(ref), [], {})
                return Val(ref)
            if attr in info.attrs:
                start, end = info.attrs[attr]
                stmts = self.reader.unit(c.fi, start, end)
                value = getattr(stmts[0], "value", None) if stmts else None
                if value is not None:
                    return self.expr(value, Scope(c.fi, cls=c, owner=owner))
                return Val(UNKNOWN)
        return self._probe_table(cls, attr)

    def _probe_table(self, cls: ClassRef, attr: str) -> Val:
        """A class whose `__getattr__` maps names through a module-level dict of strings to
        functions (SGLang's `get_platform().is_sm90` -> `is_sm90_supported()`)."""
        key = ("probe", cls, attr)
        if key not in self._memo:
            self._memo[key] = self._probe(cls, attr)
        return self._memo[key]

    def _probe(self, cls: ClassRef, attr: str) -> Val:
        for c in self.mro(cls):
            info = self.index.files[c.fi].classes.get(c.name)
            if info is None or "__getattr__" not in info.methods:
                continue
            fn = self.index.files[c.fi].funcs[info.methods["__getattr__"]]
            modules, tables = self.reader.getattr_tables(c.fi, fn.start, fn.end)
            for table_name in tables:
                table = self.global_name(c.fi, table_name)
                target = table.value.get(attr) if isinstance(table.value, dict) else None
                if not isinstance(target, str):
                    continue
                func = self._named_function(target, modules)
                if func is None:
                    return Val(UNKNOWN)
                site = self.index.files[c.fi].assigns[table_name][0]
                note = f".{attr} -> {target}()"
                result = self.apply(func, [], {})
                if result.hw:
                    result = _derived(
                        result.value, result, Val(None, True, (("helper", c.fi, site[0], note),))
                    )
                return result
        return Val(UNKNOWN)

    def _named_function(self, name: str, modules: list[str]) -> Val | None:
        for module in modules:
            for candidate in (module, *(f"{module}.{m}" for m in ("common",))):
                fi = self.index.modules.get(candidate)
                if fi is not None:
                    val = self.global_name(fi, name)
                    if val.known:
                        return val
        refs = [r for r in self.index.defs.get(name, []) if self.index.func(r).top]
        return Val(FuncRef(*refs[0])) if len(refs) == 1 else None

    def attribute(self, base: Val, attr: str) -> Val:
        obj = base.value
        if isinstance(obj, Instance) and obj.cls.name == MODEL_CONFIG_CLASS and self.model:
            return self._model_self_attr(base, obj, attr)
        if isinstance(obj, ModuleRef | ClassRef | Instance):
            if isinstance(obj, ModuleRef):
                val = self.module_attr(obj, attr)
            else:
                val = self.class_attr(obj.cls if isinstance(obj, Instance) else obj, attr, obj)
            if not val.known and self.model is not None and attr in _MODEL_ATTRS:
                val = self._model_attr(attr)
            return _derived(val.value, base, val)
        if isinstance(obj, DeviceProps | ModelView):
            return _derived(obj.attr(attr), base)
        if self.model is not None and attr in _MODEL_ATTRS and not base.known:
            return _derived(self._model_attr(attr).value, base, self._model_attr(attr))
        if isinstance(obj, Capability) and attr in ("major", "minor"):
            return _derived(obj[0] if attr == "major" else obj[1], base)
        if isinstance(obj, Capability) and attr == "to_int":
            return _derived(Builtin("to_int", obj), base)
        if isinstance(obj, EnumMember) and attr == "name":
            return _derived(obj.name, base)
        if isinstance(obj, str | dict | tuple) and attr in _STR_METHODS:
            return _derived(Builtin(attr, obj), base)
        return Val(UNKNOWN)

    def _model_self_attr(self, base: Val, obj: Instance, attr: str) -> Val:
        """`self.x` in a method of the engine's ModelConfig for a known model: what the
        config.json says or the engine derives from it (`is_moe`), or a method; a setting
        stored on it stays unknown (argument resolution may have written it)."""
        assert self.model is not None
        fact = ModelView(self.model, False).attr(attr)
        if fact is not UNKNOWN:
            return _derived(fact, base, self._model_fact("view"))
        val = self.class_attr(obj.cls, attr, obj)
        return _derived(val.value if isinstance(val.value, FuncRef) else UNKNOWN, base)

    def model_self(self, fi: int, cls: str | None) -> Val | None:
        """`self` of a method of the engine's ModelConfig class, when the model is known."""
        if self.model is None or cls != MODEL_CONFIG_CLASS:
            return None
        return Val(Instance(ClassRef(fi, cls)))

    # ----------------------------------------------------------------- expressions

    def field_value(self, node: ast.expr) -> Val | None:
        """The bound value when `node` reads a field of this evaluation (`x.f`, getattr)."""
        if isinstance(node, ast.Attribute):
            binding = self.fields.get(node.attr)
            if binding and (binding.receiver is None or _tail(node.value) == binding.receiver):
                return Val(UNKNOWN if binding.value is UNSET else binding.value)
            if self.defaults is not None and node.attr in self.defaults:
                return Val(self.defaults[node.attr])
            if self._in_startup and node.attr in self.resolution_defaults:
                return Val(self.resolution_defaults[node.attr])
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", "") == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
        ):
            binding = self.fields.get(str(node.args[1].value))
            if binding and binding.receiver is None:
                return Val(UNKNOWN if binding.value is UNSET else binding.value)
        return None

    def expr(self, node: ast.expr, scope: Scope) -> Val:
        if self._depth == 0:
            self._in_startup = scope.startup
        try:
            return self._expr(node, scope)
        except RecursionError:
            return Val(UNKNOWN)

    def _expr(self, node: ast.expr, scope: Scope) -> Val:
        bound = self.field_value(node)
        if bound is not None:
            return bound
        match node:
            case ast.Constant(value=value):
                return Val(value)
            case ast.Name(id=name):
                if name in scope.locals:
                    local = scope.locals[name]
                    return local.force() if isinstance(local, Lazy) else local
                if name in ("self", "cls") and scope.owner is not None:
                    return Val(scope.owner)
                return self.global_name(scope.fi, name)
            case ast.Attribute(value=value, attr=attr):
                dotted = self._external_name(node, scope)
                if dotted:
                    prim = self._primitive_attr(dotted)
                    if prim is not None:
                        return prim
                return self.attribute(self.expr(value, scope), attr)
            case ast.Tuple(elts=elts) | ast.List(elts=elts) | ast.Set(elts=elts):
                vals = [self.expr(e, scope) for e in elts]
                if any(isinstance(e, ast.Starred) for e in elts):
                    return _derived(UNKNOWN, *vals)
                items = tuple(v.value for v in vals)
                return _derived(frozenset(items) if isinstance(node, ast.Set) else items, *vals)
            case ast.Dict(keys=keys, values=values):
                if any(k is None for k in keys):
                    return Val(UNKNOWN)
                ks = [self.expr(k, scope) for k in keys if k is not None]
                vs = [self.expr(v, scope) for v in values]
                if not all(k.known for k in ks):
                    return Val(UNKNOWN)
                try:
                    pairs = zip((k.value for k in ks), (v.value for v in vs), strict=True)
                    return _derived(dict(pairs), *ks)
                except TypeError:
                    return Val(UNKNOWN)
            case ast.BoolOp(op=op, values=values):
                return self.boolop(isinstance(op, ast.And), values, scope)
            case ast.UnaryOp(op=op, operand=operand):
                val = self.expr(operand, scope)
                if isinstance(op, ast.Not):
                    truth = val.truth()
                    return _derived(UNKNOWN if truth is None else not truth, val)
                if isinstance(op, ast.USub) and isinstance(val.value, int | float):
                    return _derived(-val.value, val)
                return _derived(UNKNOWN, val)
            case ast.Compare():
                return self.compare(node, scope)
            case ast.BinOp(left=left, op=op, right=right):
                lv, rv = self.expr(left, scope), self.expr(right, scope)
                fn = _BINOP.get(type(op))
                if fn and _plain(lv.value) and _plain(rv.value):
                    try:
                        return _derived(fn(lv.value, rv.value), lv, rv)
                    except Exception:
                        pass
                return _derived(UNKNOWN, lv, rv)
            case ast.IfExp(test=test, body=body, orelse=orelse):
                tv = self.expr(test, scope)
                truth = tv.truth()
                if truth is not None:
                    branch = self.expr(body if truth else orelse, scope)
                    return _derived(branch.value, tv, branch)
                a, b = self.expr(body, scope), self.expr(orelse, scope)
                return _derived(a.value if _same(a, b) else UNKNOWN, tv, a, b)
            case ast.Subscript(value=value, slice=index):
                return self.subscript(value, index, scope)
            case ast.Call():
                return self.call(node, scope)
            case ast.JoinedStr():
                return Val(NOT_NONE)
            case ast.GeneratorExp() | ast.ListComp() | ast.SetComp():
                return self.comprehension(node, scope)
        return Val(UNKNOWN)

    def comprehension(
        self, node: ast.GeneratorExp | ast.ListComp | ast.SetComp, scope: Scope
    ) -> Val:
        """`any(g in arch for g in ["gfx95"])`: one `for` over a known sequence, every item
        known, else UNKNOWN (a partly known list would mislead any()/all())."""
        if len(node.generators) != 1 or not isinstance(node.generators[0].target, ast.Name):
            return Val(UNKNOWN)
        gen = node.generators[0]
        assert isinstance(gen.target, ast.Name)
        seq = self.expr(gen.iter, scope)
        if not isinstance(seq.value, tuple | frozenset | str) or len(seq.value) > 64:
            return _derived(UNKNOWN, seq)
        inner = scope.snapshot()
        items, vals = [], [seq]
        for item in seq.value:
            inner.locals[gen.target.id] = Val(item)
            conds = [self.expr(c, inner) for c in gen.ifs]
            vals += conds
            if any(c.truth() is None for c in conds):
                return _derived(UNKNOWN, *vals)
            if all(c.truth() for c in conds):
                val = self.expr(node.elt, inner)
                vals.append(val)
                if not val.known:
                    return _derived(UNKNOWN, *vals)
                items.append(val.value)
        result = frozenset(items) if isinstance(node, ast.SetComp) else tuple(items)
        return _derived(result, *vals)

    def boolop(self, is_and: bool, values: list[ast.expr], scope: Scope) -> Val:
        """Three-valued `and`/`or`; a decided result carries only what decided it."""
        seen: list[Val] = []
        unknown = False
        for node in values:
            val = self.expr(node, scope)
            truth = val.truth()
            if truth is None:
                unknown = True
            elif truth != is_and:
                # `False and ...`, `True or ...`: this operand decides whatever came before.
                return val
            seen.append(val)
        if unknown:
            return _derived(UNKNOWN, *seen)
        return _derived(seen[-1].value, *seen)

    def compare(self, node: ast.Compare, scope: Scope) -> Val:
        left = self.expr(node.left, scope)
        vals = [left]
        result: bool | None = True
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = self.expr(comp, scope)
            vals.append(right)
            outcome = _compare(op, left.value, right.value)
            if outcome is False:
                return _derived(False, left, right)
            if outcome is None:
                result = None
            left = right
        return _derived(UNKNOWN if result is None else True, *vals)

    def subscript(self, value: ast.expr, index: ast.expr, scope: Scope) -> Val:
        base = self.expr(value, scope)
        if isinstance(index, ast.Slice):
            parts = [self.expr(p, scope) if p else Val(None) for p in (index.lower, index.upper)]
            if isinstance(base.value, tuple | str) and all(_plain(p.value) for p in parts):
                try:
                    return _derived(base.value[parts[0].value : parts[1].value], base, *parts)
                except TypeError:
                    pass
            return _derived(UNKNOWN, base)
        key = self.expr(index, scope)
        if isinstance(base.value, tuple | str | dict) and key.known:
            try:
                return _derived(base.value[key.value], base, key)
            except (LookupError, TypeError):
                pass
        if (
            isinstance(base.value, ClassRef)
            and isinstance(key.value, str)
            and self._is_enum(base.value)
        ):
            return _derived(EnumMember(base.value.name, key.value), base, key)
        return _derived(UNKNOWN, base, key)

    # ----------------------------------------------------------------- calls

    def call(self, node: ast.Call, scope: Scope) -> Val:
        prim = self._primitive_call(node, scope)
        if prim is not None:
            return prim
        if (
            isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Call)
            and getattr(node.func.value.func, "id", "") == "super"
            and scope.cls is not None
        ):
            func = self._super_attr(scope, node.func.attr)
        else:
            func = self.expr(node.func, scope)
        if any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords
        ):
            return _derived(UNKNOWN, func)
        args = [self.expr(a, scope) for a in node.args]
        kwargs = {k.arg: self.expr(k.value, scope) for k in node.keywords if k.arg}
        return self.apply(func, args, kwargs)

    def _super_attr(self, scope: Scope, attr: str) -> Val:
        assert scope.cls is not None
        for c in list(self.mro(scope.cls))[1:]:
            info = self.index.files[c.fi].classes.get(c.name)
            if info and attr in info.methods:
                return Val(FuncRef(c.fi, info.methods[attr], owner=scope.owner))
        return Val(UNKNOWN)

    def _model_fact(self, what: str) -> Val:
        assert self.model is not None
        value = ModelView(self.model, False) if what == "view" else self.model.mla
        return Val(value, True, (("fact", -1, 0, f"model: {self.model.describe()}"),))

    def model_param(self, name: str) -> Val | None:
        """A parameter named like the model's config (`hf_config`), when the model is known."""
        if self.model is None or name not in _MODEL_ATTRS:
            return None
        return self._model_attr(name)

    def _model_attr(self, attr: str) -> Val:
        """`runner.model_config`, `x.hf_config`, `runner.use_mla_backend` of the model."""
        view = self._model_fact("view")
        if attr in ("model_config", "hf_config", "hf_text_config"):
            return view if attr == "model_config" else _derived(view.value.attr(attr), view)
        return _derived(view.value.attr(attr), view)

    def apply(self, func: Val, args: list[Val], kwargs: dict[str, Val]) -> Val:
        f = func.value
        if isinstance(f, FuncRef) and self.model is not None:
            probe = _MODEL_PROBES.get(self.index.func((f.fi, f.ni)).name)
            if probe:
                return self._model_fact(probe)
        if isinstance(f, FuncRef):
            return self.interpret(func, f, args, kwargs)
        if isinstance(f, ClassRef):
            if self._is_enum(f):
                return _derived(UNKNOWN, func, *args)
            return _derived(Instance(f), func)
        if isinstance(f, Builtin):
            return self._builtin(func, f, args, kwargs)
        return _derived(UNKNOWN, func)

    def _builtin(self, func: Val, f: Builtin, args: list[Val], kwargs: dict[str, Val]) -> Val:
        vals = [a.value for a in args]
        every = [func, *args, *kwargs.values()]
        if f.name == "partial" and args and isinstance(vals[0], FuncRef):
            bound = tuple((k, v.value) for k, v in kwargs.items())
            if len(args) > 1:
                return _derived(UNKNOWN, *every)
            return _derived(replace(vals[0], bound=vals[0].bound + bound), *every)
        if f.name == "lru_cache":
            # `@lru_cache(maxsize=1)` and `lru_cache(maxsize=1)(f)`: caching keeps f's value.
            if args and isinstance(vals[0], FuncRef):
                return args[0]
            return _derived(Builtin("identity"), func)
        if f.name == "identity" and args:
            return args[0]
        if f.name == "to_int" and isinstance(f.bound, Capability):
            return _derived(f.bound.to_int(), func)
        if vals and isinstance(vals[0], ModelView):
            return _derived(_model_builtin(f.name, vals), *every)
        if not all(_plain(v) or isinstance(v, Builtin | list | dict) for v in vals):
            return _derived(UNKNOWN, *every)
        try:
            return _derived(self._call_builtin(f, vals), *every)
        except Exception:
            return _derived(UNKNOWN, *every)

    def _call_builtin(self, f: Builtin, vals: list[Any]) -> Any:
        if f.bound is not None:
            return _as_tuple(getattr(f.bound, f.name)(*vals))
        if f.name == "isinstance":
            kinds = vals[1] if isinstance(vals[1], tuple) else (vals[1],)
            types = {"tuple": tuple, "int": int, "str": str, "float": float, "bool": bool}
            if all(isinstance(k, Builtin) and k.name in types for k in kinds):
                return isinstance(vals[0], tuple(types[k.name] for k in kinds))
            return UNKNOWN
        if f.name == "map" and isinstance(vals[0], Builtin):
            conv = {"int": int, "str": str, "float": float}[vals[0].name]
            return tuple(conv(v) for v in vals[1])
        if f.name in ("hasattr", "getattr"):
            return UNKNOWN
        table: dict[str, Callable[..., Any]] = {
            "tuple": tuple,
            "list": tuple,
            "int": int,
            "str": str,
            "float": float,
            "bool": bool,
            "len": len,
            "any": any,
            "all": all,
            "min": min,
            "max": max,
            "set": frozenset,
            "frozenset": frozenset,
            "sorted": lambda x: tuple(sorted(x)),
        }
        return table[f.name](*vals)

    def interpret(self, func: Val, ref: FuncRef, args: list[Val], kwargs: dict[str, Val]) -> Val:
        """Run a function body over known values; its result, or UNKNOWN."""
        fn = self.index.func((ref.fi, ref.ni))
        if fn.end - fn.start > _MAX_LINES or self.budget <= 0 or self._depth > 12:
            return _derived(UNKNOWN, func)
        try:
            key: Any = (
                ref,
                self._in_startup,
                tuple(a.value for a in args),
                tuple(sorted((k, v.value) for k, v in kwargs.items())),
            )
            hash(key)
        except TypeError:
            key = None
        if key is not None and key in self._memo:
            return self._memo[key]
        if key is not None and key in self._active:
            return Val(UNKNOWN)
        stmts = self.reader.unit(ref.fi, fn.start, fn.end)
        if not stmts or not isinstance(stmts[0], ast.FunctionDef | ast.AsyncFunctionDef):
            return Val(UNKNOWN)
        self.budget -= 1
        self._depth += 1
        if key is not None:
            self._active.add(key)
        try:
            scope = self.bind(ref, stmts[0], args, kwargs)
            result = self.run(stmts[0].body, scope) or Val(None)
        finally:
            self._depth -= 1
            if key is not None:
                self._active.discard(key)
        result = _derived(result.value, result, func)
        if result.hw:
            # A helper whose answer depends on the host: part of the evidence chain.
            note = f"{fn.name}() -> {result.value!r}"
            extra: list[Trace] = [("helper", ref.fi, fn.start, note)]
            if ref.origin:
                extra.insert(0, ref.origin)
            result = Val(result.value, True, result.traces + tuple(extra))
        if key is not None:
            self._memo[key] = result
        return result

    def bind(
        self,
        ref: FuncRef,
        node: ast.FunctionDef | ast.AsyncFunctionDef,
        args: list[Val],
        kwargs: dict[str, Val],
    ) -> Scope:
        fn = self.index.func((ref.fi, ref.ni))
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
                scope.locals[name] = self.expr(defaults[name], Scope(ref.fi))
            else:
                scope.locals[name] = Val(UNKNOWN)
        for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
            if p.arg in kwargs:
                scope.locals[p.arg] = kwargs[p.arg]
            elif p.arg in bound:
                scope.locals[p.arg] = Val(bound[p.arg])
            else:
                scope.locals[p.arg] = self.expr(d, Scope(ref.fi)) if d else Val(UNKNOWN)
        for extra in (a.vararg, a.kwarg):
            if extra:
                scope.locals[extra.arg] = Val(UNKNOWN)
        return scope

    def run(self, stmts: list[ast.stmt], scope: Scope) -> Val | None:
        """The value a block returns, None when it falls through (UNKNOWN when undecided)."""
        for stmt in stmts:
            match stmt:
                case ast.Return(value=value):
                    return self.expr(value, scope) if value else Val(None)
                case ast.If(test=test, body=body, orelse=orelse):
                    tv = self.expr(test, scope)
                    truth = tv.truth()
                    if truth is not None:
                        result = self.run(body if truth else orelse, scope)
                        if result is not None:
                            return _derived(result.value, tv, result)
                        continue
                    a = self.run(body, Scope(scope.fi, dict(scope.locals), scope.cls, scope.owner))
                    b = self.run(
                        orelse, Scope(scope.fi, dict(scope.locals), scope.cls, scope.owner)
                    )
                    if a is None and b is None:
                        for name in _assigned_names([*body, *orelse]):
                            scope.locals[name] = _derived(UNKNOWN, tv)
                        continue
                    if a is not None and b is not None and _same(a, b):
                        return _derived(a.value, tv, a, b)
                    return _derived(UNKNOWN, tv, *(r for r in (a, b) if r))
                case ast.Assign(targets=targets, value=value):
                    assign(scope, targets, self.expr(value, scope))
                case ast.AnnAssign(target=target, value=value) if value is not None:
                    assign(scope, [target], self.expr(value, scope))
                case ast.Import() | ast.ImportFrom():
                    bind_import(self, scope, stmt)
                case ast.Try(body=body) | ast.With(body=body):
                    # Probes are read as if nothing raised (a healthy GPU host).
                    result = self.run(body, scope)
                    if result is not None:
                        return result
                case ast.Expr() | ast.Pass() | ast.Assert() | ast.Global() | ast.Nonlocal():
                    continue
                case ast.FunctionDef() | ast.AsyncFunctionDef() | ast.ClassDef():
                    scope.locals[stmt.name] = Val(UNKNOWN)
                case _:
                    return Val(UNKNOWN)
        return None


def _model_builtin(name: str, vals: list[Any]) -> Any:
    """`isinstance(hf_config, dict)` (an object, not a dict) and `getattr(hf_config, "k", d)`:
    a key config.json lacks reads as the default, as a PretrainedConfig without it would."""
    view: ModelView = vals[0]
    if name == "isinstance":
        return False if isinstance(vals[1], Builtin) and vals[1].name == "dict" else UNKNOWN
    if name in ("getattr", "hasattr") and len(vals) >= 2 and isinstance(vals[1], str):
        value = view.attr(vals[1])
        missing = view.hf and vals[1] not in view.facts.config and value is UNKNOWN
        if name == "hasattr":
            return UNKNOWN if value is UNKNOWN and not missing else not missing
        if missing and len(vals) > 2:
            return vals[2]
        return value
    return UNKNOWN


def assign(scope: Scope, targets: list[ast.expr], val: Val) -> None:
    """Bind simple names (and tuple unpacking of known tuples); other targets are ignored."""
    for target in targets:
        if isinstance(target, ast.Name):
            scope.locals[target.id] = val
        elif isinstance(target, ast.Tuple | ast.List):
            items = val.value if isinstance(val.value, tuple) else None
            for i, elt in enumerate(target.elts):
                if isinstance(elt, ast.Name):
                    known = items is not None and len(items) == len(target.elts)
                    item = items[i] if items is not None and known else UNKNOWN
                    scope.locals[elt.id] = _derived(item, val)


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
            scope.locals[alias.asname or alias.name] = ev._import(f"{module}:{alias.name}")


def _assigned_names(stmts: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names


def _tail(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _plain(value: Any) -> bool:
    return isinstance(value, _PLAIN) and value is not UNKNOWN


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _same(a: Val, b: Val) -> bool:
    if not (a.known and b.known):
        return False
    try:
        return bool(a.value == b.value) and type(a.value) is type(b.value)
    except Exception:
        return False


def _compare(op: ast.cmpop, left: Any, right: Any) -> bool | None:
    """A comparison of two values, None when it is not decided by what is known."""
    if isinstance(op, ast.Is | ast.IsNot):
        if left is UNKNOWN or right is UNKNOWN:
            return None
        if left is NOT_NONE or right is NOT_NONE:
            if right is None or left is None:
                return isinstance(op, ast.IsNot)
            return None
        if isinstance(left, _PLAIN) and isinstance(right, _PLAIN):
            same = left is right or (left == right and type(left) is type(right))
            return same if isinstance(op, ast.Is) else not same
        if isinstance(left, EnumMember) or isinstance(right, EnumMember):
            same = left == right
            return same if isinstance(op, ast.Is) else not same
        return None
    if isinstance(op, ast.In | ast.NotIn):
        if isinstance(right, tuple | frozenset | dict | str) and left is not UNKNOWN:
            members = tuple(right) if not isinstance(right, str) else None
            if members is not None and any(m is UNKNOWN or m is NOT_NONE for m in members):
                if left in [m for m in members if m is not UNKNOWN]:
                    return isinstance(op, ast.In)
                return None
            try:
                found = left in right
            except TypeError:
                return None
            return found if isinstance(op, ast.In) else not found
        return None
    fn = COMPARISONS.get(type(op))
    if fn is None:
        return None
    if isinstance(left, EnumMember) and isinstance(right, EnumMember):
        if isinstance(op, ast.Eq | ast.NotEq):
            return bool(fn(left, right))
        return None
    if not (_plain(left) and _plain(right)) or left is NOT_NONE or right is NOT_NONE:
        # Only `<some value> == None` is decided.
        if (left is None or right is None) and (left is NOT_NONE or right is NOT_NONE):
            return isinstance(op, ast.NotEq) if isinstance(op, ast.Eq | ast.NotEq) else None
        return None
    try:
        return bool(fn(left, right))
    except TypeError:
        return None
