"""An index of one engine version's source: where functions, classes, module names and field
mentions are, built once with `ast` and cached on disk, so that a query parses only the few
functions it needs.

The index keeps line ranges, not syntax trees: a query reads those lines back from the cached
source (`SourceReader`) and parses just that function, which takes well under a millisecond.
"""

from __future__ import annotations

import ast
import gc
import hashlib
import os
import pickle
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from flagtrial import sourceread
from flagtrial.cache import cache_root, file_lock, store
from flagtrial.gates import scan
from flagtrial.gates.scan import FileInfo, FuncInfo, scan_file, scan_parallel, source_files
from flagtrial.sourceread import LAYOUTS, read_flag_table
from flagtrial.sourceread.fields import EngineLayout, FlagTable

# The cache key changes with the code that builds the index (and reads the flags).
INDEX_FORMAT = hashlib.sha256(
    Path(__file__).read_bytes() + Path(scan.__file__).read_bytes() + sourceread.program().encode()
).hexdigest()[:12]


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
    # every environment variable the engine's own code sets or unsets by a literal name
    env_writes: frozenset[str] = frozenset()

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


def build_index(root: Path, engine: str, version: str, workers: int | None = None) -> SourceIndex:
    """Parse every source file of the engine (in parallel processes) into a SourceIndex."""
    layout = LAYOUTS[engine]
    table = read_flag_table(root, engine)
    fields = frozenset(table.fields)
    jobs = source_files(root, layout)
    workers = min(workers or os.cpu_count() or 1, 8)
    if workers > 1:
        infos = scan_parallel(jobs, fields, workers)
    else:
        infos = [scan_file(path, rel, fields) for path, rel in jobs]
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
    index.env_writes = frozenset().union(*(info.env_writes for info in index.files))
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
    for path, rel in source_files(root, layout):
        st = os.stat(path)
        digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


@contextmanager
def _lasting() -> Iterator[None]:
    """An index is a great many objects that live as long as the process: the cycle
    collector's passes over them cost more than loading them, and twice a query's own work
    after. Paused while they are made, then moved out of its sight for good (`gc.freeze`);
    reference counting still frees what is dropped."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


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
    with file_lock(path.parent / f"{engine}-{version}-{name}.lock"), _lasting():
        index: SourceIndex | None = None
        if path.exists():
            try:
                with open(path, "rb") as fh:
                    index = pickle.load(fh)
            except (pickle.UnpicklingError, EOFError, AttributeError, ImportError):
                index = None  # a cache from another flagtrial version: rebuild it
        if index is None:
            index = build_index(root, engine, version)
            store(path, pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL))
            for stale in path.parent.glob(f"{engine}-{version}-{name}-*.pickle"):
                if stale != path:
                    stale.unlink(missing_ok=True)  # built by an older flagtrial
    with _LOADED_LOCK:
        return _LOADED.setdefault((str(root), version), index)
