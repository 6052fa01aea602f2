"""Another model's code: a function in a model module this model never loads cannot act,
nor a method of a class a table keyed by architecture gives only to other models.

Both engines keep one module per architecture under their model packages
(`sglang/srt/models/llama.py`, `vllm/model_executor/models/llama.py`; vLLM also keeps a
package per model with its own kernels, `vllm/models/deepseek_v4/`) and build the class
config.json's `architectures` names: SGLang's `EntryClass` class of that name, vLLM's
registry entry (`"LlamaForCausalLM": ("llama", "LlamaForCausalLM")`, or a full module path,
`("vllm.models.deepseek_v4", ...)`). What runs of the model packages is that module, what
it imports (at any depth, inside functions too) and what code outside the packages imports
from them or names by path in a string (vLLM's attention-backend registry:
`"vllm.models.deepseek_v4.sparse_mla.DeepseekV4FlashMLABackend"`, imported when chosen).
SGLang's registry imports every model module to collect its `EntryClass`, so only
module-level statements of the others run: a read inside a function or method there is
ruled out, one at module level is not.

A module-level dict keyed by architecture names whose values are classes of its module
(vLLM's `MODELS_CONFIG_MAP = {"DeepseekV32ForCausalLM": DeepseekV32ForCausalLM, ...}`,
looked up `.get(architecture)`) runs a class's methods only for the architectures mapped
to it, or to a subclass of it: the others' methods are ruled out, unless another file
imports the class.
"""

from __future__ import annotations

import ast
import re
import threading

from flagtrial.gates.index import SourceIndex
from flagtrial.gates.model import ModelFacts
from flagtrial.gates.reader import SourceReader

# a model architecture's class name: LlamaForCausalLM, IQuestQ1MTP, Qwen3VLModel
ARCHITECTURE = re.compile(r"^[A-Z][A-Za-z0-9]*(For[A-Z]\w*|Model|MTP|NextN)$")

_CACHE: dict[tuple[int, tuple[str, ...]], tuple[frozenset[int], tuple[str, ...]] | None] = {}
_LOCK = threading.Lock()


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _in_model_code(module: str, packages: tuple[str, ...]) -> bool:
    return any(_inside(module, package) for package in packages)


def _packages(index: SourceIndex) -> tuple[str, ...]:
    layout = index.layout
    return tuple(f"{layout.package}.{p.replace('/', '.')}" for p in layout.model_packages)


def _defining(
    index: SourceIndex, reader: SourceReader, packages: tuple[str, ...], arch: str
) -> set[str]:
    """The model modules that implement `arch`: a class of that name, or a registry entry
    naming the module (`"Arch": ("llama", ...)`, relative to the registry's package, or
    `"Arch": (\n "vllm.models.glm5next", ...)`)."""
    entry = re.compile(rf'^\s*"{re.escape(arch)}":\s*\(\s*"([\w.]+)"', re.M)
    found = set()
    for fi, info in enumerate(index.files):
        if not _in_model_code(info.module, packages):
            continue
        if arch in info.classes:
            found.add(info.module)
        if "registry" in info.module:
            here = info.module.rpartition(".")[0]
            for name in entry.findall("".join(reader.lines(fi))):
                found.add(name if "." in name else f"{here}.{name}")
    return found


def _named_by_path(index: SourceIndex, packages: tuple[str, ...]) -> set[str]:
    """Model modules that code outside the model packages names in a string (a class or
    module path it imports when chosen, `FileInfo.named`): the longest indexed module each
    such path starts with."""
    named: set[str] = set()
    for info in index.files:
        if _in_model_code(info.module, packages):
            continue
        for path in info.named:
            parts = path.split(".")
            prefixes = (".".join(parts[:k]) for k in range(len(parts), 0, -1))
            module = next((m for m in prefixes if m in index.modules), None)
            if module and _in_model_code(module, packages):
                named.add(module)
    return named


def _loaded(
    index: SourceIndex, reader: SourceReader, archs: tuple[str, ...]
) -> tuple[frozenset[int], tuple[str, ...]] | None:
    """The model package's files that run for this model, and the modules its architectures
    are built from; None when the package or an architecture's module is not found."""
    packages = _packages(index)
    if not packages:
        return None
    seeds: set[str] = set()
    for arch in archs:
        modules = _defining(index, reader, packages, arch)
        if not modules:
            return None
        seeds |= modules
    built = tuple(sorted(seeds))
    # what code outside the model packages loads from them (the registry, loaders, runners)
    seeds |= {
        m for info in index.files if not _in_model_code(info.module, packages) for m in info.loads
    }
    seeds |= _named_by_path(index, packages)
    seeds.update(packages)
    done: set[int] = set()
    todo = sorted(seeds)
    while todo:
        module = todo.pop()
        # a module's parents run first (`models/deepseek_common/__init__.py`)
        parts = module.split(".")
        for k in range(1, len(parts) + 1):
            fi = index.modules.get(".".join(parts[:k]))
            if fi is None or fi in done or not _in_model_code(index.files[fi].module, packages):
                continue
            done.add(fi)
            todo.extend(index.files[fi].loads)
    return frozenset(done), built


def other_model(
    index: SourceIndex, reader: SourceReader, fi: int, line: int | None, model: ModelFacts
) -> str | None:
    """Why a read at `line` of file `fi` (any line when None) never runs for this model, or
    None when it may."""
    info = index.files[fi]
    if not model.architectures:
        return None
    if line is not None:
        served = _served_by_map(index, reader, fi, line, model.architectures)
        if served is not None:
            return served
    if not _in_model_code(info.module, _packages(index)):
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


_MAPS: dict[tuple[int, int], dict[str, set[str]]] = {}


def _architecture_maps(index: SourceIndex, reader: SourceReader, fi: int) -> dict[str, set[str]]:
    """class -> the architectures a module-level dict keyed by architectures maps to it."""
    key = (id(index), fi)
    with _LOCK:
        if key in _MAPS:
            return _MAPS[key]
    info = index.files[fi]
    mapped: dict[str, set[str]] = {}
    for spans in info.assigns.values():
        for start, end, conditional in spans:
            stmts = [] if conditional else reader.unit(fi, start, end)
            value = (
                stmts[0].value
                if stmts and isinstance(stmts[0], ast.Assign | ast.AnnAssign)
                else None
            )
            if not isinstance(value, ast.Dict) or len(value.keys) < 3:
                continue
            keys = [k.value if isinstance(k, ast.Constant) else None for k in value.keys]
            if not all(isinstance(k, str) and k[:1].isupper() for k in keys):
                continue
            if sum(bool(ARCHITECTURE.match(str(k))) for k in keys) * 2 < len(keys):
                continue
            if not all(isinstance(v, ast.Name) and v.id in info.classes for v in value.values):
                continue
            for k, v in zip(keys, value.values, strict=True):
                assert isinstance(v, ast.Name)
                mapped.setdefault(v.id, set()).add(str(k))
    with _LOCK:
        _MAPS[key] = mapped
    return mapped


def _served_by_map(
    index: SourceIndex, reader: SourceReader, fi: int, line: int, archs: tuple[str, ...]
) -> str | None:
    info = index.files[fi]
    mapped = _architecture_maps(index, reader, fi)
    owner = next(
        (c for c in info.classes.values() if c.start <= line <= c.end and c.name in mapped), None
    )
    if owner is None:
        return None
    chosen = {c for c, given in mapped.items() if given & set(archs)}
    # the chosen classes and every class they inherit from in this module
    todo = list(chosen)
    while todo:
        cls = info.classes.get(todo.pop())
        for base in cls.bases if cls else ():
            if base in info.classes and base not in chosen:
                chosen.add(base)
                todo.append(base)
    if owner.name in chosen:
        return None
    if imported_elsewhere(index, fi, owner.name):
        return None
    serves = ", ".join(sorted(mapped[owner.name])[:3])
    return (
        f"{info.path}: {owner.name} serves {serves}, not {'/'.join(archs)}: a table keyed by"
        " architecture gives this model another class or none"
    )


def imported_elsewhere(index: SourceIndex, fi: int, name: str) -> bool:
    """Whether a file other than `fi` imports `name` from it, or its module whole."""
    module = index.files[fi].module
    return any(
        module in info.loads or f"{module}.{name}" in info.loads
        for j, info in enumerate(index.files)
        if j != fi
    )
