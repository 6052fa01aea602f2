"""The noise an interleaved trial measured (the spread of its paired log differences, and
what a restart block cost), kept in its record for the next trial of the same workload on
the same target: before that trial's load starts, it says what its bound can resolve at
that noise (the minimal detectable effect), and whether "no effect" can be shown at all."""

from __future__ import annotations

import hashlib
import json
import math

from pydantic import BaseModel

from flagtrial import spending, stats
from flagtrial.designs import Interleaved
from flagtrial.designs.interleaved import horizon
from flagtrial.ledger import Ledger
from flagtrial.reasons import Code, Reason
from flagtrial.sequential import Sequential
from flagtrial.settings import Policy, Project

# Pairs below this give a spread too rough to plan by.
MIN_PAIRS = 3
# The normal quantile of the 80 % power the minimal detectable effect is stated at.
POWER_Z = 0.8416


class Noise(BaseModel):
    # the workload, primary metric and level it was measured at (not "key": the ledger
    # redacts values under names like that)
    workload: str
    pair_sd: float  # of the paired log differences
    pairs: int
    block_s: float  # wall seconds of one restart block, restart included
    runs_per_block: int


def workload_id(project: Project) -> str:
    policy = project.policy
    level = policy.primary_concurrency or max(project.workload.concurrency)
    what = {
        "workload": project.workload.model_dump(mode="json"),
        "metric": policy.primary_metric,
        "level": level,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def measured(seq: Sequential, project: Project) -> Noise | None:
    """What an interleaved trial's pairs showed, once there are enough to plan by."""
    design = seq.design
    if not isinstance(design, Interleaved):
        return None
    pairs = design.pairs(seq, seq.policy.primary_metric)
    if len(pairs) < MIN_PAIRS:
        return None
    mean = sum(pairs) / len(pairs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in pairs) / (len(pairs) - 1))
    return Noise(
        workload=workload_id(project),
        pair_sd=sd,
        pairs=len(pairs),
        block_s=seq.block_s(),
        runs_per_block=design.runs_per_block,
    )


def last_measured(ledger: Ledger, target: str, project: Project) -> tuple[int, Noise] | None:
    """The latest trial on `target` that measured the noise of this project's workload."""
    wanted = workload_id(project)
    for trial in reversed(ledger.trials(target)):
        found = trial.record.get("noise")
        if found and found.get("workload") == wanted:
            return trial.id, Noise.model_validate(found)
    return None


def bound_pairs(policy: Policy, noise: Noise) -> int:
    """About how many pairs a trial gets within its bounds at that block cost."""
    return horizon(policy, noise.runs_per_block, noise.block_s)


def resolvable(policy: Policy, noise: Noise, trial_id: int) -> Reason:
    """What a trial bounded by `policy` can resolve at `noise`, 4 times in 5: the smallest
    gain or harm whose interval clears its margin by the bound, and the widest true effect
    "no effect" is still shown for (none when the bound's interval is too wide for the
    equivalence margin)."""
    pairs = bound_pairs(policy, noise)
    values = {"trial": trial_id, "sd_pct": stats.to_pct(noise.pair_sd), "pairs": pairs,
              "block_s": noise.block_s}  # fmt: skip
    se = noise.pair_sd / math.sqrt(max(pairs, 1))
    # the interval at the trial's last planned look
    critical = spending.plan(pairs, 1.0 - policy.confidence).critical(pairs)
    half = math.inf if critical is None else critical * se
    if not math.isfinite(half):
        return Reason(code=Code.RESOLVES_NOTHING, values=values)
    margin = max(policy.harm_margin_pct, policy.improvement_margin_pct)
    # at this true effect, 4 times in 5 the estimate lands far enough out for the interval
    # to clear the margin
    mde = stats.to_pct(stats.to_log(margin) + half + POWER_Z * se)
    room = stats.to_log(policy.equivalence_margin_pct) - half - POWER_Z * se
    if room <= 0:
        return Reason(
            code=Code.RESOLVES_NO_EQUIVALENCE,
            values={**values, "mde": mde, "margin": policy.equivalence_margin_pct},
        )
    return Reason(code=Code.RESOLVES, values={**values, "mde": mde, "within": stats.to_pct(room)})
