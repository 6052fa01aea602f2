"""Measurement designs, one file each behind the Design protocol (base.py), and the choice
between them by what a restart costs against a run (choose_design)."""

from __future__ import annotations

import dataclasses
import math

from flagtrial.designs.base import Arm, Block, Design, DesignKind, Phase, Run
from flagtrial.designs.before_after import BeforeAfter
from flagtrial.designs.interleaved import Interleaved
from flagtrial.settings import Policy

__all__ = [
    "Arm",
    "BeforeAfter",
    "Block",
    "Design",
    "DesignKind",
    "Interleaved",
    "Phase",
    "Run",
    "choose_design",
    "runs_per_restart",
]

# Longest restart block worth interleaving: beyond it, blocks are too few for pairs to help.
MAX_RUNS_PER_BLOCK = 4


def runs_per_restart(policy: Policy, restart_s: float | None, run_s: float) -> int:
    """The fewest runs after a restart for the restart (and its warm-up) to cost at most
    `restart_overhead_max` of them: restart / (restart + k run) <= restart_overhead_max. An
    unknown restart cost counts as more than MAX_RUNS_PER_BLOCK runs."""
    if restart_s is None:
        return MAX_RUNS_PER_BLOCK + 1
    o = policy.restart_overhead_max
    return max(1, math.ceil(restart_s * (1 - o) / (o * max(run_s, 1e-9))))


def choose_design(policy: Policy, restart_s: float | None, run_s: float) -> Design:
    """Interleave when a restart (and its warm-up) costs at most `restart_overhead_max` of a
    block of at most MAX_RUNS_PER_BLOCK runs; otherwise before-after. An unknown restart
    cost counts as expensive."""
    k = runs_per_restart(policy, restart_s, run_s)
    if restart_s is None:
        cost = f"restart time unknown, run {run_s:.1f}s"
    else:
        cost = f"restart {restart_s:.1f}s, run {run_s:.1f}s"
    if policy.protocol == "before-after" or (policy.protocol == "auto" and k > MAX_RUNS_PER_BLOCK):
        return BeforeAfter(policy.runs, f"before-after ({cost})")
    k = min(k, MAX_RUNS_PER_BLOCK)
    # the first block's runs (a warm-up included) and a restart: what each block will cost
    block_s = None if restart_s is None else restart_s + k * run_s
    design = Interleaved(k, f"interleaved blocks of {k} run(s) ({cost})", block_s)
    at = ", ".join(str(n) for n in design.looks(policy).at)
    return dataclasses.replace(design, why=f"{design.why}; looks after {at} pairs")
