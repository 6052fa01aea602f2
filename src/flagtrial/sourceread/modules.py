"""The modules of an installed package, found and parsed on demand (`Source`), and the one
module resolver (`module_name`, `absolute`) the flag reader and the gate analysis share.
Standard library only: it runs on the engine's host (see `__init__`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return ""
