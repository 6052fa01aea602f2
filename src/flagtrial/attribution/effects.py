"""The effects of a trial to attribute to its edits, as names a search can carry, and which
of them a subset's own start shows: capacity moved past the engine's tolerance, a setting the
server changed on its own, a start that failed, the primary metric's measured finding."""

from __future__ import annotations

from typing import Literal

from flagtrial.facts import FactsDiff
from flagtrial.reasons import Code
from flagtrial.records import TrialRow

FAILS_TO_START = "start:fails"
Direction = Literal["harm", "gain", "label"]


def fact_effects(diff: FactsDiff, tolerance_pct: float) -> set[str]:
    """What a start's facts showed against the known-good: each capacity fact that moved
    past the tolerance (with its direction) and each setting the server changed unasked."""
    moved = {
        f"capacity:{c.name}:{'loss' if c.pct < 0 else 'gain'}"
        for c in diff.capacity
        if abs(c.pct) > tolerance_pct
    }
    return moved | {f"setting:{s.name}" for s in diff.implicit}


def trial_effects(trial: TrialRow, tolerance_pct: float) -> tuple[set[str], str | None]:
    """(the fact effects of the trial's candidate, its measured effect): the effects an
    attribution searches the edits for."""
    facts: set[str] = set()
    if (diff := trial.diff) is not None:
        facts = fact_effects(diff, tolerance_pct)
    if any(r.code == Code.CANDIDATE_NOT_READY for r in trial.reasons):
        facts.add(FAILS_TO_START)
    finding = (trial.record.get("verdict") or {}).get("finding")
    measured = f"measured:{finding}" if finding in ("harm", "gain") else None
    return facts, measured


def direction(effect: str) -> Direction:
    """Whether an effect costs (capacity lost, a failed start, measured harm), helps, or only
    marks a change (a setting the server moved on its own)."""
    if effect == FAILS_TO_START or effect.endswith((":loss", ":harm")):
        return "harm"
    if effect.endswith(":gain"):
        return "gain"
    return "label"


def describe(effect: str) -> str:
    if effect == FAILS_TO_START:
        return "the server does not start"
    kind, _, rest = effect.partition(":")
    if kind == "capacity":
        name, _, way = rest.rpartition(":")
        return f"capacity {name.replace('_', ' ')} {way}"
    if kind == "setting":
        return f"the server changes {rest} on its own"
    return f"measured {rest}"
