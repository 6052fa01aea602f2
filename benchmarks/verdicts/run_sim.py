"""Simulated trials: wrong-verdict rates and load of the sequential procedure vs fixed length.

For every noise model and true effect (0, +-2, +-5, +-10 %): `--trials` sequential trials
(flagtrial.sequential, the default Policy) and `--fixed-trials` fixed-length trials at each N
(one run of N requests per arm, judged by its point estimate as bench_serving users do, and
by flagtrial's earlier Welch judge on 16-request windows). Writes results["simulated"] of
results.json; other sections are kept.

    .venv/bin/python benchmarks/verdicts/run_sim.py --trials 1000 --fixed-trials 400
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
from simulate import Noise, fixed_decision, fixed_trial, sequential_trial, welch_interval

from flagtrial import spending, stats
from flagtrial.designs import BeforeAfter, Interleaved
from flagtrial.settings import Policy

HERE = Path(__file__).parent
RESULTS = HERE / "results.json"
EFFECTS = [-10.0, -5.0, -2.0, 0.0, 2.0, 5.0, 10.0]
FIXED_N = [16, 64, 256, 1024, 4096]
BASE = Noise("AR(1) lag-1 0.6, CV 3 %")


def noise_models(fit: dict | None) -> list[Noise]:
    iid = {"phi": 0.5, "ar_share": 0.0}
    models = [
        replace(BASE, name="iid, CV 1 %", cv=0.01, **iid),
        replace(BASE, name="iid, CV 3 %", **iid),
        replace(BASE, name="iid, CV 10 %", cv=0.10, **iid),
        BASE,
        replace(BASE, name="AR, CV 7.5 % (issue's peer measurement)", cv=0.075),
        replace(BASE, name="AR + drift 20 %/30 min", drift_pct_per_30min=20.0),
        replace(BASE, name="AR + outliers (2 % of runs, -30 %)", outlier_p=0.02),
        replace(
            BASE, name="AR + foreign bursts (1/2 min, 20 s, -40 %, 90 % seen)", burst_per_min=0.5
        ),
        replace(BASE, name="AR + slow warm-up (-15 % first run)", warmup_pct=15.0),
        replace(
            BASE,
            name="all of the above, CV 3 %",
            drift_pct_per_30min=20.0,
            outlier_p=0.02,
            burst_per_min=0.5,
            warmup_pct=15.0,
        ),
    ]
    if fit:
        models.append(Noise(**fit["noise"]))
    return models


class EveryPair:
    """The procedure before planned looks, for comparison: the confidence sequence
    (stats.anytime_interval) looked at after every pair, from the first it can bound."""

    at = (5,)
    horizon = 1 << 30

    def is_look(self, pairs: int) -> bool:
        return pairs >= 2

    def critical(self, pairs: int, paths: int = 0) -> float:
        return stats.anytime_multiplier(pairs, 0.05)


class EveryPairInterleaved(Interleaved):
    def looks(self, policy: Policy) -> spending.Looks:
        return EveryPair()  # type: ignore[return-value]

    @staticmethod
    def _after(looks: spending.Looks, pairs: int) -> dict:
        return {"after": pairs, "unit": "clean pairs"}


# (first look, growth) of the planned looks; the default first
LOOKS = [(spending.FIRST_LOOK, spending.GROWTH), (5, 1.5), (3, 1.2)]


def _seq_cell(args: tuple[Noise, float, int, int, str, tuple[int, float]]) -> dict:
    noise, effect, trials, seed, protocol, looks = args
    spending.FIRST_LOOK, spending.GROWTH = looks
    policy = Policy() if protocol != "before-after" else Policy(protocol="before-after", runs=6)
    design = {
        "interleaved": Interleaved(1, "simulated"),
        "every-pair": EveryPairInterleaved(1, "simulated"),
        "before-after": BeforeAfter(1, "simulated"),
    }[protocol]
    rng = np.random.default_rng(seed)
    outs = [sequential_trial(policy, design, noise, effect, rng) for _ in range(trials)]
    return {
        "noise": noise.name,
        "effect_pct": effect,
        "protocol": protocol,
        "looks": list(looks),
        "trials": trials,
        "decisions": dict(Counter(o.decision for o in outs)),
        "findings": dict(Counter(o.finding for o in outs)),
        "load_s_mean": float(np.mean([o.load_s for o in outs])),
        "load_s_p90": float(np.percentile([o.load_s for o in outs], 90)),
        "wall_s_mean": float(np.mean([o.wall_s for o in outs])),
        # the time to a verdict, restarts included, as a distribution
        "wall_s_pct": {
            str(q): float(np.percentile([o.wall_s for o in outs], q)) for q in (10, 50, 90)
        },
        "runs_mean": float(np.mean([o.runs for o in outs])),
    }


def _fixed_cell(args: tuple[Noise, float, int, int]) -> dict:
    noise, effect, trials, seed = args
    policy = Policy()
    rng = np.random.default_rng(seed)
    out = {"noise": noise.name, "effect_pct": effect, "trials": trials, "by_n": {}}
    for n in FIXED_N:
        point: Counter[str] = Counter()
        welch: Counter[str] = Counter()
        load = []
        for _ in range(trials):
            est, a, b, seconds = fixed_trial(noise, effect, n, rng)
            point[fixed_decision(est, policy)] += 1
            if len(a) >= 2:
                iv = welch_interval(a, b, policy.confidence)
                welch[fixed_decision(iv.est, policy, iv.lo, iv.hi)] += 1
            load.append(seconds)
        out["by_n"][str(n)] = {
            "point": dict(point),
            "welch": dict(welch),
            "load_s_mean": float(np.mean(load)),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--fixed-trials", type=int, default=400)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    fit_path = HERE / "noise_fit.json"
    fit = json.loads(fit_path.read_text()) if fit_path.exists() else None
    models = noise_models(fit)
    seq_jobs = [
        (noise, e, args.trials, 1000 * i + j, protocol, LOOKS[0])
        for i, noise in enumerate(models)
        for j, e in enumerate(EFFECTS)
        for protocol in ("interleaved", "every-pair")  # the same seeds: the same machines
    ]
    # Other look plans, on the main model; and the before-after design.
    seq_jobs += [
        (BASE, e, args.trials // 2, 50_000 + 10 * j + k, "interleaved", looks)
        for j, e in enumerate(EFFECTS)
        for k, looks in enumerate(LOOKS[1:])
    ]
    drift = models[5]
    seq_jobs += [
        (noise, e, args.trials // 2, 60_000 + 100 * i + j, "before-after", LOOKS[0])
        for i, noise in enumerate((BASE, drift))
        for j, e in enumerate(EFFECTS)
    ]
    fixed_jobs = [
        (noise, e, args.fixed_trials, 90_000 + 1000 * i + j)
        for i, noise in enumerate(models)
        for j, e in enumerate(EFFECTS)
    ]
    began = time.time()
    with ProcessPoolExecutor(args.workers) as pool:
        seq = list(pool.map(_seq_cell, seq_jobs))
        print(f"sequential: {len(seq)} cells in {time.time() - began:.0f}s", flush=True)
        fixed = list(pool.map(_fixed_cell, fixed_jobs))
        print(f"fixed: {len(fixed)} cells in {time.time() - began:.0f}s", flush=True)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results["simulated"] = {
        "effects_pct": EFFECTS,
        "fixed_n": FIXED_N,
        "noise_models": [asdict(m) for m in models],
        "looks": [list(plan) for plan in LOOKS],
        "sequential": seq,
        "fixed": fixed,
        "seconds": time.time() - began,
    }
    RESULTS.write_text(json.dumps(results, indent=1, allow_nan=False))


if __name__ == "__main__":
    main()
