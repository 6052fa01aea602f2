"""Engines: what kind of server it is, one adapter per file."""

from __future__ import annotations

from pathlib import PurePath

from flagtrial.engines.base import Engine
from flagtrial.engines.llamacpp import LlamaCppEngine
from flagtrial.errors import ProjectError

ENGINES: dict[str, type[Engine]] = {
    "llamacpp": LlamaCppEngine,
}

# Each engine's default HTTP port, for a project file written from a live unit.
DEFAULT_PORTS = {"llamacpp": 8080, "sglang": 30000, "vllm": 8000}


def make_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise ProjectError(f"engine {name!r} is not supported (use {', '.join(ENGINES)})")
    return ENGINES[name]()


def detect_engine(argv: list[str]) -> str | None:
    """Which engine a command line starts, from its program words."""
    words = [PurePath(w).name for w in argv[:4]]
    if any(w.startswith("llama-server") for w in words):
        return "llamacpp"
    if any(w.startswith("sglang") for w in words):
        return "sglang"
    if any(w == "vllm" or w.startswith("vllm.") for w in words):
        return "vllm"
    return None
