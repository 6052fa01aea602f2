"""Closed-loop load: N workers, each sending its next request as soon as the last one ends."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from flagtrial.load.client import RequestRecord, build_prompt, send_request
from flagtrial.load.http import Pool
from flagtrial.load.summary import RunSummary, summarize
from flagtrial.load.workload import Workload

# How often the client's event loop is woken to see how late it runs.
LAG_PROBE_S = 0.005


def _thread_busy_s() -> float:
    """Seconds the calling thread has been on a CPU or runnable waiting for one (Linux's
    schedstat); its CPU time alone where the kernel keeps no schedstat."""
    try:
        on_cpu, waiting = Path("/proc/thread-self/schedstat").read_text().split()[:2]
    except (OSError, ValueError):
        return time.thread_time()
    return (int(on_cpu) + int(waiting)) / 1e9


@dataclass
class ClientLoad:
    """How busy sending a run kept the client: its event loop's thread (on a CPU or waiting
    for one: either way no response was read meanwhile) and how late the loop woke."""

    busy_s: float = 0.0
    lags_s: list[float] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()

        async def probe() -> None:
            while True:
                due = loop.time() + LAG_PROBE_S
                await asyncio.sleep(LAG_PROBE_S)
                self.lags_s.append(max(0.0, loop.time() - due))

        busy = _thread_busy_s()
        task = asyncio.create_task(probe())
        try:
            yield
        finally:
            task.cancel()
            self.busy_s = _thread_busy_s() - busy


@dataclass
class RunResult:
    """One measured run at one concurrency level: its summary and every measured request."""

    summary: RunSummary
    records: list[RequestRecord]


async def _closed_loop(
    pool: Pool,
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
            records.append(await send_request(pool, workload, prompt, run_deadline=run_deadline))

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
    # Keep-alive connections, one per worker; no proxy from the environment is ever used.
    pool = Pool(base_url)
    try:
        if n_warmup:
            await _closed_loop(pool, workload, concurrency, range(n_warmup), seed)
        client = ClientLoad()
        async with client.watching():
            records = await _closed_loop(
                pool, workload, concurrency, range(n_warmup, n_warmup + n), seed
            )
    finally:
        pool.close()
    max_tokens = workload.max_tokens if workload.ignore_eos else None
    summary = summarize(records, concurrency, max_tokens, client.busy_s, client.lags_s)
    return RunResult(summary=summary, records=records)
