"""Simulated trials with a known true effect: the real decision procedure on synthetic runs.

A run's output tok/s is exp(log level + effect (candidate only) + wander + white noise
+ drift + warm-up + restart level + outlier + foreign burst):

- wander: an Ornstein-Uhlenbeck process in wall time, sampled at each run's middle, whose
  correlation over one run's duration is `phi`; it carries `ar_share` of the variance;
- drift: a straight line of `drift_pct_per_30min` in a random direction per trial;
- warm-up: the first run after a restart is `warmup_pct` slower, the second a third of that;
- outliers: a run is `outlier_pct` slower with probability `outlier_p`, unseen by hygiene;
- bursts: foreign load arrives as a Poisson process (`burst_per_min`, `burst_s` long) and
  slows the runs it overlaps by `burst_pct`; hygiene sees a burst with probability
  `burst_seen` and then marks the run disturbed.

The sequential procedure is flagtrial.sequential.Sequential itself, driven run by run; the
fixed-length protocol is one run of N requests per arm, baseline then candidate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student_t

from flagtrial import stats
from flagtrial.designs import Design
from flagtrial.facts import Facts, diff_facts
from flagtrial.guardrails import PRIMARY
from flagtrial.load.summary import RunSummary
from flagtrial.sequential import Continue, Sequential
from flagtrial.settings import Policy

REQUESTS_PER_RUN = 16
_FACTS = Facts(engine="simulated", capacity={}, settings={})
NO_DIFF = diff_facts(_FACTS, _FACTS, set())


@dataclass(frozen=True)
class Noise:
    name: str
    cv: float = 0.03  # stationary log SD of a run of REQUESTS_PER_RUN requests
    phi: float = 0.8  # wander correlation over one run
    ar_share: float = 0.75  # share of variance in the wander: lag-1 corr = phi * share
    drift_pct_per_30min: float = 0.0
    warmup_pct: float = 0.0
    restart_sd: float = 0.0
    outlier_p: float = 0.0
    outlier_pct: float = 30.0
    burst_per_min: float = 0.0
    burst_s: float = 20.0
    burst_pct: float = 40.0
    burst_seen: float = 0.9
    run_s: float = 5.0  # one run of REQUESTS_PER_RUN requests
    warmup_s: float = 1.5  # the warm-up requests after a restart
    restart_s: float = 0.4


class Machine:
    """One simulated server over one trial: a clock and the noise processes."""

    def __init__(self, noise: Noise, rng: np.random.Generator) -> None:
        self.n = noise
        self.rng = rng
        self.t = 0.0
        self.ou = rng.normal(0.0, noise.cv * math.sqrt(noise.ar_share))
        self.ou_t = 0.0
        # the wander's time constant, so that its correlation over one run is phi
        self.tau = -noise.run_s / math.log(noise.phi) if 0 < noise.phi < 1 else 0.0
        sign = rng.choice([-1.0, 1.0])
        self.slope = sign * math.log1p(noise.drift_pct_per_30min / 100) / 1800
        self.level = 0.0
        self.since_restart = 99  # the server found running is warm
        horizon = 4 * 3600
        count = rng.poisson(noise.burst_per_min * horizon / 60)
        self.bursts = np.sort(rng.uniform(0, horizon, count))

    def restart(self) -> None:
        self.t += self.n.restart_s
        self.level = self.rng.normal(0.0, self.n.restart_sd) if self.n.restart_sd else 0.0
        self.since_restart = 0

    def _wander(self, at: float) -> float:
        if self.tau <= 0:
            return 0.0
        decay = math.exp(-(at - self.ou_t) / self.tau)
        sd = self.n.cv * math.sqrt(self.n.ar_share * (1 - decay**2))
        self.ou = self.ou * decay + self.rng.normal(0.0, sd)
        self.ou_t = at
        return self.ou

    def run(self, effect: float, n_requests: int, warmup: bool) -> tuple[float, float, bool]:
        """One run: (log tok/s relative to the true level, seconds, seen as disturbed)."""
        n = self.n
        if warmup:
            self.t += n.warmup_s
        windows = n_requests / REQUESTS_PER_RUN
        duration = n.run_s * windows
        start, mid = self.t, self.t + duration / 2
        # A long run averages the wander and white noise over its windows.
        k = max(1, round(windows))
        wander = float(np.mean([self._wander(start + (i + 0.5) * n.run_s) for i in range(k)]))
        white = self.rng.normal(0.0, n.cv * math.sqrt(1 - n.ar_share) / math.sqrt(k))
        x = effect + wander + white + self.slope * mid + self.level
        warm = n.warmup_pct / 100 * (1.0 if self.since_restart == 0 else 1 / 3)
        if self.since_restart < 2 and warm:
            x += math.log1p(-warm / windows)
        if n.outlier_p and self.rng.random() < n.outlier_p:
            x += math.log1p(-n.outlier_pct / 100)
        seen = False
        if len(self.bursts):
            end = start + duration
            hit = self.bursts[(self.bursts < end) & (self.bursts + n.burst_s > start)]
            if len(hit):
                overlap = sum(min(end, b + n.burst_s) - max(start, b) for b in hit) / duration
                x += math.log1p(-n.burst_pct / 100 * min(overlap, 1.0))
                seen = bool(self.rng.random() < n.burst_seen)
        self.t += duration
        self.since_restart += 1
        return x, duration + (n.warmup_s if warmup else 0.0), seen


def summary(log_tok_s: float, seconds: float, level: float = 100.0) -> RunSummary:
    tok_s = level * math.exp(log_tok_s)
    return RunSummary.model_construct(
        concurrency=8,
        n_requests=REQUESTS_PER_RUN,
        n_ok=REQUESTS_PER_RUN,
        n_errors=0,
        error_rate=0.0,
        duration_s=seconds,
        output_tokens=int(tok_s * seconds),
        output_tok_s=tok_s,
        request_rate=REQUESTS_PER_RUN / seconds,
        ttft_p50=None,
        ttft_p90=None,
        ttft_p99=None,
        itl_p50=None,
        itl_p90=None,
        itl_p99=None,
        e2e_p50=None,
        errors={},
        n_short=0,
    )


@dataclass(frozen=True)
class Outcome:
    decision: str  # KEEP, REVERT, INCONCLUSIVE
    finding: str  # gain, harm, equivalent, unresolved
    load_s: float  # seconds of load on the server, warm-ups included
    wall_s: float  # restarts included
    runs: int


def sequential_trial(
    policy: Policy, design: Design, noise: Noise, effect_pct: float, rng: np.random.Generator
) -> Outcome:
    m = Machine(noise, rng)
    seq = Sequential(policy, [8], design=design)
    effect = math.log1p(effect_pct / 100)
    load = 0.0
    runs = 0
    while isinstance(step := seq.decision(), Continue):
        began = m.t
        if step.restart:
            m.restart()
        x, seconds, seen = m.run(effect if step.arm == "candidate" else 0.0, 16, step.warmup)
        load += seconds
        runs += 1
        seq.observe(
            step.arm,
            8,
            summary(x, noise.run_s),
            disturbed="foreign burst" if seen else None,
            elapsed_s=m.t - began,
        )
    verdict = step.verdict(policy, NO_DIFF)
    return Outcome(verdict.decision, verdict.finding or "unresolved", load, m.t, runs)


def fixed_trial(
    noise: Noise, effect_pct: float, n_requests: int, rng: np.random.Generator
) -> tuple[float, list[float], list[float], float]:
    """One run of n_requests per arm, baseline then candidate (restart between): the point
    estimate, the per-window log values of each arm (for a Welch interval), and load seconds."""
    m = Machine(noise, rng)
    effect = math.log1p(effect_pct / 100)
    windows = max(1, n_requests // REQUESTS_PER_RUN)
    arms: list[list[float]] = []
    load = 0.0
    for arm_effect, restart in ((0.0, False), (effect, True)):
        if restart:
            m.restart()
        values = []
        for i in range(windows):
            x, seconds, _ = m.run(arm_effect, REQUESTS_PER_RUN, warmup=i == 0)
            values.append(x)
            load += seconds
        arms.append(values)
    est = float(np.mean(arms[1]) - np.mean(arms[0]))
    return est, arms[0], arms[1], load


def welch_interval(a: Sequence[float], b: Sequence[float], confidence: float) -> stats.Interval:
    """Log ratio mean(b) / mean(a) of independent log values, Welch t interval: the fixed-n
    designs' comparator (flagtrial itself never uses an unpaired interval)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    diff = float(y.mean() - x.mean())
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return stats.Interval(diff, diff, diff, min(len(x), len(y)))
    df = (va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1))
    half = float(student_t.ppf(0.5 + confidence / 2, df)) * se
    return stats.Interval(diff, diff - half, diff + half, min(len(x), len(y)))


def fixed_decision(
    est: float, policy: Policy, lo: float | None = None, hi: float | None = None
) -> str:
    """The fixed protocol's verdict: from the point estimate (bench_serving practice) or from
    an interval when given (flagtrial's earlier Welch judge)."""
    lo_pct = stats.to_pct(est if lo is None else lo)
    hi_pct = stats.to_pct(est if hi is None else hi)
    found = PRIMARY.classify(policy, lo_pct, hi_pct)
    return {"gain": "KEEP", "harm": "REVERT"}.get(found, "INCONCLUSIVE")
