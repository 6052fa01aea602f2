"""An index of one engine version's source: where functions, classes, module names and field
mentions are, built once with `ast` and cached on disk, so that a query parses only the few
functions it needs.

The index keeps line ranges, not syntax trees: a query reads those lines back from the cached
source (`SourceReader`) and parses just that function, which takes well under a millisecond.
"""

from __future__ import annotations

import ast
import bisect
import hashlib
import os
import pickle
import re
import subprocess
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from flagtrial import sourceread
from flagtrial.cache import cache_root
from flagtrial.gates.wheel import file_lock
from flagtrial.sourceread import LAYOUTS, read_flag_table
from flagtrial.sourceread.fields import EngineLayout, FlagTable
from flagtrial.sourceread.modules import absolute, dotted, module_name

# The cache key changes with the code that builds the index (and reads the flags).
INDEX_FORMAT = hashlib.sha256(
    Path(__file__).read_bytes() + sourceread.program().encode()
).hexdigest()[:12]

_ATTR = re.compile(r"\.([A-Za-z_]\w*)|getattr\(\s*[\w.]+\s*,\s*[\"']([A-Za-z_]\w*)[\"']")


class FuncInfo(NamedTuple):
    name: str
    cls: str | None  # the class it is a method of
    top: bool  # a module-level function
    start: int  # the `def` line
    end: int
    decorators: tuple[str, ...]  # last names: property, classmethod, lru_cache, ...
    dispatch: tuple[str, ...]  # string arguments of a `@register...("key")` decorator
    registrar: str  # that decorator's name


class ClassInfo(NamedTuple):
    name: str
    start: int
    end: int
    bases: tuple[str, ...]  # dotted source text of each base
    attrs: dict[str, tuple[int, int]]
    methods: dict[str, int]  # -> index in FileInfo.funcs


@dataclass(slots=True)
class FileInfo:
    path: str  # relative to the source root, posix
    module: str
    imports: dict[str, str] = field(default_factory=dict)  # local name -> "mod" or "mod:name"
    stars: list[str] = field(default_factory=list)
    funcs: list[FuncInfo] = field(default_factory=list)
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    # module-level name -> (start, end, conditional) of each assignment
    assigns: dict[str, list[tuple[int, int, bool]]] = field(default_factory=dict)
    # field name -> (line, unit start, unit end): the function or statement around a mention
    mentions: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)
    top_funcs: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class SourceIndex:
    engine: str
    version: str
    root: str
    table: FlagTable
    files: list[FileInfo]
    modules: dict[str, int] = field(default_factory=dict)
    defs: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    dispatch: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    mentions: dict[str, list[tuple[int, int, int, int]]] = field(default_factory=dict)
    # every setting argument resolution (or a platform's config hook) may assign
    writes: frozenset[str] = frozenset()

    @property
    def layout(self) -> EngineLayout:
        return LAYOUTS[self.engine]

    def func(self, ref: tuple[int, int]) -> FuncInfo:
        return self.files[ref[0]].funcs[ref[1]]

    def top_level(self, fi: int, name: str) -> int | None:
        """The index of module-level function `name` in file `fi`."""
        for ni in self.files[fi].top_funcs.get(name, ()):
            return ni
        return None


def _dotted(node: ast.expr) -> str:
    """A name, an attribute chain, or the callee's (`@register("x")`, `Base(...)`)."""
    return dotted(node.func if isinstance(node, ast.Call) else node)


def _last_name(node: ast.expr) -> str:
    return _dotted(node).rsplit(".", 1)[-1]


class _Scanner:
    """One file: a walk over statements only (expressions are left to the query)."""

    def __init__(self, rel: str, is_package: bool) -> None:
        self.info = FileInfo(path=rel, module=module_name(rel))
        self.is_package = is_package
        self.plain: list[tuple[int, int]] = []  # module- and class-level statements

    def scan(self, tree: ast.Module) -> FileInfo:
        self._body(tree.body, cls=None, in_func=False, conditional=False)
        return self.info

    def _body(
        self, stmts: Iterable[ast.stmt], cls: ClassInfo | None, in_func: bool, conditional: bool
    ) -> None:
        for stmt in stmts:
            end = stmt.end_lineno or stmt.lineno
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                self._func(stmt, cls, top=cls is None and not in_func)
                self._body(stmt.body, None, True, False)
                continue
            if isinstance(stmt, ast.ClassDef):
                info = None
                if not in_func and cls is None:
                    info = ClassInfo(
                        stmt.name, stmt.lineno, end, tuple(_dotted(b) for b in stmt.bases), {}, {}
                    )
                    self.info.classes.setdefault(stmt.name, info)
                self._body(stmt.body, info, in_func, conditional)
                continue
            if not in_func:
                if not conditional:
                    # A whole top-level `if` is one unit, so that its test guards what is inside.
                    self.plain.append((stmt.lineno, end))
                self._module_level(stmt, cls, conditional, end)
            for sub in _sub_bodies(stmt):
                self._body(sub, cls, in_func, conditional or not in_func)

    def _func(
        self, node: ast.FunctionDef | ast.AsyncFunctionDef, cls: ClassInfo | None, top: bool
    ) -> None:
        names: list[str] = []
        keys: list[str] = []
        registrar = ""
        for deco in node.decorator_list:
            name = _last_name(deco)
            names.append(name)
            if isinstance(deco, ast.Call) and "register" in name:
                args = [*deco.args, *(k.value for k in deco.keywords)]
                keys += [
                    a.value
                    for a in args
                    if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value
                ]
                registrar = name
        info = FuncInfo(
            node.name,
            cls.name if cls else None,
            top,
            node.lineno,
            node.end_lineno or node.lineno,
            tuple(sys.intern(n) for n in names),
            tuple(str(k) for k in keys),
            registrar,
        )
        if cls is not None:
            cls.methods.setdefault(node.name, len(self.info.funcs))
        if top:
            self.info.top_funcs.setdefault(node.name, []).append(len(self.info.funcs))
        self.info.funcs.append(info)

    def _module_level(
        self, stmt: ast.stmt, cls: ClassInfo | None, conditional: bool, end: int
    ) -> None:
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [stmt.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        for t in targets:
            if isinstance(t, ast.Tuple):
                names += [e.id for e in t.elts if isinstance(e, ast.Name)]
        for name in names:
            if cls is not None:
                cls.attrs[name] = (stmt.lineno, end)
            else:
                self.info.assigns.setdefault(name, []).append((stmt.lineno, end, conditional))
        if cls is not None:
            return
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    self.info.imports.setdefault(alias.asname, alias.name)
                else:
                    head = alias.name.split(".")[0]
                    self.info.imports.setdefault(head, head)
        elif isinstance(stmt, ast.ImportFrom):
            module = absolute(self.info.module, self.is_package, stmt.level, stmt.module)
            for alias in stmt.names:
                if alias.name == "*":
                    self.info.stars.append(module)
                else:
                    # Interned: the same few thousand targets recur in every file, and the
                    # pickle stores an interned string once.
                    target = sys.intern(f"{module}:{alias.name}")
                    self.info.imports.setdefault(alias.asname or alias.name, target)

    def mentions(self, text: str, fields: frozenset[str]) -> None:
        hits = [(m.start(), m.group(1) or m.group(2)) for m in _ATTR.finditer(text)]
        hits = [(pos, name) for pos, name in hits if name in fields]
        if not hits:
            return
        funcs = sorted((f.start, f.end) for f in self.info.funcs)
        starts = [s for s, _ in funcs]
        plain = sorted(self.plain)
        plain_starts = [s for s, _ in plain]
        line, last = 1, 0
        for pos, name in hits:
            line += text.count("\n", last, pos)
            last = pos
            unit = _innermost(funcs, starts, line) or _innermost(plain, plain_starts, line)
            if unit:
                self.info.mentions.setdefault(name, []).append((line, *unit))


def _innermost(
    ranges: list[tuple[int, int]], starts: list[int], line: int
) -> tuple[int, int] | None:
    """The range with the latest start that still contains `line` (nested defs start later)."""
    i = bisect.bisect_right(starts, line) - 1
    while i >= 0:
        start, end = ranges[i]
        if end >= line:
            return start, end
        i -= 1
    return None


def _sub_bodies(stmt: ast.stmt) -> list[list[ast.stmt]]:
    bodies = []
    for name in ("body", "orelse", "finalbody"):
        sub = getattr(stmt, name, None)
        if isinstance(sub, list) and sub and isinstance(sub[0], ast.stmt):
            bodies.append(sub)
    for handler in getattr(stmt, "handlers", []):
        bodies.append(handler.body)
    for case in getattr(stmt, "cases", []):
        bodies.append(case.body)
    return bodies


def _scan_file(path: str, rel: str, fields: frozenset[str]) -> FileInfo | None:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        tree = ast.parse(text)
    except (SyntaxError, ValueError, OSError):
        # A file the engine never imports on this Python (a syntax from a newer one): skip.
        return None
    scanner = _Scanner(rel, rel.endswith("/__init__.py"))
    scanner.scan(tree)
    scanner.mentions(text, fields)
    return scanner.info


def _worker_main() -> None:
    """A worker process: scan the (fields, jobs) pickled on stdin, pickle the infos out."""
    fields, jobs = pickle.load(sys.stdin.buffer)
    infos = [_scan_file(path, rel, fields) for path, rel in jobs]
    pickle.dump(infos, sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)


def _scan_parallel(
    jobs: list[tuple[str, str]], fields: frozenset[str], workers: int
) -> list[FileInfo | None]:
    """Plain worker processes, not multiprocessing: that would re-import the caller's
    __main__ (spawn) or fork a process that may have threads (a trial runs this in one)."""
    shares: list[list[tuple[str, str]]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for job in sorted(jobs, key=lambda j: -os.path.getsize(j[0])):
        i = loads.index(min(loads))
        shares[i].append(job)
        loads[i] += os.path.getsize(job[0])
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from flagtrial.gates.index import _worker_main; _worker_main()",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for _ in shares
    ]
    for proc, share in zip(procs, shares, strict=True):
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps((fields, share)))
        proc.stdin.close()
    results: list[FileInfo | None] = []
    for proc in procs:
        assert proc.stdout is not None
        data = proc.stdout.read()
        if proc.wait() != 0:
            raise RuntimeError(f"source index worker failed (exit {proc.returncode})")
        results += pickle.loads(data)
    return results


def _source_files(root: Path, layout: EngineLayout) -> list[tuple[str, str]]:
    pkg = os.path.join(root, layout.package)
    excluded = {os.path.join(pkg, e) for e in layout.exclude}
    jobs = []
    for dirpath, dirnames, filenames in os.walk(pkg):
        dirnames[:] = sorted(d for d in dirnames if os.path.join(dirpath, d) not in excluded)
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                jobs.append((path, os.path.relpath(path, root).replace(os.sep, "/")))
    return jobs


def build_index(root: Path, engine: str, version: str, workers: int | None = None) -> SourceIndex:
    """Parse every source file of the engine (in parallel processes) into a SourceIndex."""
    layout = LAYOUTS[engine]
    table = read_flag_table(root, engine)
    fields = frozenset(table.fields)
    jobs = _source_files(root, layout)
    workers = min(workers or os.cpu_count() or 1, 8)
    if workers > 1:
        infos = _scan_parallel(jobs, fields, workers)
    else:
        infos = [_scan_file(path, rel, fields) for path, rel in jobs]
    index = SourceIndex(engine, version, str(root), table, [i for i in infos if i is not None])
    for fi, info in enumerate(index.files):
        index.modules[info.module] = fi
        for ni, func in enumerate(info.funcs):
            index.defs.setdefault(func.name, []).append((fi, ni))
            for key in func.dispatch:
                index.dispatch.setdefault(key, []).append((fi, ni))
        for name, hits in info.mentions.items():
            index.mentions.setdefault(name, []).extend((fi, *hit) for hit in hits)
    index.writes = _resolution_writes(index)
    return index


def _resolution_writes(index: SourceIndex) -> frozenset[str]:
    """Every setting argument resolution (and the platforms' config hooks) may assign:
    `x.name = v`, `x["name"] = v`, `name=v` keywords, `"name": v` keys, `setattr(x, "name",
    v)`. A field's declaration and a copy under its own name (`name=self.name`) write
    nothing new; a file that does not parse counts every word it holds."""
    layout = index.layout
    prefix = layout.package + "/"
    hooks = set()
    for _, classes in layout.platform_objects.values():
        for qual in classes.values():
            fi = index.modules.get(qual.split(":")[0])
            if fi is not None:
                hooks.add(index.files[fi].path)
    names: set[str] = set()
    for info in index.files:
        if info.path.removeprefix(prefix).startswith(layout.startup_paths) or info.path in hooks:
            text = (Path(index.root) / info.path).read_text(encoding="utf-8", errors="replace")
            try:
                tree = ast.parse(text)
            except SyntaxError:
                names.update(re.findall(r"\w+", text))
                continue
            names.update(_assigned_names(tree))
    return frozenset(names)


def _assigned_names(tree: ast.AST) -> set[str]:
    def copy(value: ast.expr, name: str) -> bool:
        return isinstance(value, ast.Attribute) and value.attr == name

    names: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign) or (
            isinstance(node, ast.AnnAssign) and node.value is not None
        ):
            targets = [node.target]
        elif isinstance(node, ast.keyword) and node.arg and not copy(node.value, node.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(k, ast.Constant)
                    and isinstance(k.value, str)
                    and not copy(v, k.value)
                ):
                    names.add(k.value)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", "") == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
        ):
            names.add(str(node.args[1].value))
        while targets:
            t = targets.pop()
            if isinstance(t, ast.Tuple | ast.List):
                targets.extend(t.elts)
            elif isinstance(t, ast.Attribute):
                names.add(t.attr)
            elif isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant):
                names.add(str(t.slice.value))
    return names


def _fingerprint(root: Path, layout: EngineLayout) -> str:
    """Changes when a file of an installed package is added, removed or rewritten."""
    digest = hashlib.sha256()
    for path, rel in _source_files(root, layout):
        st = os.stat(path)
        digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


_LOADED: dict[tuple[str, str], SourceIndex] = {}
_LOADED_LOCK = threading.Lock()


def load_index(root: Path, engine: str, version: str, *, fingerprint: bool = False) -> SourceIndex:
    """The index of `root/<package>`, from memory, the disk cache, or built (and saved).

    `fingerprint` keys the disk cache on file sizes and times (an installed package that may
    change between runs); a downloaded wheel's source never changes. In memory, an index
    stays valid for the life of the process.
    """
    layout = LAYOUTS[engine]
    root = root.resolve()
    with _LOADED_LOCK:
        if (str(root), version) in _LOADED:
            return _LOADED[(str(root), version)]
    stamp = _fingerprint(root, layout) if fingerprint else "wheel"
    name = hashlib.sha256(f"{root}\0{version}\0{stamp}".encode()).hexdigest()[:16]
    path = cache_root() / "gates" / f"{engine}-{version}-{name}-{INDEX_FORMAT}.pickle"
    with file_lock(path.parent / f"{engine}-{version}-{name}.lock"):
        index: SourceIndex | None = None
        if path.exists():
            try:
                with open(path, "rb") as fh:
                    index = pickle.load(fh)
            except (pickle.UnpicklingError, EOFError, AttributeError, ImportError):
                index = None  # a cache from another flagtrial version: rebuild it
        if index is None:
            index = build_index(root, engine, version)
            tmp = path.with_suffix(".tmp")
            with open(tmp, "wb") as fh:
                pickle.dump(index, fh, protocol=pickle.HIGHEST_PROTOCOL)
            tmp.replace(path)
            for stale in path.parent.glob(f"{engine}-{version}-{name}-*.pickle"):
                if stale != path:
                    stale.unlink(missing_ok=True)  # built by an older flagtrial
    with _LOADED_LOCK:
        return _LOADED.setdefault((str(root), version), index)


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
            for body in _sub_bodies(stmt):
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
