"""Fit the simulator's noise model to the runs measure_noise.py recorded on this machine.

Reads noise_runs.json, writes noise_fit.json: what was measured (CV, lag-1 and lag-2
autocorrelation, restart ICC, warm-up, drift, the foreign load and its effect) and the
`Noise` parameters of the "measured here" model that run_sim.py adds to its grid.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def _acf(blocks: list[np.ndarray], lag: int) -> float:
    """Autocorrelation at `lag` of consecutive runs, pooled over restart blocks."""
    allv = np.concatenate(blocks)
    mu = allv.mean()
    num = sum(float((b[lag:] - mu) @ (b[:-lag] - mu)) for b in blocks if len(b) > lag)
    cnt = sum(len(b) - lag for b in blocks if len(b) > lag)
    return (num / cnt) / float(allv.var()) if cnt else 0.0


def _across(blocks: list[np.ndarray]) -> float:
    """Correlation of the last run of a block with the first of the next (a restart between)."""
    a = np.array([b[-1] for b in blocks[:-1]])
    b = np.array([b[0] for b in blocks[1:]])
    return float(np.corrcoef(a, b)[0, 1])


def _icc(blocks: list[np.ndarray]) -> float:
    """One-way ANOVA intraclass correlation of runs within restart blocks."""
    k = np.mean([len(b) for b in blocks])
    grand = np.concatenate(blocks).mean()
    msb = sum(len(b) * (b.mean() - grand) ** 2 for b in blocks) / (len(blocks) - 1)
    msw = sum(((b - b.mean()) ** 2).sum() for b in blocks) / sum(len(b) - 1 for b in blocks)
    return float(max((msb - msw) / (msb + (k - 1) * msw), 0.0))


def fit(data: dict) -> dict:
    runs = [r for r in data["runs"] if r["busy"] == 0]
    ids = sorted({r["block"] for r in runs})
    by_block = {b: [r for r in runs if r["block"] == b] for b in ids}
    t0 = runs[0]["t"]
    out: dict = {
        "runs": len(runs),
        "blocks": len(ids),
        "minutes": (runs[-1]["t"] - t0) / 60,
        "run_s_median": float(np.median([r["duration_s"] for r in runs])),
        "restart_s_median": float(np.median(data["restarts_s"])) if data["restarts_s"] else None,
        "foreign_cores_median": float(np.median([r["foreign_cores"] for r in runs])),
        "disturbed_share_at_0.5_cores": float(np.mean([bool(r["disturbed"]) for r in runs])),
    }
    for metric in ("output_tok_s", "ttft_p99"):
        logs = {b: np.log([r[metric] for r in rs]) for b, rs in by_block.items()}
        # warm-up: the first measured run after a restart against the rest of its block
        warm = [v[0] - v[1:].mean() for v in logs.values() if len(v) > 2]
        settled = [v[1:] for v in logs.values() if len(v) > 2]
        allv = np.concatenate(list(logs.values()))
        t = np.array([(r["t"] - t0) / 1800 for r in runs])
        slope = float(np.polyfit(t, allv, 1)[0])
        out[metric] = {
            "geomean": float(math.exp(allv.mean())),
            "cv": float(allv.std(ddof=1)),
            "lag1": _acf(settled, 1),
            "lag2": _acf(settled, 2),
            # The ICC of blocks a minute long also holds the machine's slow wander; what a
            # restart itself adds shows as a drop of the correlation across a restart.
            "restart_icc": _icc(settled),
            "lag1_across_restart": _across(list(logs.values())),
            "warmup_pct": float((1 - math.exp(np.mean(warm))) * 100),
            "drift_pct_per_30min": float((math.exp(slope) - 1) * 100),
        }
    tok = np.log([r["output_tok_s"] for r in runs])
    foreign = np.array([r["foreign_cores"] for r in runs])
    b, a = np.polyfit(foreign, tok, 1)
    resid = tok - (a + b * foreign)
    out["foreign_effect_pct_per_core"] = float((math.exp(b) - 1) * 100)
    out["cv_after_foreign"] = float(resid.std(ddof=2))
    # What the paired design sees: the spread of differences of back-to-back runs.
    out["successive_diff_sd"] = float(np.diff(tok).std(ddof=1))
    quiet = float(np.mean(tok[-6:]))
    for busy in (1, 2):
        extra = [r for r in data["runs"] if r["busy"] == busy]
        if extra:
            v = np.log([r["output_tok_s"] for r in extra])
            out[f"busy{busy}_pct"] = float((math.exp(v.mean() - quiet) - 1) * 100)
            out[f"busy{busy}_foreign_cores"] = float(np.mean([r["foreign_cores"] for r in extra]))
    m = out["output_tok_s"]
    phi = min(max(m["lag2"] / m["lag1"], 0.3), 0.95) if m["lag1"] > 0.05 else 0.5
    share = min(max(m["lag1"], 0.0) / phi, 1.0)
    restart_var = max(m["lag1"] - m["lag1_across_restart"], 0.0) * m["cv"] ** 2
    noise = {
        "name": f"measured here (CV {m['cv'] * 100:.1f} %, lag-1 {m['lag1']:.2f})",
        "cv": m["cv"],
        "phi": phi,
        "ar_share": share,
        "drift_pct_per_30min": abs(m["drift_pct_per_30min"]),
        "warmup_pct": m["warmup_pct"],
        "restart_sd": math.sqrt(restart_var),
        "run_s": out["run_s_median"],
        "restart_s": out["restart_s_median"] or 0.4,
        # two warm-up requests at c=8 run side by side: about a third of a 2-wave run
        "warmup_s": out["run_s_median"] * 0.3,
    }
    return {"measured": out, "noise": noise}


def main() -> None:
    data = json.loads((HERE / "noise_runs.json").read_text())
    result = fit(data)
    (HERE / "noise_fit.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
