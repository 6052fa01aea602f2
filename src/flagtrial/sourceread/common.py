"""The reader both engine modules share: modules of an installed package found and parsed
on demand (`Source`, the one module resolver: `module_name`, `absolute`), the literal-ish
expressions flag declarations use evaluated (`Evaluator`), annotations reduced to a shape
(`type_shape`), flags as argparse holds them (`add_argument_call`), deprecations named in
help texts, and the declared fields with their literal defaults that the gate analysis binds
(`read_fields`). Standard library only: it runs on the engine's host (see `__init__`).
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JSON_TYPE = "json"


class Unresolved(Exception):
    """An expression whose value cannot be known without running the engine."""


class Source:
    """The modules of one installed package, parsed on demand."""

    def __init__(self, package_dir: Path) -> None:
        self.root = package_dir.parent
        self.package = package_dir.name
        self._trees: dict[str, ast.Module | None] = {}
        self.memo: dict[str, Any] = {}  # what extractors derive once per package
        self._looking: set[tuple[str, str]] = set()  # star imports may import each other

    def imported(self, module: str, node: ast.ImportFrom) -> str:
        """The module an import statement of `module` imports from."""
        path = self.path(module)
        is_package = path is not None and path.name == "__init__.py"
        return absolute(module, is_package, node.level, node.module)

    def path(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            path = self.path(module)
            self._trees[module] = ast.parse(path.read_text(), str(path)) if path else None
        return self._trees[module]

    def where(self, module: str, node: ast.AST) -> str:
        path = self.path(module)
        rel = path.relative_to(self.root / self.package) if path else module
        return f"{rel}:{getattr(node, 'lineno', 0)}"

    def find_class(self, module: str, name: str) -> tuple[str, ast.ClassDef] | None:
        tree = self.tree(module)
        for node in top_level(tree.body if tree else []):
            # A class statement wins over a later rebinding (`ServerArgs = defstruct(...)`).
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        hit = self.lookup(module, name)
        if hit and isinstance(hit[1], ast.ClassDef):
            return hit[0], hit[1]
        return None

    def lookup(self, module: str, name: str) -> tuple[str, ast.AST] | None:
        """(module, node) defining a top-level name: a class, a function, an assigned value;
        imports are followed into this package."""
        tree = self.tree(module)
        if tree is None or (module, name) in self._looking:
            return None
        self._looking.add((module, name))
        try:
            return self._lookup(module, tree, name)
        finally:
            self._looking.discard((module, name))

    def _lookup(self, module: str, tree: ast.Module, name: str) -> tuple[str, ast.AST] | None:
        found: tuple[str, ast.AST] | None = None
        for node in top_level(tree.body):
            if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name == name:
                found = (module, node)
            elif isinstance(node, ast.Assign):
                if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                    found = (module, node.value)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                if isinstance(node.target, ast.Name) and node.target.id == name:
                    found = (module, node.value)
            elif isinstance(node, ast.ImportFrom):
                origin = self.imported(module, node)
                if origin.split(".")[0] != self.package:
                    continue
                for alias in node.names:
                    if alias.name == "*":  # `from .types import *` (vllm/renderers/chat_utils)
                        found = self.lookup(origin, name) or found
                    elif (alias.asname or alias.name) == name:
                        found = self.lookup(origin, alias.name) or found
        return found


def module_name(rel: str) -> str:
    """The module a file holds: `sglang/srt/layers/__init__.py` -> `sglang.srt.layers`."""
    parts = rel.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def absolute(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The module `from <level dots><target> import ...` names inside `module`."""
    if not level:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([target] if target else [])])


def top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module statements, including those under `if`/`try` (conditional imports)."""
    for node in body:
        if isinstance(node, ast.If):
            yield from top_level(node.body)
            yield from top_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from top_level(node.body)
        else:
            yield node


class Evaluator:
    """Values of the literal-ish expressions flag declarations use: constants, lists, string
    concatenation, f-strings, names and class attributes defined elsewhere in the package,
    `set()`/`list()`/`sorted()`, a function's docstring, a helper's returned value."""

    def __init__(self, source: Source, module: str, local: dict[str, Any] | None = None):
        self.source = source
        self.module = module
        self.local = local if local is not None else {}  # the caller's dict: it may still grow

    def at(self, module: str) -> Evaluator:
        return Evaluator(self.source, module)

    def value(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            items: list[Any] = []
            for e in node.elts:
                if isinstance(e, ast.Starred):
                    items.extend(self.value(e.value))
                else:
                    items.append(self.value(e))
            return tuple(items) if isinstance(node, ast.Tuple) else items
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                raise Unresolved("a ** entry in a dict literal")
            return {
                self.value(k): self.value(v)
                for k, v in zip(node.keys, node.values, strict=True)
                if k is not None
            }
        if isinstance(node, ast.JoinedStr):
            return "".join(self._fpart(part) for part in node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.value(node.left), self.value(node.right)
            if isinstance(left, list | tuple) and isinstance(right, list | tuple):
                return [*left, *right]
            return left + right
        if isinstance(node, ast.Name):
            return self._name(node.id)
        if isinstance(node, ast.Attribute):
            return self._attribute(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.ListComp | ast.SetComp) and len(node.generators) == 1:
            return self._comprehension(node.elt, node.generators[0])
        raise Unresolved(ast.unparse(node))

    def _comprehension(self, elt: ast.AST, gen: ast.comprehension) -> list[Any]:
        """`[m.name.lower() for m in RealKvHashMode]`, `[",".join(p) for p in ...]`."""
        if not isinstance(gen.target, ast.Name) or gen.is_async:
            raise Unresolved(ast.unparse(elt))
        out = []
        for item in self.iterate(self.value(gen.iter)):
            scope = Evaluator(self.source, self.module, {**self.local, gen.target.id: item})
            if all(scope.value(test) for test in gen.ifs):
                out.append(scope.value(elt))
        return out

    def _fpart(self, part: ast.AST) -> str:
        if isinstance(part, ast.FormattedValue):
            try:
                return str(self.value(part.value))
            except Unresolved:
                return "{" + ast.unparse(part.value) + "}"
        return str(self.value(part))

    def _name(self, name: str) -> Any:
        if name in self.local:
            return self.local[name]
        if name in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[name]
        hit = self.source.lookup(self.module, name)
        if hit is None:
            raise Unresolved(name)
        module, node = hit
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            return Definition(module, node)
        return self.at(module).value(node)

    def _attribute(self, node: ast.Attribute) -> Any:
        if node.attr == "__doc__":
            target = self.value(node.value)
            if isinstance(target, Definition):
                return ast.get_docstring(target.node) or ""
            raise Unresolved(ast.unparse(node))
        owner = self.value(node.value)
        if isinstance(owner, Member) and node.attr in ("name", "value"):
            return getattr(owner, node.attr)
        if isinstance(owner, Definition) and isinstance(owner.node, ast.ClassDef):
            # A class constant (`Backend.ALL`), read in the class body's own scope.
            scope: dict[str, Any] = {}
            evaluator = Evaluator(self.source, owner.module, scope)
            for stmt in owner.node.body:
                target = stmt.targets[0] if isinstance(stmt, ast.Assign) else None
                if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                    target = stmt.target  # a dataclass field's default (`tp_size: int = 1`)
                if isinstance(target, ast.Name) and isinstance(stmt, ast.Assign | ast.AnnAssign):
                    assert stmt.value is not None
                    try:
                        scope[target.id] = evaluator.value(stmt.value)
                    except (Unresolved, TypeError):
                        continue
            if node.attr in scope:
                return scope[node.attr]
        raise Unresolved(ast.unparse(node))

    def _call(self, node: ast.Call) -> Any:
        func = node.func
        if isinstance(func, ast.Name) and func.id in (
            "set",
            "frozenset",
            "list",
            "sorted",
            "tuple",
        ):
            items = self.iterate(self.value(node.args[0])) if node.args else []
            return sorted(items, key=str) if func.id == "sorted" else items
        if dotted(func).rsplit(".", 1)[-1] == "get_args" and len(node.args) == 1:
            # `get_args(LogLevel)`: the values of a Literal alias.
            shape = type_shape(self.source, self.module, node.args[0])
            if "Literal" in shape.parts:
                return tuple(shape.literals)
        if dotted(func) in ("permutations", "itertools.permutations") and node.args:
            args = [self.value(a) for a in node.args]
            size = next((self.value(k.value) for k in node.keywords if k.arg == "r"), None)
            size = args[1] if len(args) > 1 else size
            return list(itertools.permutations(self.iterate(args[0]), size))
        if isinstance(func, ast.Attribute) and func.attr in _PURE_METHODS:
            owner = self.value(func.value)
            if isinstance(owner, _PURE_METHODS[func.attr]):
                args = [self.value(a) for a in node.args]
                result = getattr(owner, func.attr)(*args)
                return list(result) if isinstance(owner, dict) else result
        if isinstance(func, ast.Name) and not node.args:
            target = self.value(func)
            if isinstance(target, Definition) and isinstance(target.node, ast.FunctionDef):
                return self._returned(target)
        raise Unresolved(ast.unparse(node))

    def iterate(self, value: Any) -> list[Any]:
        """The items of an evaluated iterable; an Enum class read from source, its members."""
        if isinstance(value, Definition) and isinstance(value.node, ast.ClassDef):
            bases = {dotted(b).rsplit(".", 1)[-1] for b in value.node.bases}
            if not bases & {"Enum", "IntEnum", "StrEnum"}:
                raise Unresolved(value.node.name)
            members = []
            for stmt in value.node.body:
                if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
                    name = stmt.targets[0].id
                    if not name.startswith("_"):
                        members.append(Member(name, self.at(value.module).lenient(stmt.value)))
            return members
        if isinstance(value, dict | list | tuple | set | str):
            return list(value)
        raise Unresolved(repr(value))

    def _returned(self, definition: Definition) -> Any:
        """What a helper such as `_reasoning_parser_choices()` returns on its last line, with
        the names it imports inside its body bound."""
        scope: dict[str, Any] = {}
        fn = definition.node
        assert isinstance(fn, ast.FunctionDef)
        for stmt in fn.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module:
                origin = self.source.imported(definition.module, stmt)
                for alias in stmt.names:
                    hit = self.source.lookup(origin, alias.name)
                    if hit and isinstance(hit[1], ast.ClassDef | ast.FunctionDef):
                        scope[alias.asname or alias.name] = Definition(hit[0], hit[1])
                    elif hit:
                        scope[alias.asname or alias.name] = self.at(hit[0]).value(hit[1])
        last = fn.body[-1]
        if not isinstance(last, ast.Return) or last.value is None:
            raise Unresolved(fn.name)
        return Evaluator(self.source, definition.module, scope).value(last.value)

    def lenient(self, node: ast.AST | None) -> Any:
        """The value, or None where it cannot be known statically."""
        if node is None:
            return None
        try:
            return self.value(node)
        except (Unresolved, TypeError, IndexError):
            return None


class Definition:
    def __init__(self, module: str, node: ast.ClassDef | ast.FunctionDef) -> None:
        self.module = module
        self.node = node


class Member:
    """A member of an Enum class read from source (`NONE = 0`)."""

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.value = value


# Methods without side effects an evaluated value may call, by the owner's type.
_PURE_METHODS: dict[str, type] = {
    "keys": dict,
    "values": dict,
    "items": dict,
    "lower": str,
    "upper": str,
    "strip": str,
    "replace": str,
    "join": str,
}


# ---------------------------------------------------------------------------------------------
# Types of annotated fields, reduced to what decides a flag's shape.


class TypeShape:
    """An annotation seen as a set of parts: builtin names (`int`, `str`, `bool`, `None`,
    `list`, `tuple`, `set`, `dict`), `Literal` values, and `dataclass`/`other` for classes."""

    def __init__(self) -> None:
        self.parts: set[str] = set()
        self.literals: list[Any] = []
        self.element: TypeShape | None = None  # of a list/tuple/set
        self.tuple_len: int | None = None  # fixed-length tuple[X, Y]


_BUILTIN = {
    "int": "int",
    "float": "float",
    "str": "str",
    "bool": "bool",
    "None": "None",
    "list": "list",
    "List": "list",
    "Sequence": "list",
    "tuple": "tuple",
    "Tuple": "tuple",
    "set": "set",
    "Set": "set",
    "dict": "dict",
    "Dict": "dict",
    "Mapping": "dict",
    "Any": "str",
}


def type_shape(source: Source, module: str, node: ast.AST, depth: int = 0) -> TypeShape:
    shape = TypeShape()
    _collect(source, module, node, shape, depth)
    return shape


def _collect(source: Source, module: str, node: ast.AST, shape: TypeShape, depth: int) -> None:
    if depth > 8:
        shape.parts.add("other")
        return
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        _collect(source, module, ast.parse(node.value, mode="eval").body, shape, depth + 1)
        return
    if isinstance(node, ast.Constant) and node.value is None:
        shape.parts.add("None")
        return
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        _collect(source, module, node.left, shape, depth)
        _collect(source, module, node.right, shape, depth)
        return
    if isinstance(node, ast.Subscript):
        head = dotted(node.value).rsplit(".", 1)[-1]
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head in ("Optional",):
            shape.parts.add("None")
            _collect(source, module, args[0], shape, depth + 1)
        elif head == "Union":
            for arg in args:
                _collect(source, module, arg, shape, depth + 1)
        elif head in ("Annotated", "A"):
            _collect(source, module, args[0], shape, depth + 1)
        elif head == "Literal":
            shape.parts.add("Literal")
            for arg in args:
                try:
                    value = Evaluator(source, module).value(arg)
                except Unresolved:
                    # `Literal["auto", RunnerType]`: another Literal alias, flattened.
                    inner = type_shape(source, module, arg, depth + 1)
                    shape.literals.extend(inner.literals if "Literal" in inner.parts else [])
                    continue
                shape.literals.extend(value if isinstance(value, list) else [value])
        elif head in _BUILTIN:
            kind = _BUILTIN[head]
            shape.parts.add(kind)
            if kind in ("list", "tuple", "set"):
                shape.element = type_shape(source, module, args[0], depth + 1)
                if kind == "tuple" and not any(_is_ellipsis(a) for a in args):
                    shape.tuple_len = len(args)
        else:
            shape.parts.add("other")
        return
    name = dotted(node)
    leaf = name.rsplit(".", 1)[-1]
    if leaf in _BUILTIN:
        shape.parts.add(_BUILTIN[leaf])
        return
    hit = source.lookup(module, leaf) if "." not in name else None
    if hit is not None:
        origin, target = hit
        if isinstance(target, ast.ClassDef):
            shape.parts.add(_class_kind(target))
            return
        if not isinstance(target, ast.FunctionDef):
            # A type alias (`ModelDType = Literal[...]`): its value is the type.
            _collect(source, origin, target, shape, depth + 1)
            return
    shape.parts.add("other")


def _is_ellipsis(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is Ellipsis


def _class_kind(node: ast.ClassDef) -> str:
    bases = {
        dotted(b.value if isinstance(b, ast.Subscript) else b).rsplit(".", 1)[-1]
        for b in node.bases
    }
    decorators = {dotted(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list}
    if bases & {"dict", "TypedDict"}:
        return "dict"
    if bases & {"str", "StrEnum"}:
        return "str"
    if bases & {"Enum", "IntEnum"}:
        return "other"
    if {d.rsplit(".", 1)[-1] for d in decorators} & {"dataclass", "config"} or "BaseModel" in bases:
        return "dataclass"
    return "other"


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return ""


# ---------------------------------------------------------------------------------------------
# Flags, as argparse holds them.


def flag_spec(
    names: list[str],
    dest: str,
    *,
    action: str = "store",
    nargs: Any = None,
    type_: str = "str",
    choices: list[Any] | None = None,
    help_: str = "",
    default: Any = None,
    where: str = "",
    settings: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "names": names,
        "negative": [],
        "dest": dest,
        "action": action,
        "nargs": nargs,
        "type": type_,
        "choices": None if choices is None else [c for c in choices if c is not None],
        "help": help_,
        "default": None if default is None else repr(default),
        "deprecated": None,
        "removed": False,
        "settings": settings if settings is not None else [dest],
        "where": where,
    }


_TYPE_NAMES = {"int": "int", "float": "float", "str": "str"}
# Parsers that take one word and turn it into a number or JSON (the engines' helpers);
# "int_hr" is an integer that may carry a k/m/g/t suffix (`human_readable_int`).
_VALUE_PARSERS = {
    "human_readable_int": "int_hr",
    "human_readable_int_or_auto": "str",
    "json.loads": JSON_TYPE,
    "json_list_type": JSON_TYPE,
    "nullable_str": "str",
    "optional_str": "str",
    "optional_int": "int",
    "optional_float": "float",
    "parse_cuda_graph_config_arg": JSON_TYPE,  # SGLang 0.5.23 --cuda-graph-config
}


def type_name(node: ast.AST | None) -> str:
    if node is None:
        return "str"
    name = dotted(node)
    if name in _TYPE_NAMES:
        return _TYPE_NAMES[name]
    if isinstance(node, ast.Call) and dotted(node.func) == "optional_type" and node.args:
        return type_name(node.args[0])
    return _VALUE_PARSERS.get(name, "str")


def parser_type(evaluator: Evaluator, node: ast.AST | None) -> str:
    """`type_name`, and a parser of the package's own that parses its word as JSON
    (`parse_cuda_graph_config_arg`, srt/model_executor/cuda_graph_config.py) is `json`."""
    name = type_name(node)
    hit = evaluator.source.lookup(evaluator.module, node.id) if isinstance(node, ast.Name) else None
    fn = hit[1] if hit else None
    if name == "str" and isinstance(fn, ast.FunctionDef) and fn.args.args:
        word = fn.args.args[0].arg
        for call in all_calls(fn):
            if dotted(call.func) == "json.loads" and dotted(call.args[0]) == word:
                return JSON_TYPE
    return name


def action_nargs(evaluator: Evaluator, node: ast.AST | None) -> Any:
    """The nargs a custom action class gives itself when the registration names none:
    its `__init__`'s default (`def __init__(self, option_strings, dest, nargs=0, ...)`,
    SGLang's Deprecated*Action), else argparse's None."""
    hit = evaluator.source.lookup(evaluator.module, dotted(node)) if node is not None else None
    init = method(hit[1], "__init__") if hit and isinstance(hit[1], ast.ClassDef) else None
    if hit is None or init is None:
        return None
    params = init.args.args[len(init.args.args) - len(init.args.defaults) :]
    defaults = dict(zip([a.arg for a in params], init.args.defaults, strict=True))
    defaults.update(
        (a.arg, d) for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True) if d
    )
    return Evaluator(evaluator.source, hit[0]).lenient(defaults.get("nargs"))


def action_name(node: ast.AST | None) -> str:
    if node is None:
        return "store"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    name = dotted(node).rsplit(".", 1)[-1]
    if name == "BooleanOptionalAction":
        return "boolean_optional"
    return f"custom:{name}" if name else "store"


def arity(action: str, nargs: Any) -> Any:
    """nargs as argparse applies it: 0 for switches (SGLang's `DeprecatedStoreTrueAction`
    too), else what was given (None: one word)."""
    if action in ("store_true", "store_false", "store_const", "count", "boolean_optional"):
        return 0
    if re.search(r"Store(?:True|False)Action$", action):
        return 0
    return nargs


def add_argument_call(
    call: ast.Call,
    evaluator: Evaluator,
    where: str,
    preset: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """A flag from one `add_argument(...)` call; `preset` holds keyword values computed
    elsewhere (vLLM's `**get_kwargs(Config)["field"]`), which explicit keywords override."""
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if not names:
        return None
    kw: dict[str, Any] = dict(preset or {})
    nodes: dict[str, ast.AST] = {}
    for keyword in call.keywords:
        if keyword.arg is None:
            if isinstance(keyword.value, ast.Dict):
                for k, v in zip(keyword.value.keys, keyword.value.values, strict=True):
                    if isinstance(k, ast.Constant):
                        nodes[str(k.value)] = v
            continue
        nodes[keyword.arg] = keyword.value
    for key, node in nodes.items():
        if key == "action":
            kw["action"] = action_name(node)
        elif key == "type":
            kw["type"] = parser_type(evaluator, node)
        else:
            kw[key] = evaluator.lenient(node)
    if "nargs" not in kw and kw.get("action", "").startswith("custom:"):
        kw["nargs"] = action_nargs(evaluator, nodes.get("action"))
    long_names = [n for n in names if n.startswith("--")]
    dest = kw.get("dest") or (long_names or names)[0].lstrip("-").replace("-", "_")
    action = kw.get("action", "store")
    if "default" not in kw and action in ("store_true", "store_false"):
        kw["default"] = action == "store_false"  # argparse's own default for a switch
    spec = flag_spec(
        names,
        dest,
        action=action,
        nargs=arity(action, kw.get("nargs")),
        type_=kw.get("type", "str"),
        choices=list(kw["choices"]) if isinstance(kw.get("choices"), list | tuple | set) else None,
        help_=kw.get("help") or "",
        default=kw.get("default"),
        where=where,
        settings=kw.get("settings"),
    )
    if "choices" in nodes and spec["choices"] is None:
        spec["choices_unresolved"] = ast.unparse(nodes["choices"])
    elif kw.get("choices_unresolved"):
        spec["choices_unresolved"] = kw["choices_unresolved"]
    if action.startswith("custom:Deprecated") or kw.get("deprecated") is True:
        spec["deprecated"] = replacement(kw.get("new_flag") or "")
    if "const_value" in nodes or action == "store_const":
        spec["const"] = kw.get("const_value", kw.get("const"))
    if kw.get("error_message"):
        spec["removed"] = True
        spec["help"] = spec["help"] or kw["error_message"]
    if action == "boolean_optional":
        boolean_optional(spec)
    if not names[0].startswith("-"):
        spec["positional"] = True
    if kw.get("required"):
        spec["required"] = True
    return spec


def boolean_optional(spec: dict[str, Any]) -> None:
    """argparse.BooleanOptionalAction adds `--no-X` for each `--X`."""
    positives = [n for n in spec["names"] if n.startswith("--")]
    spec["negative"] = [f"--no-{n[2:]}" for n in positives]
    spec["names"] = [*spec["names"], *spec["negative"]]


def calls_in(fn: ast.AST, method: str) -> Iterator[ast.Call]:
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == method
        ):
            yield node


def all_calls(fn: ast.AST) -> Iterator[ast.Call]:
    return (node for node in ast.walk(fn) if isinstance(node, ast.Call))


def method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next(
        (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name),
        None,
    )


def function_locals(fn: ast.FunctionDef, evaluator: Evaluator) -> dict[str, Any]:
    """Values of the simple local assignments in a function body (in order)."""
    scope: dict[str, Any] = {}
    local = Evaluator(evaluator.source, evaluator.module, scope)
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                scope[node.targets[0].id] = local.value(node.value)
            except (Unresolved, TypeError):
                continue
    return scope


def hand_registered(source: Source, module: str, fn: ast.FunctionDef) -> list[dict[str, Any]]:
    """Flags from every `*.add_argument(...)` call in one function."""
    evaluator = Evaluator(source, module)
    evaluator.local = function_locals(fn, evaluator)
    flags = []
    for call in sorted(calls_in(fn, "add_argument"), key=lambda c: c.lineno):
        spec = add_argument_call(call, evaluator, source.where(module, call))
        if spec is not None:
            flags.append(spec)
    return flags


# ---------------------------------------------------------------------------------------------
# Deprecations named in help texts ("(Deprecated: use --x=auto)", "Deprecated. Use --x
# instead.", "[Deprecated] Use --x instead.", "--x is deprecated and will be removed").

_DEPRECATED_HEAD = re.compile(r"^\W*(?:note:\s*)?deprecated\b", re.I)
# A flag as help texts write it: `--x`, `--x=v`, `--x-{decode,prefill}=disabled`.
_FLAG_WORD = r"--[A-Za-z0-9](?:[\w.\-]|\{[\w,]+\})*(?:=[^\s,;)`'\"]+)?"
_REPLACEMENT = re.compile(rf"\buse\s+[`'\"]?({_FLAG_WORD})", re.I)


def replacement(new_flag: str) -> str:
    """The flag a `new_flag=` names, as help texts give it (`--attn-dp-size <dp-size>` ->
    `--attn-dp-size`), so the parser's table and this one agree."""
    m = re.match(_FLAG_WORD, new_flag.strip())
    return m.group(0).rstrip(".") if m else new_flag.strip()


def mark_deprecations(flags: list[dict[str, Any]]) -> None:
    """A flag is deprecated when its help starts so, or says that it, by name, is; the flag a
    replacement names is written as help texts give it (see `replacement`)."""
    for spec in flags:
        text = spec["help"]
        own = any(re.search(rf"{re.escape(n)}\W{{0,3}}is deprecated", text) for n in spec["names"])
        if spec["deprecated"]:
            spec["deprecated"] = replacement(spec["deprecated"])
            continue
        if not (spec["deprecated"] == "" or _DEPRECATED_HEAD.search(text) or own):
            continue
        m = _REPLACEMENT.search(text[:300])
        spec["deprecated"] = m.group(1).rstrip(".") if m else ""


def scalar(values: list[Any]) -> str:
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "int"
    if values and all(isinstance(v, float) for v in values):
        return "float"
    return "str"


def scalar_shape(shape: TypeShape | None) -> str:
    """argparse's `type=` for a field: `_infer_type_func` maps int and float, else str."""
    if shape is None:
        return "str"
    for kind in ("int", "float"):
        if shape.parts - {"None"} == {kind}:
            return kind
    return "str"


def canonical(spec: dict[str, Any]) -> str:
    """The spelling a flag is named by: its first positive long option."""
    positives: list[str] = [n for n in spec["names"] if n not in spec["negative"]]
    return next((n for n in positives if n.startswith("--")), positives[0])


def switch_value(spec: dict[str, Any], used: str) -> Any:
    """What a flag that takes no value (nargs 0) stores when given as `used`."""
    if used in spec["negative"] or re.search(r"(?:^store_false|StoreFalseAction)$", spec["action"]):
        return False
    return spec.get("const", True)


# ---------------------------------------------------------------------------------------------
# Declared fields, for the gate analysis: where each setting is declared, its literal default
# and how a command-line word converts to it.


class Unset:
    """A default that is not a literal (computed, a factory): never equal to a known value."""

    _instance: Unset | None = None

    def __new__(cls) -> Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<computed>"

    def __reduce__(self) -> str:
        return "UNSET"


UNSET = Unset()


@dataclass(frozen=True)
class FieldDef:
    """An internal setting: where it is declared, its literal default, its value kind."""

    name: str
    file: str
    line: int
    owner: str
    default: object = UNSET
    kind: str = "other"  # bool, int, float, str or other: how a command-line value converts


@dataclass(frozen=True)
class EngineLayout:
    """Where one engine keeps its fields, and what its source tree holds."""

    package: str
    # Globs (relative to the package) of files declaring annotated or dataclass fields.
    field_files: tuple[str, ...]
    # Subtrees not part of the server that launches with these flags.
    exclude: tuple[str, ...] = ()
    # Fields that hold the tensor-parallel size (known from the host facts).
    tp_fields: tuple[str, ...] = ()
    # Code that runs at every launch (argument resolution and validation), relative to the
    # package: a certain raise there is a certain startup failure.
    startup_paths: tuple[str, ...] = ()
    # Objects chosen at run time (plugin discovery), bound per host runtime:
    # name -> (module defining it, {runtime: "module:Class"}).
    platform_objects: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)


@dataclass
class FlagTable:
    """Every flag (as `add_argument_call` describes one) and field of one engine version."""

    flags: dict[str, dict[str, Any]] = field(default_factory=dict)  # by every option string
    fields: dict[str, FieldDef] = field(default_factory=dict)  # the first declaration by name
    by_owner: dict[str, dict[str, FieldDef]] = field(default_factory=dict)
    declared: dict[str, int] = field(default_factory=dict)  # how many classes declare a name

    def field(self, name: str, owner: str | None = None) -> FieldDef | None:
        if owner is not None and name in self.by_owner.get(owner, {}):
            return self.by_owner[owner][name]
        return self.fields.get(name)

    def lookup(self, name: str) -> dict[str, Any] | None:
        """An option string, or an unambiguous prefix (argparse's allow_abbrev)."""
        if name in self.flags:
            return self.flags[name]
        matches = {id(f): f for n, f in self.flags.items() if n.startswith(name)}
        return next(iter(matches.values())) if len(matches) == 1 else None


def _literal(node: ast.expr | None) -> object:
    if node is None:
        return UNSET
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return UNSET


def _kind(annotation: ast.expr) -> str:
    """bool/int/float/str from `Optional[int]`, `int | None`, `A[bool, ...]`, `Literal["a"]`."""
    names = {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(annotation) if isinstance(n, ast.Attribute)}
    consts = [
        n.value for n in ast.walk(annotation) if isinstance(n, ast.Constant) and n.value is not None
    ]
    for kind in ("bool", "int", "float"):
        if kind in names:
            return kind
    if "str" in names or ("Literal" in names and all(isinstance(c, str) for c in consts)):
        return "str"
    return "other"


def _add_fields(table: FlagTable, tree: ast.Module, rel: str) -> None:
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for stmt in cls.body:
            if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                continue
            name = stmt.target.id
            ann = stmt.annotation
            head = dotted(ann.value).rsplit(".", 1)[-1] if isinstance(ann, ast.Subscript) else ""
            annotated = head in ("A", "Annotated")
            if annotated and isinstance(ann, ast.Subscript) and isinstance(ann.slice, ast.Tuple):
                ann = ann.slice.elts[0]
            default = stmt.value
            # vLLM's EngineArgs: `max_model_len: int | None = ModelConfig.max_model_len`.
            value = (
                table.by_owner[default.value.id][default.attr].default
                if isinstance(default, ast.Attribute)
                and isinstance(default.value, ast.Name)
                and default.attr in table.by_owner.get(default.value.id, {})
                else _literal(default)
            )
            fdef = FieldDef(name, rel, stmt.lineno, cls.name, value, _kind(ann))
            table.fields.setdefault(name, fdef)
            if name not in table.by_owner.setdefault(cls.name, {}):
                table.by_owner[cls.name][name] = fdef
                table.declared[name] = table.declared.get(name, 0) + 1


def read_fields(root: Path, layout: EngineLayout) -> FlagTable:
    """The fields declared in the layout's field files under `root/<package>` (milliseconds)."""
    table = FlagTable()
    for pattern in layout.field_files:
        for path in sorted((root / layout.package).glob(pattern)):
            _add_fields(table, ast.parse(path.read_bytes()), path.relative_to(root).as_posix())
    return table
