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

The evaluator is this module (names, attributes, calls); the values are in values.py, the
definition following in definitions.py, a helper's body interpreted in interpret.py, the
host facts in probes.py, the model in modelview.py, operators in operators.py, and the
comparison and builtin tables in compare.py.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from typing import Any

from flagtrial.gates import operators
from flagtrial.gates.compare import STR_METHODS, call_builtin
from flagtrial.gates.definitions import (
    class_attr,
    global_name,
    is_enum,
    module_attr,
    mro,
)
from flagtrial.gates.index import SourceIndex
from flagtrial.gates.interpret import interpret
from flagtrial.gates.model import GateHost, ModelFacts
from flagtrial.gates.modelview import (
    MODEL_ATTRS,
    MODEL_CONFIG_CLASS,
    MODEL_PROBES,
    ModelView,
    model_attr,
    model_builtin,
    model_fact,
    model_method,
    model_self_attr,
)
from flagtrial.gates.probes import primitive_attr, primitive_call
from flagtrial.gates.reader import SourceReader
from flagtrial.gates.values import (
    NOT_NONE,
    UNKNOWN,
    Builtin,
    Capability,
    ClassRef,
    DeviceProps,
    EnumMember,
    FieldBinding,
    FuncRef,
    Instance,
    LambdaRef,
    Lazy,
    ModuleRef,
    Scope,
    Val,
    derived,
    plain,
)
from flagtrial.sourceread.fields import UNSET


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
        env: dict[str, str] | None = None,
    ) -> None:
        self.model = model
        # The variables the server's launch sets (its unit's Environment= and files, a
        # process target's own environment): read as set, unless the engine sets them itself.
        self.env = env or {}
        # Declared defaults of the settings the command leaves out, read in argument
        # resolution only (elsewhere a name like `page_size` may be anything's).
        self.resolution_defaults = resolution_defaults or {}
        self.in_startup = False
        # Set for computing what the platform picks: settings the command leaves out keep
        # their declared defaults, environment variables theirs, and the engine's own
        # dependencies for this platform are installed.
        self.defaults = defaults
        self.index = index
        self.reader = reader
        self.host = host
        self.fields = fields
        self.budget = budget
        self.globals_memo: dict[tuple[int, str], Val] = {}
        self.memo: dict[Any, Val] = {}
        self.active: set[Any] = set()
        self.depth = 0

    # ----------------------------------------------------------------- host facts

    def attribute(self, base: Val, attr: str) -> Val:
        obj = base.value
        if isinstance(obj, Instance) and obj.cls.name == MODEL_CONFIG_CLASS and self.model:
            return model_self_attr(self, base, obj, attr)
        if isinstance(obj, ModuleRef | ClassRef | Instance):
            if isinstance(obj, ModuleRef):
                val = module_attr(self, obj, attr)
            else:
                val = class_attr(self, obj.cls if isinstance(obj, Instance) else obj, attr, obj)
            if not val.known and self.model is not None and attr in MODEL_ATTRS:
                val = model_attr(self, attr)
            return derived(val.value, base, val)
        method = model_method(self, attr) if isinstance(obj, ModelView) else None
        if method is not None:
            return derived(method.value, base, method)
        if isinstance(obj, DeviceProps | ModelView):
            return derived(obj.attr(attr), base)
        if self.model is not None and attr in MODEL_ATTRS and not base.known:
            return derived(model_attr(self, attr).value, base, model_attr(self, attr))
        if isinstance(obj, Capability) and attr in ("major", "minor"):
            return derived(obj[0] if attr == "major" else obj[1], base)
        if isinstance(obj, Capability) and attr == "to_int":
            return derived(Builtin("to_int", obj), base)
        if isinstance(obj, EnumMember) and attr == "name":
            return derived(obj.name, base)
        if isinstance(obj, str | dict | tuple) and attr in STR_METHODS:
            return derived(Builtin(attr, obj), base)
        return Val(UNKNOWN)

    def model_self(self, fi: int, cls: str | None) -> Val | None:
        """`self` of a method of the engine's ModelConfig class, when the model is known."""
        if self.model is None or cls != MODEL_CONFIG_CLASS:
            return None
        return Val(Instance(ClassRef(fi, cls)))

    # ----------------------------------------------------------------- expressions

    def external_name(self, node: ast.expr, scope: Scope) -> str | None:
        """`torch.version.cuda` when the chain's head is an import of a module outside."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id in scope.locals:
            return None
        head = global_name(self, scope.fi, node.id).value
        if not isinstance(head, ModuleRef):
            return None
        return ".".join([head.name, *reversed(parts)])

    # ----------------------------------------------------------------- names

    def field_value(self, node: ast.expr) -> Val | None:
        """The bound value when `node` reads a field of this evaluation (`x.f`, getattr)."""
        if isinstance(node, ast.Attribute):
            binding = self.fields.get(node.attr)
            if binding and (binding.receiver is None or _tail(node.value) == binding.receiver):
                return Val(UNKNOWN if binding.value is UNSET else binding.value)
            if self.defaults is not None and node.attr in self.defaults:
                return Val(self.defaults[node.attr])
            if self.in_startup and node.attr in self.resolution_defaults:
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
        if self.depth == 0:
            self.in_startup = scope.startup
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
                return global_name(self, scope.fi, name)
            case ast.Attribute(value=value, attr=attr):
                dotted = self.external_name(node, scope)
                if dotted:
                    prim = primitive_attr(self, dotted)
                    if prim is not None:
                        return prim
                return self.attribute(self.expr(value, scope), attr)
            case ast.Tuple(elts=elts) | ast.List(elts=elts) | ast.Set(elts=elts):
                vals = [self.expr(e, scope) for e in elts]
                if any(isinstance(e, ast.Starred) for e in elts):
                    return derived(UNKNOWN, *vals)
                items = tuple(v.value for v in vals)
                return derived(frozenset(items) if isinstance(node, ast.Set) else items, *vals)
            case ast.Dict():
                return operators.dict_display(self, node, scope)
            case ast.BoolOp(op=op, values=values):
                return operators.boolop(self, isinstance(op, ast.And), values, scope)
            case ast.UnaryOp():
                return operators.unary(self, node, scope)
            case ast.Compare():
                return operators.compare(self, node, scope)
            case ast.BinOp():
                return operators.binop(self, node, scope)
            case ast.IfExp():
                return operators.ifexp(self, node, scope)
            case ast.Subscript(value=value, slice=index):
                return operators.subscript(self, value, index, scope)
            case ast.Call():
                return self.call(node, scope)
            case ast.JoinedStr():
                return Val(NOT_NONE)
            case ast.GeneratorExp() | ast.ListComp() | ast.SetComp():
                return operators.comprehension(self, node, scope)
            case ast.Lambda(args=args) if not (args.args or args.vararg or args.kwarg):
                return Val(LambdaRef(node, scope))
        return Val(UNKNOWN)

    # ----------------------------------------------------------------- calls

    def call(self, node: ast.Call, scope: Scope) -> Val:
        prim = primitive_call(self, node, scope)
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
            return derived(UNKNOWN, func)
        args = [self.expr(a, scope) for a in node.args]
        kwargs = {k.arg: self.expr(k.value, scope) for k in node.keywords if k.arg}
        return self.apply(func, args, kwargs)

    def _super_attr(self, scope: Scope, attr: str) -> Val:
        assert scope.cls is not None
        for c in list(mro(self, scope.cls))[1:]:
            info = self.index.files[c.fi].classes.get(c.name)
            if info and attr in info.methods:
                return Val(FuncRef(c.fi, info.methods[attr], owner=scope.owner))
        return Val(UNKNOWN)

    def model_param(self, name: str) -> Val | None:
        """A parameter named like the model's config (`hf_config`), when the model is known."""
        if self.model is None or name not in MODEL_ATTRS:
            return None
        return model_attr(self, name)

    def apply(self, func: Val, args: list[Val], kwargs: dict[str, Val]) -> Val:
        f = func.value
        if isinstance(f, FuncRef) and self.model is not None:
            probe = MODEL_PROBES.get(self.index.func((f.fi, f.ni)).name)
            if probe:
                return model_fact(self, probe)
        if isinstance(f, FuncRef):
            return interpret(self, func, f, args, kwargs)
        if isinstance(f, LambdaRef) and not args and not kwargs:
            body = self.expr(f.node.body, f.scope)
            return derived(body.value, body, func)
        if isinstance(f, ClassRef):
            if is_enum(self, f):
                return derived(UNKNOWN, func, *args)
            return derived(Instance(f), func)
        if isinstance(f, Builtin):
            return self._builtin(func, f, args, kwargs)
        return derived(UNKNOWN, func)

    def _builtin(self, func: Val, f: Builtin, args: list[Val], kwargs: dict[str, Val]) -> Val:
        vals = [a.value for a in args]
        every = [func, *args, *kwargs.values()]
        if f.name == "partial" and args and isinstance(vals[0], FuncRef):
            bound = tuple((k, v.value) for k, v in kwargs.items())
            if len(args) > 1:
                return derived(UNKNOWN, *every)
            return derived(replace(vals[0], bound=vals[0].bound + bound), *every)
        if f.name == "lru_cache":
            # `@lru_cache(maxsize=1)` and `lru_cache(maxsize=1)(f)`: caching keeps f's value.
            if args and isinstance(vals[0], FuncRef):
                return args[0]
            return derived(Builtin("identity"), func)
        if f.name == "identity" and args:
            return args[0]
        if f.name == "constant" and not args:
            return derived(f.bound, *every)
        if f.name == "to_int" and isinstance(f.bound, Capability):
            return derived(f.bound.to_int(), func)
        if vals and isinstance(vals[0], ModelView):
            return derived(model_builtin(f.name, vals), *every)
        if not all(plain(v) or isinstance(v, Builtin | list | dict) for v in vals):
            return derived(UNKNOWN, *every)
        try:
            return derived(call_builtin(f, vals), *every)
        except Exception:
            return derived(UNKNOWN, *every)


def _tail(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""
