"""Measure llama-server's run-to-run noise on this machine: the simulator's parameters.

Back-to-back runs (16 requests at concurrency 8, the issue's setup) in restart blocks of
`--block` runs, for `--minutes`; then runs beside one and two foreign busy processes.
Every run records the foreign load around it (flagtrial.hygiene). Raw runs go to
noise_runs.json; fit_noise.py turns them into the simulator's parameters.

    .venv/bin/python benchmarks/verdicts/measure_noise.py --minutes 25
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from server import server

from flagtrial.hygiene import disturbed, foreign_load, sample_local
from flagtrial.load.runner import run_level
from flagtrial.load.workload import Workload

HERE = Path(__file__).parent
WORKLOAD = Workload(concurrency=[8], requests_per_run=16, warmup_requests=2, run_timeout_s=60)
BUSY = [sys.executable, "-c", "while True: pass"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--block", type=int, default=6, help="runs per restart block")
    ap.add_argument("--out", type=Path, default=HERE / "noise_runs.json")
    args = ap.parse_args()
    runs: list[dict] = []
    seed = 0

    def measure(srv, block: int, index: int, busy: int) -> None:
        nonlocal seed
        seed += 1
        before = sample_local()
        t0 = time.time()
        result = asyncio.run(run_level(srv.url, WORKLOAD, 8, warmup=index == 0, seed=seed * 1000))
        load = foreign_load(before, sample_local(), srv.pid, os.getpid())
        s = result.summary
        runs.append(
            {
                "t": t0,
                "block": block,
                "index": index,
                "busy": busy,
                "duration_s": s.duration_s,
                "output_tok_s": s.output_tok_s,
                "request_rate": s.request_rate,
                "ttft_p50": s.ttft_p50,
                "ttft_p99": s.ttft_p99,
                "itl_p50": s.itl_p50,
                "errors": s.n_errors,
                "foreign_cores": load.cpu_cores,
                "disturbed": disturbed(load, 0.5),
            }
        )
        print(
            f"block {block} run {index} busy {busy}: {s.output_tok_s:.1f} tok/s "
            f"ttft99 {s.ttft_p99:.3f}s foreign {load.cpu_cores:.2f}",
            flush=True,
        )

    restarts: list[float] = []
    with server(Path("/tmp") / f"flagtrial-noise-{os.getpid()}.log") as srv:
        srv.start()
        end = time.time() + args.minutes * 60
        block = 0
        while time.time() < end:
            if block:
                restarts.append(srv.restart())
            for index in range(args.block):
                measure(srv, block, index, 0)
            block += 1
        for busy in (1, 2):
            procs = [subprocess.Popen(BUSY) for _ in range(busy)]
            try:
                time.sleep(1)
                block += 1
                for index in range(3):
                    measure(srv, block, index + 1, busy)
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
    args.out.write_text(json.dumps({"restarts_s": restarts, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
