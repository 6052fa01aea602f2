"""A real SGLang server (PyPI `sglang` 0.5.23 on CPU torch, built by scripts/install-sglang.sh
with its stand-in `sgl_kernel`) serving the tiny generated Llama, as a unit under the process
target.

A start costs about a minute on two cores (mostly imports), so the tests of a module share
one project and its server (`sglang_trials`), as the vLLM tests do: a test that finds the
known-good serving (the last test's, or a trial's restore) starts nothing; tests that only
read the server use `sglang_server`. The KV cache is always bounded (`--max-total-tokens`):
by default SGLang sizes it from free RAM (15 GB here). The server stops with its module.
Every start holds the heavy-server lock (one real vLLM or SGLang at a time on the test
machine), taken by the caller: `flock /tmp/ft-heavy.lock pytest tests/test_sglang_real.py`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import flagtrial
from flagtrial.cache import SGLANG_OLDER_VERSION, SGLANG_VERSION, cache_root, sglang_python
from flagtrial.demo import free_port
from flagtrial.engines.sglang import SglangEngine
from flagtrial.facts import Facts
from flagtrial.load.workload import Workload
from flagtrial.targets.process import ProcessTarget
from harness.cli import cli
from harness.servers import serve_known_good, stop_served
from harness.standin import write_project

# SGLang's CPU platform is chosen by this variable alone (srt/utils/common.py `is_cpu`); no
# hub; PYTHONPATH cleared: tests that point it at a wheel's source must not reach the server.
SGLANG_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
READY_TIMEOUT_S = 300.0
MODULE = "sglang.launch_server"
# 2048 KV tokens: short requests are bound by --max-running-requests, long ones by the cache.
KV_TOKENS = 2048


def _installed(version: str) -> Path:
    path = sglang_python(version)
    if not path.exists():
        # make test installs it first; a missing venv is a set-up failure, not a skip.
        pytest.fail(
            f"SGLang {version} not installed at {path}: run "
            f"SGLANG_VERSION={version} scripts/install-sglang.sh"
        )
    return path


@pytest.fixture(scope="session")
def sglang_bin() -> Path:
    return _installed(SGLANG_VERSION)


@pytest.fixture(scope="session")
def sglang_older_bin() -> Path:
    return _installed(SGLANG_OLDER_VERSION)


@pytest.fixture(scope="session")
def sglang_model(sglang_bin: Path) -> Path:
    """The tiny Llama (the vLLM tests' one), generated once into the cache. Its vocabulary is
    the tokenizer's own size, so no sampled id decodes to nothing."""
    out = cache_root() / "models" / "tiny-llama-hf"
    src = Path(flagtrial.__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"}
    subprocess.run(
        [str(sglang_bin), "-m", "flagtrial.hfmodelgen", str(out)],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def sglang_args(model: Path, port: int, *extra: str) -> list[str]:
    return [
        "--model-path",
        str(model),
        "--device",
        "cpu",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-total-tokens",
        str(KV_TOKENS),
        "--enable-metrics",
        *extra,
    ]


def write_sglang_project(
    root: Path, python: Path, model: Path, port: int, *extra: str, policy: str = "runs = 3\n"
) -> Path:
    """A flagtrial project whose unit runs the real SGLang server on `port`."""
    return write_project(
        root,
        "sglang",
        sglang_args(model, port, *extra),
        SGLANG_ENV,
        policy,
        program=[str(python), "-m", MODULE],
        ready_timeout_s=READY_TIMEOUT_S,
    )


@dataclass
class SglangServer:
    project: Path
    target: ProcessTarget
    url: str
    mark: str  # where this start's log begins

    def log(self) -> str:
        return asyncio.run(self.target.logs_since(self.mark))

    def facts(self, workload: Workload | None = None) -> Facts:
        log = self.log()

        async def read() -> Facts:
            async with httpx.AsyncClient(timeout=30.0) as client:
                return await SglangEngine(workload).facts(client, self.url, log)

        return asyncio.run(read())


# The known-good of the module's trials and read-only tests (no restart between them).
RUNNING_8 = ("--max-running-requests", "8")


@dataclass
class SglangTrials:
    """The module's project: one unit on one port, one ledger, one server at a time."""

    root: Path
    python: Path
    model: Path
    port: int

    def project(self, policy: str = "runs = 3\n") -> Path:
        """The project file, its unit's known-good (RUNNING_8) installed, not started."""
        return write_sglang_project(
            self.root, self.python, self.model, self.port, *RUNNING_8, policy=policy
        )

    def serve(self) -> SglangServer:
        """The known-good serving and recorded in the ledger: started only when another
        spec (or none) is serving."""
        project_file = self.project()
        target, mark = serve_known_good(project_file)
        return SglangServer(project_file, target, f"http://127.0.0.1:{self.port}", mark)

    def stop(self) -> None:
        stop_served(self.root / "flagtrial.toml")

    def attributed_trial(self, *args: str) -> dict[str, Any]:
        """`flagtrial trial ... --attribute --json` on the module's server, left serving what
        the trial ends on (the known-good restored, or the candidate kept)."""
        # the candidate's start and one block are all these tests need of the measurement
        project = self.project(policy="runs = 2\nmax_runs = 4\nmax_seconds = 30\n")
        result = cli(project, "trial", *args, "--attribute", "--json", timeout=1200)
        assert result.returncode in (0, 10, 11), result.stdout + result.stderr
        out: dict[str, Any] = json.loads(result.stdout)
        unit = self.root / "sglang.service"
        assert "--watchdog-timeout" not in unit.read_text() or out["outcome"] == "kept"
        return out


@pytest.fixture(scope="module")
def sglang_trials(
    tmp_path_factory: pytest.TempPathFactory, sglang_bin: Path, sglang_model: Path
) -> Iterator[SglangTrials]:
    trials = SglangTrials(tmp_path_factory.mktemp("sglang"), sglang_bin, sglang_model, free_port())
    try:
        yield trials
    finally:
        trials.stop()


@pytest.fixture
def sglang_server(sglang_trials: SglangTrials) -> SglangServer:
    """The module's server on its known-good (RUNNING_8), ready."""
    return sglang_trials.serve()
