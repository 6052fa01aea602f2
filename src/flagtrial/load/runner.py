"""Closed-loop load: N workers, each sending its next request as soon as the last one ends."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

from flagtrial.load.client import RequestRecord, build_prompt, send_request
from flagtrial.load.summary import RunSummary, summarize
from flagtrial.load.workload import Workload


@dataclass
class RunResult:
    """One measured run at one concurrency level: its summary and every measured request."""

    summary: RunSummary
    records: list[RequestRecord]


async def _closed_loop(
    client: httpx.AsyncClient,
    workload: Workload,
    concurrency: int,
    indices: range,
    seed: int,
) -> list[RequestRecord]:
    """Send one request per index with `concurrency` in flight, within workload.run_timeout_s.

    Every request started gets a record: one in flight at the bound is recorded as an error.
    """
    loop = asyncio.get_running_loop()
    run_deadline = loop.time() + workload.run_timeout_s
    pending = iter(indices)
    records: list[RequestRecord] = []

    async def worker() -> None:
        # One event loop: taking the next index between awaits needs no lock.
        for index in pending:
            if loop.time() >= run_deadline:
                return
            prompt = build_prompt(index, workload.prompt_words, seed)
            records.append(await send_request(client, workload, prompt, run_deadline=run_deadline))

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(indices)))))
    return records


async def run_level(
    base_url: str,
    workload: Workload,
    concurrency: int,
    *,
    n_requests: int | None = None,
    warmup: bool = True,
    seed: int = 0,
) -> RunResult:
    """Measure `workload` at one concurrency level against the server at `base_url`.

    Warm-up requests (workload.warmup_requests, same concurrency, own run bound) go first and
    are excluded. Then `n_requests` (default workload.requests_per_run) measured requests are
    sent, stopping early at workload.run_timeout_s. Warm-up and measured prompts never repeat
    within a call; pass a different `seed` per run so repeated runs on one server differ too.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    n = workload.requests_per_run if n_requests is None else n_requests
    n_warmup = workload.warmup_requests if warmup else 0
    # No keep-alive: a pooled connection the server already closed after a stream fails the
    # next request with "Server disconnected" (seen with llama-server), a client-side artefact
    # that would count as a server error. A fresh loopback connection costs far less than that.
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    # httpx's own 5 s default would cut off a request queued behind others; send_request
    # bounds each request by request_timeout_s itself. trust_env=False: no proxy from the
    # environment may sit between us and the server.
    timeout = httpx.Timeout(workload.request_timeout_s)
    async with httpx.AsyncClient(
        base_url=base_url, limits=limits, timeout=timeout, trust_env=False
    ) as client:
        if n_warmup:
            await _closed_loop(client, workload, concurrency, range(n_warmup), seed)
        records = await _closed_loop(
            client, workload, concurrency, range(n_warmup, n_warmup + n), seed
        )
    max_tokens = workload.max_tokens if workload.ignore_eos else None
    return RunResult(summary=summarize(records, concurrency, max_tokens), records=records)
