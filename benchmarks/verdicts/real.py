"""Real trials on llama-server: A/A (a flag that cannot matter) and a known large effect.

Each trial is the sequential procedure (flagtrial.sequential, interleaved restart blocks)
driving a real llama-server on 127.0.0.1: every block after the first (the server as
found) restarts it with the arm's flags, runs the warm-up, then one measured run;
flagtrial.hygiene samples the foreign load around every run. The large-effect trials
alternate with their mirror image (which arm has the effect). Bounded: `--budget-s` for the
whole script, `--trial-s` per trial. Writes results[--key] of results.json; other sections
are kept.

    .venv/bin/python benchmarks/verdicts/real.py --aa 5 --large 3 --trial-s 100 --budget-s 600
    .venv/bin/python benchmarks/verdicts/real.py --aa 9 --large 0 --trial-s 200 \
        --budget-s 560 --key real_aa_200s
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from server import DEFAULT_ARGS, Server, model
from simulate import NO_DIFF

from flagtrial.hygiene import disturbed, foreign_load, sample_local
from flagtrial.load.runner import run_level_sync
from flagtrial.load.workload import Workload
from flagtrial.sequential import Continue, Design, Sequential
from flagtrial.settings import Policy

HERE = Path(__file__).parent
RESULTS = HERE / "results.json"
LEVEL = 8
WORKLOAD = Workload(
    concurrency=[LEVEL],
    requests_per_run=16,
    prompt_words=32,
    max_tokens=32,
    warmup_requests=2,
    run_timeout_s=60,
)
ONE_SLOT = ("--threads", "1", "--ctx-size", "8192", "--parallel", "1")


def trial(
    srv: Server,
    policy: Policy,
    base: tuple[str, ...],
    cand: tuple[str, ...],
    seed: int,
    hygiene: bool,
) -> dict:
    seq = Sequential(policy, [LEVEL], Design("interleaved", 1, "real"))
    load_s = 0.0
    foreign: list[float] = []
    flagged: list[bool] = []  # what hygiene said, whether or not it was heeded
    began = time.monotonic()
    run = 0
    while isinstance(step := seq.decision(), Continue):
        t0 = time.monotonic()
        if step.restart:
            srv.restart(base if step.arm == "baseline" else cand)
        before = sample_local()
        t_run = time.monotonic()
        result = run_level_sync(
            srv.url, WORKLOAD, LEVEL, warmup=step.warmup, seed=seed * 100_000 + run * 100
        )
        load_s += time.monotonic() - t_run
        load = foreign_load(before, sample_local(), srv.pid, os.getpid())
        foreign.append(load.cpu_cores)
        why = disturbed(load, policy.foreign_cpu_max_cores)
        flagged.append(why is not None)
        seq.observe(
            step.arm,
            LEVEL,
            result.summary,
            records=result.records,
            disturbed=why if hygiene else None,
            elapsed_s=time.monotonic() - t0,
        )
        run += 1
    verdict = step.verdict(policy, NO_DIFF)
    primary = next((e for e in verdict.effects if e.metric == policy.primary_metric), None)
    return {
        "decision": verdict.decision,
        "finding": verdict.finding,
        "why": step.why,
        "reason": verdict.reasons[0],
        "runs": run,
        "load_s": load_s,
        "wall_s": time.monotonic() - began,
        "effect_pct": primary.pct if primary else None,
        "interval_pct": [primary.lo_pct, primary.hi_pct] if primary else None,
        "foreign_cores_median": float(np.median(foreign)),
        "disturbed": int(sum(flagged)),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--aa", type=int, default=6, help="A/A trials")
    ap.add_argument("--large", type=int, default=4, help="large-effect trials")
    ap.add_argument("--trial-s", type=float, default=120.0, help="max_seconds of a trial")
    ap.add_argument("--budget-s", type=float, default=600.0, help="whole script")
    ap.add_argument("--foreign-limit", type=float, default=0.5, help="cores; policy's limit")
    ap.add_argument("--model", default="small")
    ap.add_argument("--key", default="real", help="section of results.json to write")
    ap.add_argument(
        "--hygiene",
        choices=("on", "off"),
        default="on",
        help="off: disturbed runs are counted but not set aside",
    )
    args = ap.parse_args()
    policy = Policy(max_seconds=args.trial_s, foreign_cpu_max_cores=args.foreign_limit)
    deadline = time.monotonic() + args.budget_s
    kinds = [("A/A", i) for i in range(args.aa)] + [("large", i) for i in range(args.large)]
    # Interleave the kinds so a busy spell of the machine does not fall on one kind only.
    kinds.sort(key=lambda k: k[1])
    out: list[dict] = []
    srv = Server(model(args.model), Path("/tmp") / f"flagtrial-real-{os.getpid()}.log")
    try:
        srv.start()
        for kind, i in kinds:
            if time.monotonic() + args.trial_s * 1.3 > deadline:
                break
            if kind == "A/A":
                base, cand, truth = DEFAULT_ARGS, (*DEFAULT_ARGS, "--alias", "candidate"), "none"
            elif i % 2 == 0:
                base, cand, truth = DEFAULT_ARGS, ONE_SLOT, "harm"  # 8 slots -> 1 at c=8
            else:
                base, cand, truth = ONE_SLOT, DEFAULT_ARGS, "gain"
            r = trial(srv, policy, base, cand, len(out) + 1, args.hygiene == "on")
            r.update(kind=kind, truth=truth, candidate=" ".join(cand))
            out.append(r)
            print(
                f"{kind} truth={truth}: {r['decision']} ({r['finding']}) after {r['runs']} runs, "
                f"{r['load_s']:.0f}s load; {r['reason'][:110]}",
                flush=True,
            )
    finally:
        srv.stop()
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[args.key] = {
        "model": args.model,
        "hygiene": args.hygiene,
        "workload": WORKLOAD.model_dump(),
        "policy": policy.model_dump(),
        "cpus": os.cpu_count(),
        "trials": out,
    }
    RESULTS.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
