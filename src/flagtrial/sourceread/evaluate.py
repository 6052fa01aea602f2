"""Values of the literal-ish expressions flag declarations use (`Evaluator`), and annotations
reduced to a shape (`type_shape`). The two call each other: a `Literal[...]` holds evaluated
values, and `get_args(Alias)` evaluates to the values of a Literal alias.
"""

from __future__ import annotations

import ast
import itertools
from typing import Any

from .modules import Source, dotted


class Unresolved(Exception):
    """An expression whose value cannot be known without running the engine."""


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
        _subscript(source, module, node, shape, depth)
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


def _subscript(
    source: Source, module: str, node: ast.Subscript, shape: TypeShape, depth: int
) -> None:
    """`Optional[X]`, `Union[...]`, `Annotated[X, ...]`, `Literal[...]`, `list[X]`, ..."""
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
