"""Aggregate one run's request records into the numbers a trial compares."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel

from flagtrial.load.client import RequestRecord
from flagtrial.load.client_load import ClientLoad


class RunSummary(BaseModel):
    """One run at one concurrency level. Times in seconds, rates per second.

    Failed requests count in n_requests, n_errors and error_rate, and their time counts in
    duration_s, but throughput (output_tokens, output_tok_s, request_rate) and the latency
    percentiles use successful requests only: a failure is never a fast request.
    Percentiles are None when no successful request gave that measure.
    """

    concurrency: int
    n_requests: int
    n_ok: int
    n_errors: int
    error_rate: float
    duration_s: float  # first start to last end over all measured requests
    output_tokens: int
    output_tok_s: float
    request_rate: float  # successful requests per second
    ttft_p50: float | None
    ttft_p90: float | None
    ttft_p99: float | None
    itl_p50: float | None
    itl_p90: float | None
    itl_p99: float | None
    e2e_p50: float | None
    errors: dict[str, int]  # error message -> count
    # Successful requests that returned fewer than max_tokens tokens: the server cut them
    # (e.g. the slot's context filled up), so throughput compares unequal work.
    n_short: int = 0
    # The client's own load: the share of the run its event loop's thread was on a CPU or
    # waiting for one (near 1.0 it could send and read no faster), and how late it woke.
    client_busy_share: float = 0.0
    client_lag_p99_s: float | None = None
    # Open loop: requests (conversations, with turns) that arrived while the concurrency cap
    # was full and waited.
    n_delayed: int = 0
    # Chat turns per conversation: each turn sent the conversation so far, so from the second
    # on most of its prompt is what the server saw (and may have cached) the turn before.
    turns: int = 1
    # Open loop: the rate asked at this level (request_rate counts what the server did).
    offered_rate: float | None = None
    # Requests that kept the policy's goodput limits (counted by the procedure, which holds
    # the policy; None when not counted).
    n_good: int | None = None
    # Prompt tokens the server says it served from its cache, of all prompt tokens it counted
    # (None where it reports neither).
    cached_prompt_share: float | None = None


def _percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float | None]:
    if not values:
        return [None for _ in qs]
    return [float(v) for v in np.percentile(values, qs, method="linear")]


def summarize(
    records: Sequence[RequestRecord],
    concurrency: int,
    *,
    ignore_eos: bool = False,
    client: ClientLoad | None = None,
    n_delayed: int = 0,
    turns: int = 1,
    offered_rate: float | None = None,
) -> RunSummary:
    """Summarise the measured records of one run at `concurrency` (see RunSummary for rules)."""
    ok = [r for r in records if r.ok]
    n_errors = len(records) - len(ok)
    duration = max(r.end for r in records) - min(r.start for r in records) if records else 0.0
    output_tokens = sum(r.output_tokens for r in ok)
    ttft = _percentiles([r.ttft_s for r in ok if r.ttft_s is not None], (50, 90, 99))
    itl = _percentiles([gap for r in ok for gap in r.itl_s], (50, 90, 99))
    (e2e_p50,) = _percentiles([r.end - r.start for r in ok], (50,))
    return RunSummary(
        concurrency=concurrency,
        n_requests=len(records),
        n_ok=len(ok),
        n_errors=n_errors,
        error_rate=n_errors / len(records) if records else 0.0,
        duration_s=duration,
        output_tokens=output_tokens,
        output_tok_s=output_tokens / duration if duration > 0 else 0.0,
        request_rate=len(ok) / duration if duration > 0 else 0.0,
        ttft_p50=ttft[0],
        ttft_p90=ttft[1],
        ttft_p99=ttft[2],
        itl_p50=itl[0],
        itl_p90=itl[1],
        itl_p99=itl[2],
        e2e_p50=e2e_p50,
        errors=dict(Counter(r.error for r in records if r.error is not None)),
        n_short=sum(1 for r in ok if ignore_eos and r.output_tokens < (r.max_tokens or 0)),
        # the watched span starts before the first request: never more than the whole run
        client_busy_share=min(client.busy_s / duration, 1.0) if client and duration > 0 else 0.0,
        client_lag_p99_s=_percentiles(client.lags_s, (99,))[0] if client else None,
        n_delayed=n_delayed,
        turns=turns,
        offered_rate=offered_rate,
        cached_prompt_share=_cached_share(ok),
    )


def _cached_share(ok: Sequence[RequestRecord]) -> float | None:
    reported = [r for r in ok if r.cached_tokens is not None and r.prompt_tokens]
    if not reported:
        return None
    return sum(r.cached_tokens or 0 for r in reported) / sum(r.prompt_tokens or 0 for r in reported)
