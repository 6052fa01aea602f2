"""RunSummary values for tests of the statistics: one run of 16 requests in 5 s."""

from __future__ import annotations

from flagtrial.load.summary import RunSummary


def summary(tok_s: float, *, ttft: float = 0.5, errors: int = 0, c: int = 8) -> RunSummary:
    n = 16
    return RunSummary(
        concurrency=c,
        n_requests=n,
        n_ok=n - errors,
        n_errors=errors,
        error_rate=errors / n,
        duration_s=5.0,
        output_tokens=int(tok_s * 5),
        output_tok_s=tok_s,
        request_rate=(n - errors) / 5,
        ttft_p50=ttft,
        ttft_p90=ttft,
        ttft_p99=ttft,
        itl_p50=0.01,
        itl_p90=0.01,
        itl_p99=0.01,
        e2e_p50=1.0,
        errors={"HTTP 500": errors} if errors else {},
    )
