"""Code that runs only on another platform: a read there cannot act on this host.

A module is another platform's when its path names that platform's kernels or runtime
(`aiter_backend.py`, `rocm_*`, `npu/`, `cpu_attn.py`), or when at module level it imports a
package that exists only there (`from aiter import ...`, also inside a `try:`). Imports
under an `if` are left alone: the module then serves several platforms.
"""

from __future__ import annotations

import re
import threading

from flagtrial.gates.index import SourceIndex
from flagtrial.gates.model import GateHost
from flagtrial.gates.reader import SourceReader

# path word -> the platforms its code runs on
_PATH_WORDS: dict[str, frozenset[str]] = {
    **dict.fromkeys(("aiter", "rocm", "hip", "amd", "gfx942", "gfx950"), frozenset({"rocm"})),
    **dict.fromkeys(
        ("npu", "ascend", "xpu", "hpu", "habana", "musa", "tpu", "neuron", "mlu", "gaudi"),
        frozenset(),
    ),
    **dict.fromkeys(
        ("flashinfer", "trtllm", "cutlass", "flashmla", "deep_gemm", "deepgemm", "nvshmem"),
        frozenset({"cuda"}),
    ),
}
# packages that exist only on these platforms
_PACKAGES: dict[str, frozenset[str]] = {
    "aiter": frozenset({"rocm"}),
    "torch_npu": frozenset(),
    "habana_frameworks": frozenset(),
    "intel_extension_for_pytorch": frozenset({"cpu"}),
    "flashinfer": frozenset({"cuda"}),
    "deep_gemm": frozenset({"cuda"}),
}
_EVERYWHERE = frozenset({"cuda", "rocm", "cpu"})
# Runtimes the engine layout does not bind a platform class for.
EXTRA_PLATFORMS = {"cpu": "vllm.platforms.cpu:CpuPlatform"}


def platform_module(index: SourceIndex, platform: str) -> str | None:
    """The module of the platform class a runtime selects (`vllm.platforms.cpu` on CPU)."""
    for _, classes in index.layout.platform_objects.values():
        qual = classes.get(platform) or EXTRA_PLATFORMS.get(platform)
        if qual:
            return qual.split(":")[0]
    return None


def dependency_platforms(package: str) -> frozenset[str]:
    """Where an engine's dependency is installed: the platform-only ones where they exist,
    any other on every platform."""
    return _PACKAGES.get(package, _EVERYWHERE)


_WORD = re.compile(r"[/_.]")
_IMPORT = re.compile(r"^( {4})?(?:from|import)\s+([A-Za-z_]\w*)")

_CACHE: dict[tuple[int, int, str], str | None] = {}
_LOCK = threading.Lock()


def _platforms_of(index: SourceIndex, reader: SourceReader, fi: int) -> tuple[frozenset[str], str]:
    """The platforms a module is limited to (all when not limited), and why."""
    path = index.files[fi].path
    words = _WORD.split(path.removesuffix(".py"))
    name = words[-1] if words else ""
    for word in words:
        if word in _PATH_WORDS:
            return _PATH_WORDS[word], f"{path} is {word} code"
    # vLLM's CPU backend: cpu_attn.py, cpu_model_runner.py, platforms/cpu.py
    stem = path.rsplit("/", 1)[-1]
    if (stem.startswith("cpu_") and "offload" not in stem) or stem == "cpu.py" or name == "cpu":
        return frozenset({"cpu"}), f"{path} is the CPU backend"
    in_try = False
    for line in reader.lines(fi):
        if line[:1] not in (" ", "\t", "\n", "#", ""):
            in_try = line.startswith("try:")
        m = _IMPORT.match(line)
        if m and (m.group(1) is None or in_try) and m.group(2) in _PACKAGES:
            return _PACKAGES[m.group(2)], f"{path} imports {m.group(2)} at module level"
    return _EVERYWHERE, ""


def foreign_module(index: SourceIndex, reader: SourceReader, fi: int, host: GateHost) -> str | None:
    """Why module `fi` never runs on this host's platform, or None when it may."""
    key = (id(index), fi, host.platform)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    platforms, why = _platforms_of(index, reader, fi)
    result = None if host.platform in platforms else f"{why}: it never runs on {host.platform}"
    with _LOCK:
        _CACHE[key] = result
    return result
