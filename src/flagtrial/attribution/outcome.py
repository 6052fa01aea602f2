"""Per edit, what the attribution found, with its evidence: harmful, useless, beneficial,
interacting, or unresolved (the search stopped at its bound first); and the change made of
the edits worth keeping. Pure: the driver (attribution/attribute.py) gathers the evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

from flagtrial.attribution.effects import describe, direction
from flagtrial.attribution.search import Culprits
from flagtrial.launch.change import Change, Edit

EditOutcome = Literal["harmful", "useless", "beneficial", "interacting", "unresolved"]
_KEPT: frozenset[EditOutcome] = frozenset({"useless", "beneficial", "unresolved"})


class EditVerdict(BaseModel):
    index: int
    edit: Edit
    outcome: EditOutcome
    evidence: list[str]

    def shown(self) -> str:
        value = f" {self.edit.value}" if self.edit.value is not None else ""
        return f"{self.edit.op} {self.edit.name}{value}"


class Cost(BaseModel):
    restarts: int
    load_s: float


class Attribution(BaseModel):
    trial_id: int
    edits: list[EditVerdict]
    used: Cost
    one_at_a_time: Cost  # the same questions asked of each edit alone
    journals: list[int]  # the trials that journaled its restarts
    stopped: str | None  # why a search stopped before its end
    resolutions: int = 0  # the engine's own resolutions run, no restart each

    def fixed(self) -> Change | None:
        """The change without its harmful and interacting edits, to try (None when none is
        left, or all are: the trial's own change)."""
        kept = [v.edit for v in self.edits if v.outcome in _KEPT]
        return Change(edits=kept) if kept and len(kept) < len(self.edits) else None


@dataclass
class Found:
    """What the searches left: per effect its culprits and the edits still unsettled;
    `said[effect][i]`, where the number behind it came from for edit i."""

    culprits: dict[str, Culprits] = field(default_factory=dict)
    unsettled: dict[str, set[int]] = field(default_factory=dict)
    said: dict[str, dict[int, str]] = field(default_factory=dict)
    # what else was measured of edit i alone (a probe that showed none of the effects)
    notes: dict[int, list[str]] = field(default_factory=dict)
    # edits measured to do nothing within the margin (the trial's own interval, or a probe)
    equivalent: set[int] = field(default_factory=set)


def judge(
    edits: list[Edit], settled: dict[int, tuple[EditOutcome, str]], found: Found
) -> list[EditVerdict]:
    """Each edit's outcome: settled without a restart, else from the effects it carries."""
    return [
        EditVerdict(index=i, edit=e, outcome=settled[i][0], evidence=[settled[i][1]])
        if i in settled
        else _judged(i, e, found)
        for i, e in enumerate(edits)
    ]


def _judged(i: int, edit: Edit, found: Found) -> EditVerdict:
    alone = {e: found.said.get(e, {}).get(i, describe(e)) for e, c in found.culprits.items()
             if i in c.alone}  # fmt: skip
    together = [
        (e, sorted(o + 1 for o in group - {i}))
        for e, c in found.culprits.items()
        for group in c.together
        if i in group
    ]
    unsettled = [e for e, members in found.unsettled.items() if i in members]
    by_way = {way: [said for e, said in alone.items() if direction(e) == way]
              for way in ("harm", "gain", "label")}  # fmt: skip
    evidence = [*by_way["harm"], *by_way["gain"], *by_way["label"]]
    evidence += [f"{describe(e)} only together with edit(s) {', '.join(map(str, others))}"
                 for e, others in together]  # fmt: skip
    evidence += [f"{describe(e)}: not settled for this edit" for e in unsettled]
    evidence += found.notes.get(i, [])
    outcome: EditOutcome
    if by_way["harm"]:
        outcome = "harmful"
    elif together:
        outcome = "interacting"
    elif unsettled:
        outcome = "unresolved"
    elif by_way["gain"]:
        outcome = "beneficial"
    elif i in found.equivalent:
        outcome = "useless"
        evidence.append("none of the change's effects follows it; no measured effect")
    else:
        outcome = "unresolved"
        evidence.append("none of the change's effects follows it; its own speed not measured")
    return EditVerdict(index=i, edit=edit, outcome=outcome, evidence=evidence)
