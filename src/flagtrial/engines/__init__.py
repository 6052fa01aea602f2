"""Engines: what kind of server it is, one adapter per file."""

from __future__ import annotations

from flagtrial.engines.base import Engine
from flagtrial.engines.llamacpp import LlamaCppEngine
from flagtrial.errors import ProjectError


def make_engine(name: str) -> Engine:
    if name == "llamacpp":
        return LlamaCppEngine()
    raise ProjectError(f"engine {name!r} is not supported yet (use 'llamacpp')")
