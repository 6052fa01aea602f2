"""Engines: what kind of server it is, one adapter per file, registered here. Each adapter
knows its own defaults (port, program detection, tensor-parallel flags, whether the gate
analysis reads its source); nothing here names an engine but the registry."""

from __future__ import annotations

from pathlib import PurePath

from flagtrial.engines.base import Engine, WorkloadSized
from flagtrial.engines.llamacpp import LlamaCppEngine
from flagtrial.engines.sglang import SglangEngine
from flagtrial.engines.vllm import VllmEngine
from flagtrial.errors import ProjectError
from flagtrial.load.workload import Workload

_ADAPTERS: tuple[type[Engine], ...] = (LlamaCppEngine, SglangEngine, VllmEngine)
ENGINES: dict[str, type[Engine]] = {e.name: e for e in _ADAPTERS}
# The engines whose source the gate analysis reads.
GATED = tuple(name for name, e in ENGINES.items() if e.source_gates)


def make_engine(name: str, workload: Workload | None = None) -> Engine:
    """The engine's adapter; `workload`, the project's, sizes the requests its facts count."""
    if name not in ENGINES:
        raise ProjectError(f"engine {name!r} is not supported (use {', '.join(ENGINES)})")
    engine = ENGINES[name]()
    if isinstance(engine, WorkloadSized):
        engine.workload = workload
    return engine


def detect_engine(argv: list[str]) -> str | None:
    """Which engine a command line starts, from its program words."""
    # module paths count word by word: `sglang.launch_server`, `flagtrial.standin.vllm`
    parts = {p for w in argv[:4] for p in PurePath(w).name.split(".")}
    return next((name for name, e in ENGINES.items() if e.starts(parts)), None)
