"""One run's load: closed loop (N workers, each sending its next request as soon as the last
one ends) or open loop (requests arriving at a rate, Poisson or evenly spaced, at most N in
flight), with what sending it cost the client."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from flagtrial.load.client import RequestRecord, send_request
from flagtrial.load.client_load import ClientLoad
from flagtrial.load.http import Pool
from flagtrial.load.prompts import plan_request
from flagtrial.load.summary import RunSummary, summarize
from flagtrial.load.workload import Workload


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
            request = plan_request(workload, index, seed)
            records.append(await send_request(pool, workload, request, run_deadline=run_deadline))

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(indices)))))
    return records


def arrival_offsets(workload: Workload, rate: float, indices: range) -> list[float]:
    """When each request is due, in seconds from the run's start: exponential gaps (Poisson)
    or even ones, drawn by index alone so both arms see the same arrivals."""
    offsets, at = [], 0.0
    for index in indices:
        offsets.append(at)
        gap = random.Random(f"arrival:{index}").expovariate(rate)
        at += gap if workload.arrival == "poisson" else 1.0 / rate
    return offsets


async def _open_loop(
    pool: Pool,
    workload: Workload,
    concurrency: int,
    rate: float,
    indices: range,
    seed: int,
) -> tuple[list[RequestRecord], int]:
    """Send one request per index at its arrival time, at most `concurrency` in flight, within
    workload.run_timeout_s: the records, and how many had to wait for a free slot (then the
    offered rate was not what the server got)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    run_deadline = start + workload.run_timeout_s
    slots = asyncio.Semaphore(concurrency)
    records: list[RequestRecord] = []
    delayed = 0

    async def one(index: int) -> None:
        nonlocal delayed
        if slots.locked():
            delayed += 1
        async with slots:
            request = plan_request(workload, index, seed)
            records.append(await send_request(pool, workload, request, run_deadline=run_deadline))

    tasks = []
    for index, offset in zip(indices, arrival_offsets(workload, rate, indices), strict=True):
        if start + offset >= run_deadline:
            break
        await asyncio.sleep(max(0.0, start + offset - loop.time()))
        tasks.append(asyncio.create_task(one(index)))
    await asyncio.gather(*tasks)
    return records, delayed


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
        measured = range(n_warmup, n_warmup + n)
        rate = workload.rate(concurrency)
        async with client.watching():
            if rate is None:
                records, delayed = (
                    await _closed_loop(pool, workload, concurrency, measured, seed),
                    0,
                )
            else:
                records, delayed = await _open_loop(
                    pool, workload, concurrency, rate, measured, seed
                )
    finally:
        pool.close()
    summary = summarize(
        records,
        concurrency,
        ignore_eos=workload.ignore_eos,
        client=client,
        n_delayed=delayed,
    )
    return RunResult(summary=summary, records=records)
