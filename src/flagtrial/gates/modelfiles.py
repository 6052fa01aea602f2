"""Another model's code: a function in a model module this model never loads cannot act.

Both engines keep one module per architecture under their model package
(`sglang/srt/models/llama.py`, `vllm/model_executor/models/llama.py`) and build the class
config.json's `architectures` names: SGLang's `EntryClass` class of that name, vLLM's
registry entry (`"LlamaForCausalLM": ("llama", "LlamaForCausalLM")`). What runs of the
model package is that module, what it imports (at any depth, inside functions too) and what
code outside the package imports from it. SGLang's registry imports every model module to
collect its `EntryClass`, so only module-level statements of the others run: a read inside
a function or method there is ruled out, one at module level is not.
"""

from __future__ import annotations

import re
import threading

from flagtrial.gates.index import SourceIndex
from flagtrial.gates.model import ModelFacts
from flagtrial.gates.reader import SourceReader

_CACHE: dict[tuple[int, tuple[str, ...]], tuple[frozenset[int], tuple[str, ...]] | None] = {}
_LOCK = threading.Lock()


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _package(index: SourceIndex) -> str:
    layout = index.layout
    if not layout.model_package:
        return ""
    return f"{layout.package}.{layout.model_package.replace('/', '.')}"


def _defining(index: SourceIndex, reader: SourceReader, package: str, arch: str) -> set[str]:
    """The model modules that implement `arch`: a class of that name, or a registry entry
    naming the module (`"Arch": ("llama", ...)`)."""
    entry = re.compile(rf'^\s*"{re.escape(arch)}":\s*\(\s*"(\w+)"')
    found = set()
    for fi, info in enumerate(index.files):
        if not _inside(info.module, package):
            continue
        if arch in info.classes:
            found.add(info.module)
        for line in reader.lines(fi) if "registry" in info.module else ():
            m = entry.match(line)
            if m:
                found.add(f"{package}.{m.group(1)}")
    return found


def _loaded(
    index: SourceIndex, reader: SourceReader, archs: tuple[str, ...]
) -> tuple[frozenset[int], tuple[str, ...]] | None:
    """The model package's files that run for this model, and the modules its architectures
    are built from; None when the package or an architecture's module is not found."""
    package = _package(index)
    if not package:
        return None
    seeds: set[str] = set()
    for arch in archs:
        modules = _defining(index, reader, package, arch)
        if not modules:
            return None
        seeds |= modules
    built = tuple(sorted(seeds))
    # what code outside the model package loads from it (the registry, loaders, runners)
    seeds |= {m for info in index.files if not _inside(info.module, package) for m in info.loads}
    seeds.add(package)
    done: set[int] = set()
    todo = sorted(seeds)
    while todo:
        module = todo.pop()
        # a module's parents run first (`models/deepseek_common/__init__.py`)
        parts = module.split(".")
        for k in range(1, len(parts) + 1):
            fi = index.modules.get(".".join(parts[:k]))
            if fi is None or fi in done or not _inside(index.files[fi].module, package):
                continue
            done.add(fi)
            todo.extend(index.files[fi].loads)
    return frozenset(done), built


def other_model(
    index: SourceIndex, reader: SourceReader, fi: int, line: int | None, model: ModelFacts
) -> str | None:
    """Why a read at `line` of file `fi` (any line when None) never runs for this model, or
    None when it may."""
    package = _package(index)
    info = index.files[fi]
    if not model.architectures or not package or not _inside(info.module, package):
        return None
    key = (id(index), model.architectures)
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = _loaded(index, reader, model.architectures)
        loaded = _CACHE[key]
    if loaded is None or fi in loaded[0]:
        return None
    if line is not None and not any(f.start <= line <= f.end for f in info.funcs):
        return None
    archs = "/".join(model.architectures)
    built = ", ".join(index.files[index.modules[m]].path for m in loaded[1] if m in index.modules)
    return (
        f"{info.path} is another model's code: {archs} is built from {built}, which never loads it"
    )
