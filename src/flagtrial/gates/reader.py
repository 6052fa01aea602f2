"""Reading back what the index points at: single functions and statements of the engine's
source parsed by their line ranges (cached), and what one statement reads, calls and binds."""

from __future__ import annotations

import ast
import threading
from dataclasses import dataclass
from pathlib import Path

from flagtrial.gates.index import SourceIndex
from flagtrial.gates.scan import sub_bodies


class SourceReader:
    """Parses single functions and statements of an indexed tree, by their line ranges."""

    def __init__(self, index: SourceIndex) -> None:
        self.index = index
        self._lines: dict[int, list[str]] = {}
        self._units: dict[tuple[int, int, int], list[ast.stmt]] = {}
        self._facts: dict[int, StmtFacts] = {}
        self._stores: dict[int, set[str]] = {}
        self._tables: dict[tuple[int, int, int], tuple[list[str], list[str]]] = {}
        self._lock = threading.Lock()

    def lines(self, fi: int) -> list[str]:
        with self._lock:
            if fi not in self._lines:
                path = Path(self.index.root) / self.index.files[fi].path
                self._lines[fi] = path.read_text(encoding="utf-8", errors="replace").splitlines(
                    keepends=True
                )
            return self._lines[fi]

    def line(self, fi: int, line: int) -> str:
        lines = self.lines(fi)
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""

    def unit(self, fi: int, start: int, end: int) -> list[ast.stmt]:
        """The statements on lines start..end, with their real line numbers ([] if unparsable)."""
        key = (fi, start, end)
        with self._lock:
            if key in self._units:
                return self._units[key]
        text = "".join(self.lines(fi)[start - 1 : end])
        indented = text[:1] in (" ", "\t")
        # Blank lines in front give the real line numbers without renumbering every node; an
        # indented method parses inside a dummy block, its columns as in the file.
        head = "\n" * (start - 2) + "if 1:\n" if indented else "\n" * (start - 1)
        try:
            body = ast.parse(head + text).body
        except SyntaxError:
            body = []
        stmts = body[0].body if indented and body and isinstance(body[0], ast.If) else body
        with self._lock:
            self._units[key] = stmts
        return stmts

    def stores(self, stmt: ast.stmt) -> set[str]:
        """Names bound by a statement or anywhere in its nested blocks (computed once)."""
        names = self._stores.get(id(stmt))
        if names is None:
            names = bound_names(stmt)
            for body in sub_bodies(stmt):
                for child in body:
                    names |= self.stores(child)
            with self._lock:
                self._stores[id(stmt)] = names
        return names

    def facts(self, stmt: ast.stmt) -> StmtFacts:
        """What a statement of a cached unit reads, calls and binds (computed once)."""
        facts = self._facts.get(id(stmt))
        if facts is None:
            facts = StmtFacts.of(stmt)
            with self._lock:
                self._facts[id(stmt)] = facts
        return facts

    def getattr_tables(self, fi: int, start: int, end: int) -> tuple[list[str], list[str]]:
        """A `__getattr__`: the modules it imports from and the names it calls `.get` on."""
        key = (fi, start, end)
        if key not in self._tables:
            tree = ast.Module(body=self.unit(fi, start, end), type_ignores=[])
            nodes = list(ast.walk(tree))
            modules = [n.module for n in nodes if isinstance(n, ast.ImportFrom) and n.module]
            tables = [
                n.func.value.id
                for n in nodes
                if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and n.func.attr == "get"
                and isinstance(n.func.value, ast.Name)
            ]
            with self._lock:
                self._tables[key] = (modules, tables)
        return self._tables[key]


@dataclass
class StmtFacts:
    """One statement's own expressions (not those of nested statements), walked once."""

    roots: list[ast.expr]
    attrs: dict[str, list[ast.expr]]  # field-like reads: `x.name` loads and getattr(x, "name")
    calls: list[ast.Call]
    parents: dict[int, ast.AST]

    @classmethod
    def of(cls, stmt: ast.stmt) -> StmtFacts:
        roots = own_expressions(stmt)
        facts = cls(roots, {}, [], {})
        for root in roots:
            for node in ast.walk(root):
                for child in ast.iter_child_nodes(node):
                    facts.parents[id(child)] = node
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                    facts.attrs.setdefault(node.attr, []).append(node)
                elif isinstance(node, ast.Call):
                    facts.calls.append(node)
                    if (
                        getattr(node.func, "id", "") == "getattr"
                        and len(node.args) >= 2
                        and isinstance(node.args[1], ast.Constant)
                        and isinstance(node.args[1].value, str)
                    ):
                        facts.attrs.setdefault(node.args[1].value, []).append(node)
        return facts


def bound_names(stmt: ast.stmt) -> set[str]:
    """Names a statement binds itself (assignment and loop targets, imports, defs)."""
    targets: list[ast.expr] = []
    names: set[str] = set()
    match stmt:
        case ast.Assign(targets=ts):
            targets = ts
        case ast.AnnAssign(target=t) | ast.AugAssign(target=t) | ast.For(target=t):
            targets = [t]
        case ast.AsyncFor(target=t):
            targets = [t]
        case ast.With(items=items) | ast.AsyncWith(items=items):
            targets = [i.optional_vars for i in items if i.optional_vars is not None]
        case ast.Import(names=aliases) | ast.ImportFrom(names=aliases):
            names = {(a.asname or a.name).split(".")[0] for a in aliases}
        case ast.FunctionDef(name=n) | ast.AsyncFunctionDef(name=n) | ast.ClassDef(name=n):
            names = {n}
        case ast.Try(handlers=handlers) | ast.TryStar(handlers=handlers):
            names = {h.name for h in handlers if h.name}
    for target in targets:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                names.add(node.id)
    return names


def own_expressions(stmt: ast.stmt) -> list[ast.expr]:
    """The expressions a statement evaluates itself (not those of nested statements)."""
    match stmt:
        case ast.If(test=test) | ast.While(test=test) | ast.Assert(test=test):
            return [test]
        case ast.For(iter=it) | ast.AsyncFor(iter=it):
            return [it]
        case ast.With(items=items) | ast.AsyncWith(items=items):
            return [i.context_expr for i in items]
        case ast.Return(value=value) | ast.Expr(value=value) if value is not None:
            return [value]
        case ast.Assign(targets=targets, value=value):
            return [value, *(t for t in targets if not isinstance(t, ast.Name))]
        case ast.AnnAssign(value=value) | ast.AugAssign(value=value) if value is not None:
            return [value]
        case ast.Raise(exc=exc) if exc is not None:
            return [exc]
        case ast.Match(subject=subject):
            return [subject]
    return []
