"""One run's load: closed loop (N workers, each sending its next request as soon as the last
one ends) or open loop (requests arriving at a rate, Poisson or evenly spaced, at most N in
flight), with what sending it cost the client."""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import random
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from flagtrial.load.client import RequestRecord, send_request
from flagtrial.load.client_load import ClientLoad
from flagtrial.load.http import Pool
from flagtrial.load.prompts import Request, plan_request
from flagtrial.load.summary import RunSummary, summarize
from flagtrial.load.workload import Workload

# Open loop from several processes: time for them all to start (spawned interpreters import
# flagtrial's load modules) before the first arrival is due.
START_GRACE_S = 3.0


# A conversation: the indices of its requests, one per turn (one for a plain request).
Conversation = tuple[int, ...]


def conversations(indices: range, turns: int) -> list[Conversation]:
    """`indices` as conversations of `turns` requests, in order (the last one cut short)."""
    return [tuple(indices[k : k + turns]) for k in range(0, len(indices), turns)]


@dataclass
class RunResult:
    """One measured run at one concurrency level: its summary and every measured request."""

    summary: RunSummary
    records: list[RequestRecord]


async def _converse(
    pool: Pool, workload: Workload, turns: Conversation, seed: int, run_deadline: float
) -> list[RequestRecord]:
    """One conversation's requests, one after another: a single index is one plain request;
    more are chat turns, each sending the whole conversation so far (the earlier user turns
    and the answers as the server streamed them). A failed turn ends its conversation (the
    next has no answer to send back); so does the run's bound."""
    loop = asyncio.get_running_loop()
    chat = len(turns) > 1
    history: list[dict[str, Any]] = []
    records = []
    for index in turns:
        if loop.time() >= run_deadline:
            break
        request = plan_request(workload, index, seed)
        if chat:
            asked = {"role": "user", "content": request.prompt}
            request = Request(None, [*history, asked], request.max_tokens)
        record = await send_request(
            pool, workload, request, run_deadline=run_deadline, keep_answer=chat
        )
        records.append(record)
        if not record.ok:
            break
        if chat:
            history += [asked, {"role": "assistant", "content": record.answer or ""}]
    return records


async def _closed_loop(
    pool: Pool,
    workload: Workload,
    concurrency: int,
    conversations: Sequence[Conversation],
    seed: int,
) -> list[RequestRecord]:
    """Send every conversation with `concurrency` in flight, within workload.run_timeout_s.

    Every request started gets a record: one in flight at the bound is recorded as an error.
    """
    loop = asyncio.get_running_loop()
    run_deadline = loop.time() + workload.run_timeout_s
    pending = iter(conversations)
    records: list[RequestRecord] = []

    async def worker() -> None:
        # One event loop: taking the next conversation between awaits needs no lock.
        for turns in pending:
            if loop.time() >= run_deadline:
                return
            records.extend(await _converse(pool, workload, turns, seed, run_deadline))

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(conversations)))))
    return records


def arrival_offsets(workload: Workload, rate: float, indices: Sequence[int]) -> list[float]:
    """When each request (or conversation, by its first index) is due, in seconds from the
    run's start: exponential gaps (Poisson) or even ones, drawn by index alone so both arms
    see the same arrivals."""
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
    arrivals: Sequence[tuple[Conversation, float]],
    start: float,
    seed: int,
) -> tuple[list[RequestRecord], int]:
    """Start each conversation of `arrivals` at `start + offset` (event-loop time), at most
    `concurrency` in flight, within workload.run_timeout_s: the records, and how many had to
    wait for a free slot (then the offered rate was not what the server got)."""
    loop = asyncio.get_running_loop()
    run_deadline = start + workload.run_timeout_s
    slots = asyncio.Semaphore(concurrency)
    records: list[RequestRecord] = []
    delayed = 0

    async def one(turns: Conversation) -> None:
        nonlocal delayed
        if slots.locked():
            delayed += 1
        async with slots:
            records.extend(await _converse(pool, workload, turns, seed, run_deadline))

    tasks = []
    for turns, offset in arrivals:
        if start + offset >= run_deadline:
            break
        await asyncio.sleep(max(0.0, start + offset - loop.time()))
        tasks.append(asyncio.create_task(one(turns)))
    await asyncio.gather(*tasks)
    return records, delayed


@dataclass
class Share:
    """What one client process sends of a run: its part of the concurrency and of the
    conversations, and (open loop) when each is due, from `start` (time.monotonic, the clock
    every process shares and asyncio's own)."""

    base_url: str
    workload: Workload
    concurrency: int
    warmup: list[Conversation]
    measured: list[Conversation]
    seed: int
    arrivals: list[float] | None = None  # one offset per measured conversation
    start: float = 0.0


@dataclass
class Sent:
    records: list[RequestRecord]
    delayed: int
    client: ClientLoad


async def _send(share: Share) -> Sent:
    # Keep-alive connections, one per worker; no proxy from the environment is ever used.
    pool = Pool(share.base_url)
    w = share.workload
    try:
        if share.warmup:
            await _closed_loop(pool, w, share.concurrency, share.warmup, share.seed)
        client = ClientLoad()
        async with client.watching():
            if share.arrivals is None:
                records = await _closed_loop(pool, w, share.concurrency, share.measured, share.seed)
                delayed = 0
            else:
                start = max(share.start, time.monotonic())
                due = list(zip(share.measured, share.arrivals, strict=True))
                opened = await _open_loop(pool, w, share.concurrency, due, start, share.seed)
                records, delayed = opened
    finally:
        pool.close()
    return Sent(records, delayed, client)


def _send_in_process(share: Share) -> Sent:
    """A client process's part of the run (ProcessPoolExecutor's entry point)."""
    return asyncio.run(_send(share))


def split(share: Share, processes: int) -> list[Share]:
    """`share` dealt to `processes` client processes: concurrency as evenly as it goes (none
    gets 0), conversations dealt in turn, each keeping its arrival time."""
    n = max(1, min(processes, share.concurrency))
    return [
        dataclasses.replace(
            share,
            concurrency=share.concurrency // n + (k < share.concurrency % n),
            warmup=share.warmup[k::n],
            measured=share.measured[k::n],
            arrivals=share.arrivals[k::n] if share.arrivals is not None else None,
        )
        for k in range(n)
    ]


async def _send_all(shares: list[Share]) -> Sent:
    """Each share in its own process, at once; their records merged (one clock: perf_counter
    is CLOCK_MONOTONIC, the same in every process), the busiest one's load kept."""
    if len(shares) == 1:
        return await _send(shares[0])
    loop = asyncio.get_running_loop()
    context = multiprocessing.get_context("spawn")  # the parent runs threads: no fork
    with ProcessPoolExecutor(len(shares), mp_context=context) as pool:
        sent = await asyncio.gather(
            *(loop.run_in_executor(pool, _send_in_process, share) for share in shares)
        )
    busiest = max(sent, key=lambda part: part.client.busy_s)
    return Sent(
        [record for part in sent for record in part.records],
        sum(part.delayed for part in sent),
        ClientLoad(busiest.client.busy_s, [lag for part in sent for lag in part.client.lags_s]),
    )


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
    With workload.client_processes above 1 the load is sent from that many processes.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    n = workload.requests_per_run if n_requests is None else n_requests
    n_warmup = workload.warmup_requests if warmup else 0
    measured = conversations(range(n_warmup, n_warmup + n), workload.turns)
    rate = workload.rate(concurrency)
    arrivals = None
    if rate is not None:
        arrivals = arrival_offsets(workload, rate, [turns[0] for turns in measured])
    warm = conversations(range(n_warmup), workload.turns)
    share = Share(base_url, workload, concurrency, warm, measured, seed, arrivals)
    shares = split(share, workload.client_processes)
    if len(shares) > 1 and arrivals is not None:
        # every process starts the arrivals at one moment, once all have started
        for part in shares:
            part.start = time.monotonic() + START_GRACE_S
    sent = await _send_all(shares)
    summary = summarize(
        sent.records,
        concurrency,
        ignore_eos=workload.ignore_eos,
        client=sent.client,
        n_delayed=sent.delayed,
        turns=workload.turns,
        offered_rate=rate,
    )
    return RunResult(summary=summary, records=sent.records)
