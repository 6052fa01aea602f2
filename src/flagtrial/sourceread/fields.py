"""Declared fields, for the gate analysis: where each setting is declared, its literal default
and how a command-line word converts to it; `FlagTable` holds them with an engine's flags.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .modules import dotted


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
    # The subpackages (relative to the package) holding one module or package per model
    # architecture, of which the server imports the one it builds (with what that imports).
    model_packages: tuple[str, ...] = ()
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
