"""Capacity as a real llama-server admits it: every limit on concurrent requests (its slots,
the context of one slot, a unified KV cache's cells) at the workload's lengths as the server
counts them, the binding one named; then the server flooded beyond that capacity."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from flagtrial.demo import free_port
from flagtrial.engines import promtext
from flagtrial.facts import Facts, Limit, Rewrite, diff_facts
from flagtrial.load.prompts import build_prompt
from flagtrial.targets.process import ProcessTarget
from harness.cli import cli
from harness.project import update_project_file
from harness.standin import write_project

# What it asserts rests on the server's facts, crashes, bounds and files, never on a
# measured difference: may run beside another module (harness/machine.py).
pytestmark = [pytest.mark.slow, pytest.mark.shares_machine]


class Server:
    """A llama-server unit under the process target, read by `flagtrial facts`."""

    def __init__(self, root: Path, binary: Path, model: Path, *args: str) -> None:
        self.port = free_port()
        argv = ["-m", str(model), "--host", "127.0.0.1", "--port", str(self.port), "-t", "1"]
        self.project = write_project(root, "llamacpp", [*argv, *args], {}, program=[str(binary)])
        self.url = f"http://127.0.0.1:{self.port}"
        self.target = ProcessTarget(root / "llamacpp.service", root / ".flagtrial" / "process")

    def workload(self, prompt_words: int, max_tokens: int) -> None:
        workload = {"prompt_words": prompt_words, "max_tokens": max_tokens}
        update_project_file(self.project, workload=workload)

    def facts(self) -> Facts:
        """The known-good's facts as `flagtrial facts` reads them (it starts the server)."""
        out = cli(self.project, "facts", "--json", timeout=120)
        assert out.returncode == 0, out.stderr
        # Progress lines come first when it starts the server.
        return Facts.model_validate(json.loads(out.stdout[out.stdout.index("{\n") :])["facts"])

    def stop(self) -> None:
        asyncio.run(self.target.stop())


@pytest.fixture
def server(tmp_path: Path, llama_server_bin: Path, tiny_model: Path) -> Iterator:
    started: list[Server] = []

    def start(*args: str) -> Server:
        root = tmp_path / f"s{len(started)}"
        root.mkdir()
        started.append(Server(root, llama_server_bin, tiny_model, *args))
        return started[-1]

    yield start
    for s in started:
        s.stop()


def limits(facts: Facts) -> dict[str, Limit]:
    return {limit.name: limit for limit in facts.limits}


async def _flood(url: str, n: int, prompt_words: int, max_tokens: int) -> tuple[float, list[int]]:
    """n completions at once; (peak of llamacpp:requests_processing, each reply's completion
    tokens, or its HTTP status where it failed)."""
    peak = 0.0
    done = asyncio.Event()
    # The sampler has its own client: queued in the flood's pool, it could miss the flood.
    async with httpx.AsyncClient(timeout=120.0) as client, httpx.AsyncClient() as sampling:

        async def sample() -> None:
            nonlocal peak
            while not done.is_set():
                found = promtext.first(
                    promtext.parse((await sampling.get(f"{url}/metrics")).text),
                    "llamacpp:requests_processing",
                )
                peak = max(peak, found.value if found else 0.0)
                await asyncio.sleep(0.01)

        sampler = asyncio.create_task(sample())
        body = {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
        replies = await asyncio.gather(
            *(
                client.post(
                    f"{url}/v1/completions", json={**body, "prompt": build_prompt(i, prompt_words)}
                )
                for i in range(n)
            )
        )
        done.set()
        await sampler
    return peak, [
        r.json()["usage"]["completion_tokens"] if r.is_success else r.status_code for r in replies
    ]


def test_slots_bind_and_a_flood_runs_at_most_that_many(server) -> None:  # type: ignore[no-untyped-def]
    # 2048 cells over 8 slots: 256 per slot, and ~200-token requests fit in one.
    # HTTP threads beyond the flood's requests: by default (n_parallel + 2) every thread
    # would hold a waiting request and /metrics would answer only after the flood.
    s = server("-c", "2048", "-np", "8", "--metrics", "--threads-http", "40")
    s.workload(prompt_words=30, max_tokens=64)
    facts = s.facts()
    found = limits(facts)
    # The prompt's tokens as the server counted them (the tiny model's vocabulary splits a
    # word into about three tokens), plus the tokens asked for.
    assert facts.request_tokens is not None and 150 < facts.request_tokens <= 256
    assert found["total_slots"].admits == 8
    assert (found["n_ctx_slot"].setting, found["n_ctx_slot"].admits) == (256, 8)
    assert "kv_unified_cells" not in found
    assert facts.capacity["concurrent_requests"] == 8
    assert (
        facts.sources["concurrent_requests"] == "bound by total_slots = 8 (GET /props total_slots)"
    )
    # Four times what it admits: the running count peaks at the capacity, every reply whole.
    peak, codes = asyncio.run(_flood(s.url, 32, 30, 64))
    assert peak == facts.capacity["concurrent_requests"]
    assert codes == [64] * 32


def test_a_workload_longer_than_a_slot_is_admitted_nowhere(server) -> None:  # type: ignore[no-untyped-def]
    s = server("-c", "2048", "-np", "8")
    s.workload(prompt_words=30, max_tokens=200)  # ~100 prompt tokens + 200 > 256
    facts = s.facts()
    assert facts.request_tokens is not None and facts.request_tokens > 256
    assert limits(facts)["n_ctx_slot"].admits == 0
    assert facts.capacity["concurrent_requests"] == 0
    assert facts.sources["concurrent_requests"] == (
        f"bound by n_ctx_slot = 256 for {facts.request_tokens:g}-token requests "
        "(GET /props default_generation_settings.n_ctx)"
    )
    # What the server does with such a request: its output ends where the slot's context does.
    _, tokens = asyncio.run(_flood(s.url, 1, 30, 200))
    assert 0 < tokens[0] < 200


def test_unified_cache_binds_at_the_workload_length(server) -> None:  # type: ignore[no-untyped-def]
    # Four slots drawing on one pool of 2048 cells: two ~1000-token requests fill it.
    s = server("-c", "2048", "-np", "4", "--kv-unified", "--metrics")
    s.workload(prompt_words=30, max_tokens=900)
    facts = s.facts()
    tokens = facts.request_tokens
    assert tokens is not None and 2048 / 3 < tokens <= 1024
    pool = limits(facts)["kv_unified_cells"]
    assert (pool.setting, pool.admits) == (2048, 2048 // tokens) == (2048, 2)
    assert limits(facts)["total_slots"].admits == 4
    assert facts.capacity["concurrent_requests"] == 2
    assert facts.sources["concurrent_requests"].startswith(
        f"bound by kv_unified_cells = 2048 for {tokens:g}-token requests"
    )
    # llama.cpp starts every slot whatever the pool holds: what the pool admits is what
    # completes. Two at once complete; four at once fill the pool and fail.
    peak, done = asyncio.run(_flood(s.url, 2, 30, 900))
    assert (peak, done) == (2, [900, 900])
    _, done = asyncio.run(_flood(s.url, 4, 30, 900))
    assert 500 in done


def test_auto_parallel_is_four_unified_slots_bound_by_the_slots(server) -> None:  # type: ignore[no-untyped-def]
    s = server("-c", "2048", "-np", "-1")
    s.workload(prompt_words=30, max_tokens=64)
    facts = s.facts()
    found = limits(facts)
    assert facts.settings["kv_unified"] is True
    assert found["total_slots"].admits == 4
    assert found["kv_unified_cells"].admits == 2048 // facts.request_tokens  # type: ignore[operator]
    assert found["n_ctx_slot"].setting == 2048
    assert facts.capacity["concurrent_requests"] == 4


def test_diff_compares_both_sides_at_the_measured_length() -> None:
    """Facts read without a workload (the engine's figures) are compared at the length the
    other side measured: the known-good's full-context pool does not pass for a loss."""
    pool = Limit(name="kv_unified_cells", setting=2048, admits=1, source="log", per="pool")
    slots = Limit(name="total_slots", setting=8, admits=8, source="props")
    before = Facts(engine="llamacpp", capacity={"concurrent_requests": 1}, limits=[pool, slots])
    after = before.at_tokens(256)
    assert after.capacity["concurrent_requests"] == 8
    diff = diff_facts(before, after, set())
    assert [(c.before, c.after) for c in diff.capacity] == [(8, 8)]
    assert diff_facts(before, before.at_tokens(512), set()).capacity[0].after == 4


def test_a_rewrite_shows_once_whatever_its_cause_line_says() -> None:
    asked = Rewrite(name="enable_dbo", asked=True, got=False, cause="disabled (run 1)")
    before = Facts(engine="vllm", rewrites=[asked])
    again = Facts(engine="vllm", rewrites=[asked.model_copy(update={"cause": "disabled (2)"})])
    assert diff_facts(before, again, set()).implicit == []
    [change] = diff_facts(Facts(engine="vllm"), again, set()).implicit
    assert change.describe() == (
        "enable_dbo rewritten by the server: asked True, got False (disabled (2))"
    )
