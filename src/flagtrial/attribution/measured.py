"""Measuring a design's arms on the server (attribution/factorial.py): each arm installed,
restarted into and run at the primary level, between two samples of foreign load; every run
in the ledger under the attribution's journal. And what the intervals then say of each edit.
"""

from __future__ import annotations

import dataclasses
import math

from flagtrial import stats
from flagtrial.attribution.factorial import Design, Factorial
from flagtrial.attribution.outcome import Found
from flagtrial.attribution.search import Culprits, Subset
from flagtrial.blocks import checked_run
from flagtrial.guardrails import METRICS
from flagtrial.hygiene import sample_target
from flagtrial.judge import metric_values
from flagtrial.launch.change import Change, Edit
from flagtrial.launch.spec import LaunchSpec
from flagtrial.load.summary import RunSummary
from flagtrial.plan import Journal
from flagtrial.records import TrialRow
from flagtrial.session import Session
from flagtrial.states import TrialState

# runs set aside for foreign load are run again, up to this many in one visit of an arm,
# before its replicate is given up (the next replicate starts afresh)
_RETRIES = 2


def label(subset: Subset) -> str:
    if not subset:
        return "known-good"
    return "edits " + ", ".join(str(i + 1) for i in sorted(subset))


class ArmRuns:
    """Runs of a design's arms: the known-good's spec with a subset of `edits`."""

    def __init__(
        self, s: Session, journal: Journal, spec: LaunchSpec, edits: list[Edit], runs: int
    ) -> None:
        self.s = s
        self.runs = runs  # runs after each restart: what makes the restart worth it
        self.journal = journal
        self.spec = spec
        self.edits = edits
        self.specs: dict[Subset, LaunchSpec] = {frozenset(): spec}
        self.level = s.project.policy.primary_concurrency or max(s.project.workload.concurrency)
        self.load_s = 0.0
        self.visits = 0  # arms started and measured

    async def _spec(self, subset: Subset) -> LaunchSpec:
        if subset not in self.specs:
            change = Change(edits=[self.edits[i] for i in sorted(subset)])
            self.specs[subset] = (await self.s.check_change(self.spec, change)).candidate
        return self.specs[subset]

    async def start(self, subset: Subset) -> None:
        """Install the arm and restart into it (ServerNotReadyError when it does not start)."""
        s, spec = self.s, await self._spec(subset)
        gen = s.ledger.record_generation(s.target.name, spec.text, note="attribution arm")
        self.journal.step(
            TrialState.INSTALLING, f"generation {gen.id}: {label(subset)}", candidate_gen=gen.id
        )
        await s.target.install_spec(spec)
        self.journal.step(TrialState.RESTARTING, label(subset))
        await s.restart_and_read()

    async def measure(self, subset: Subset, replicate: int, seed: int) -> float | None:
        """The mean log of the primary metric over `runs` clean runs on the arm started last;
        None when too many were disturbed (and the policy sets disturbed runs aside)."""
        s, policy = self.s, self.s.project.policy
        self.journal.step(TrialState.MEASURING, f"{label(subset)}, replicate {replicate + 1}")
        before = await sample_target(s.target)
        self.visits += 1
        logs: list[float] = []
        for attempt in range(self.runs + _RETRIES):
            run = await checked_run(
                s, self.level, before, warmup=attempt == 0, seed=seed * 10 + attempt,
                what=f"the attribution's run of {label(subset)}",
            )  # fmt: skip
            before, summary = run.after, run.result.summary
            self.load_s += summary.duration_s
            s.ledger.add_run(
                self.journal.trial_id, label(subset), self.level, replicate, summary.model_dump(),
                block=replicate, disturbed=run.why,
                foreign=dataclasses.asdict(run.load) if run.load else None,
            )  # fmt: skip
            value = metric_values(policy, summary, run.result.records).get(policy.primary_metric)
            s.notify(
                "run",
                f"{label(subset)} replicate {replicate + 1}: {summary.output_tok_s:.1f} tok/s"
                + (f"; {run.why}" if run.why else ""),
            )
            if value is not None and (run.why is None or not policy.set_aside_disturbed):
                logs.append(math.log(value))
            if len(logs) == self.runs:
                return sum(logs) / len(logs)
        return None


def reused_arms(s: Session, trial: TrialRow, design: Design) -> dict[Subset, float]:
    """The first replicate's known-good and whole change, taken from the last block of each
    arm the trial itself ran (interleaved: restart blocks as long as the design's visits):
    no restart or load spent on them. The design's whole change is the trial's candidate but
    for edits settled as doing nothing. Not for goodput, whose runs' records are not kept."""
    policy = s.project.policy
    kind = (trial.record.get("design") or {}).get("kind")
    if kind != "interleaved" or policy.primary_metric == "goodput":
        return {}
    level = policy.primary_concurrency or max(s.project.workload.concurrency)
    counted = [r for r in s.ledger.runs(trial.id) if r.concurrency == level
               and (r.disturbed is None or not policy.set_aside_disturbed)]  # fmt: skip
    reused: dict[Subset, float] = {}
    for arm, subset in (("baseline", frozenset[int]()), ("candidate", frozenset(design.edits))):
        runs = [r for r in counted if r.arm == arm]
        last = [r for r in runs if r.block == max(r.block for r in runs)] if runs else []
        values = [metric_values(policy, RunSummary.model_validate(r.summary), None) for r in last]
        logs = [math.log(v[policy.primary_metric]) for v in values if policy.primary_metric in v]
        if not logs:
            return {}
        reused[subset] = sum(logs) / len(logs)
    return reused


def _shown(interval: stats.Interval, metric: str, replicates: int) -> str:
    est, lo, hi = interval.pct
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"no interval yet for its main effect: {replicates} replicates of the design done"
    return (
        f"{METRICS[metric][0]} {est:+.1f} % [{lo:+.1f}, {hi:+.1f}] as this edit's main effect "
        f"over {replicates} replicates of the design"
    )


def read_design(found: Found, effect: str, factorial: Factorial, metric: str) -> str | None:
    """Each edit's finding from the design's intervals into `found`; why the design could not
    separate the edits (an interaction), if it could not."""
    design, n = factorial.design, factorial.replicates
    if (mixed := factorial.interaction()) is not None:
        est, lo, hi = mixed.pct
        why = (
            f"the edits act otherwise together than apart ({est:+.1f} % [{lo:+.1f}, {hi:+.1f}] "
            f"beyond their main effects, {n} replicates)"
        )
        for i in design.edits:
            found.notes.setdefault(i, []).append(why)
        if len(design.edits) == 2:  # the full factorial: the pair is the interaction
            found.culprits.setdefault(effect, Culprits()).together.append(frozenset(design.edits))
            return None
        found.unsettled.setdefault(effect, set()).update(design.edits)
        return f"{why}: this fraction cannot separate their main effects"
    for i, (interval, finding) in zip(design.edits, factorial.effects(), strict=True):
        said = _shown(interval, metric, n)
        if finding in ("harm", "gain"):
            way = f"measured:{finding}"
            found.culprits.setdefault(way, Culprits()).alone.add(i)
            found.said.setdefault(way, {})[i] = said
        elif finding == "equivalent":
            found.equivalent.add(i)
            found.notes.setdefault(i, []).append(said)
        else:
            found.unsettled.setdefault(effect, set()).add(i)
            found.notes.setdefault(i, []).append(said)
    return None
