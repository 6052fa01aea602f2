"""Scanning one source file for the index: its functions, classes, imports, module-level
assignments and the lines that mention a field, with `ast` over statements only; in plain
worker processes when there are many files."""

from __future__ import annotations

import ast
import bisect
import os
import pickle
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from flagtrial.sourceread.fields import EngineLayout
from flagtrial.sourceread.modules import absolute, dotted, module_name

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
    # what an import statement anywhere in the file (in functions too) binds: `import a.b`
    # gives a.b, `from a import b` a.b (a submodule or a name; a itself runs as its parent),
    # `from a import *` a
    loads: set[str] = field(default_factory=set)
    # dotted paths under the file's own top package in string literals ("vllm.models.x.Cls"):
    # what it may import by name when chosen (a registry of class paths)
    named: set[str] = field(default_factory=set)
    # environment variables the file's code sets or unsets by a literal name
    env_writes: set[str] = field(default_factory=set)


# `os.environ["X"] = v`, `environ.setdefault("X", ...)`, `.pop("X")`, `os.putenv("X", ...)`,
# SGLang's `envs.X.set(...)` / `.override(...)` / `.clear()`
_ENV_WRITES = re.compile(
    r"""environ\[\s*["'](\w+)["']\s*\]\s*=(?!=)"""
    r"""|environ\.(?:setdefault|pop)\(\s*["'](\w+)["']"""
    r"""|putenv\(\s*["'](\w+)["']"""
    r"|envs\.(\w+)\.(?:set|override|clear)\("
)


def env_writes(text: str) -> set[str]:
    """The environment variables `text` sets or unsets by a literal name (a computed name,
    `os.environ[name] = v`, is not seen)."""
    return {next(g for g in m.groups() if g) for m in _ENV_WRITES.finditer(text)}


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
            self._loads(stmt)
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
            for sub in sub_bodies(stmt):
                self._body(sub, cls, in_func, conditional or not in_func)

    def _loads(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Import):
            self.info.loads.update(sys.intern(alias.name) for alias in stmt.names)
        elif isinstance(stmt, ast.ImportFrom):
            module = absolute(self.info.module, self.is_package, stmt.level, stmt.module)
            self.info.loads.update(
                sys.intern(module if a.name == "*" else f"{module}.{a.name}") for a in stmt.names
            )

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


def sub_bodies(stmt: ast.stmt) -> list[list[ast.stmt]]:
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


def scan_file(path: str, rel: str, fields: frozenset[str]) -> FileInfo | None:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        tree = ast.parse(text)
    except (SyntaxError, ValueError, OSError):
        # A file the engine never imports on this Python (a syntax from a newer one): skip.
        return None
    scanner = _Scanner(rel, rel.endswith("/__init__.py"))
    scanner.scan(tree)
    scanner.mentions(text, fields)
    top = re.escape(rel.split("/", 1)[0])
    scanner.info.named.update(re.findall(rf"[\"']({top}(?:\.\w+)+)", text))
    scanner.info.env_writes = env_writes(text)
    return scanner.info


def worker_main() -> None:
    """A worker process: scan the (fields, jobs) pickled on stdin, pickle the infos out."""
    fields, jobs = pickle.load(sys.stdin.buffer)
    infos = [scan_file(path, rel, fields) for path, rel in jobs]
    pickle.dump(infos, sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)


def scan_parallel(
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
    # The workers import this same package (a checkout first on the path, not whatever
    # flagtrial the interpreter would find), so that the infos they pickle are its classes.
    here = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from flagtrial.gates.scan import worker_main; worker_main()",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
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


def source_files(root: Path, layout: EngineLayout) -> list[tuple[str, str]]:
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
