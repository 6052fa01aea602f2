"""Measure the gate analysis on this machine: download, index and query times.

Targets (issue 6): indexing the sglang 0.5.23 wheel in <= 10 s; a query in <= 100 ms once
indexed. Writes results.json next to this file. The machine's load average is recorded
beside every number: other work on the same cores slows indexing proportionally.

    .venv/bin/python benchmarks/gates/bench_gates.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import tempfile
import time
from pathlib import Path

from flagtrial.gates.analyze import analyze_change
from flagtrial.gates.index import build_index, load_index
from flagtrial.gates.model import GateHost
from flagtrial.gates.wheel import engine_source

HERE = Path(__file__).parent
SGLANG = ("sglang", "0.5.23")
VLLM = ("vllm", "0.33.0")
HOSTS = {
    "SM90": GateHost.sm("9.0", gpus=4),
    "SM120": GateHost.sm("12.0", gpus=4),
    "ROCm": GateHost(compute_cap=(9, 4), platform="rocm", gpu_count=4),
}
QUERIES = [
    (SGLANG, "--enable-flashinfer-allreduce-fusion", None),
    (SGLANG, "--attention-backend", "fa3"),
    (SGLANG, "--attention-backend", "trtllm_mla"),
    (SGLANG, "--enable-deepseek-v4-fp4-indexer", None),
    (SGLANG, "--max-running-requests", "64"),
    (SGLANG, "--chunked-prefill-size", "8192"),
    (SGLANG, "--mem-fraction-static", "0.8"),
    (VLLM, "--kda-prefill-backend", "fused"),
    (VLLM, "--max-num-seqs", "64"),
    (VLLM, "--compilation-config.pass_config.fuse_rope_kvcache", "true"),
]


def _timed(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def bench_cold_download() -> dict:
    """pip download + .py extraction into an empty cache (the network part of a first run)."""
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FLAGTRIAL_CACHE"] = tmp
        try:
            _, seconds = _timed(engine_source, *SGLANG)
        finally:
            del os.environ["FLAGTRIAL_CACHE"]
    return {"sglang_0_5_23_download_extract_s": round(seconds, 2)}


def bench_index(repeat: int) -> dict:
    root = engine_source(*SGLANG)
    times, loads, cpu = [], [], []
    for _ in range(repeat):
        load = os.getloadavg()[0]
        before = os.times()
        index, seconds = _timed(build_index, root, *SGLANG)
        after = os.times()
        times.append(seconds)
        loads.append(load)
        # CPU seconds of this process and its workers: what the build costs on idle cores.
        cpu.append(sum(after[:4]) - sum(before[:4]))
    data = pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL)
    _, unpickle_s = _timed(pickle.loads, data)
    return {
        "sglang_0_5_23_index_s": [round(t, 2) for t in times],
        "sglang_0_5_23_index_median_s": round(statistics.median(times), 2),
        "load_average_before_each": [round(x, 2) for x in loads],
        "cpu_s_each": [round(x, 2) for x in cpu],
        "cpu_s_per_core_median": round(statistics.median(cpu) / (os.cpu_count() or 1), 2),
        "files_indexed": len(index.files),
        "index_size_mb": round(len(data) / 1e6, 1),
        "index_load_from_disk_s": round(unpickle_s, 3),
        "target_s": 10,
    }


def bench_queries(repeat: int) -> dict:
    for engine in (SGLANG, VLLM):
        load_index(engine_source(*engine), *engine)
    first, warm = [], []
    rows = []
    for engine, flag, value in QUERIES:
        for host_name, host in HOSTS.items():
            (finding,), seconds = _timed(analyze_change, *engine, [(flag, value)], host, 4)
            first.append(seconds)
            again = [_timed(analyze_change, *engine, [(flag, value)], host, 4)[1]]
            again += [
                _timed(analyze_change, *engine, [(flag, value)], host, 4)[1]
                for _ in range(repeat - 1)
            ]
            warm.append(statistics.median(again))
            rows.append(
                {
                    "engine": f"{engine[0]}=={engine[1]}",
                    "edit": f"{flag} {value or ''}".strip(),
                    "host": host_name,
                    "outcome": finding.outcome.value,
                    "first_ms": round(seconds * 1000, 1),
                    "repeat_median_ms": round(statistics.median(again) * 1000, 1),
                }
            )
    return {
        "queries": rows,
        "first_query_median_ms": round(statistics.median(first) * 1000, 1),
        "first_query_max_ms": round(max(first) * 1000, 1),
        "repeat_query_median_ms": round(statistics.median(warm) * 1000, 1),
        "repeat_query_max_ms": round(max(warm) * 1000, 1),
        "target_ms": 100,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    results = {
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()[0]},
        "download": bench_cold_download(),
        "index": bench_index(args.repeat),
        "query": bench_queries(args.repeat),
    }
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "query"}, indent=2))
    q = results["query"]
    print({k: v for k, v in q.items() if k != "queries"})


if __name__ == "__main__":
    main()
