"""What the ledger hands back, typed: generations, trials, their journal events and runs.

A trial's record and a run's summary stay the JSON their writer stored (older rows hold
older shapes, and `show --json` prints them as stored); the parts a reader acts on are read
through typed properties."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from flagtrial.facts import Facts, FactsDiff
from flagtrial.reasons import Reason
from flagtrial.states import TrialState

if TYPE_CHECKING:
    from flagtrial.judge import Effect


class Generation(BaseModel):
    id: int
    target: str
    spec_text: str
    spec_sha256: str
    created_at: float
    known_good: bool
    facts: dict[str, Any] | None
    note: str


class TrialRow(BaseModel):
    id: int
    target: str
    change: dict[str, Any]
    baseline_gen: int
    candidate_gen: int | None
    state: TrialState
    verdict: Literal["KEEP", "REVERT", "INCONCLUSIVE"] | None
    reasons: list[Reason]
    record: dict[str, Any]
    started_at: float
    finished_at: float | None

    @property
    def facts_after(self) -> Facts | None:
        """The candidate's facts as its first restart read them."""
        facts = self.record.get("facts_after")
        return Facts.model_validate(facts) if facts else None

    @property
    def diff(self) -> FactsDiff | None:
        diff = self.record.get("diff")
        return FactsDiff.model_validate(diff) if diff else None

    @property
    def effects(self) -> list[Effect]:
        from flagtrial.judge import Effect  # the statistics: only for a reader of effects

        verdict = self.record.get("verdict") or {}
        return [Effect.model_validate(e) for e in verdict.get("effects", [])]


class Event(BaseModel):
    at: float
    state: TrialState
    detail: str


class RunRow(BaseModel):
    # a trial's "baseline" or "candidate"; an attribution's measured design names its arms
    # by their edits ("known-good", "edits 1, 3")
    arm: str
    concurrency: int
    run_index: int
    block: int
    summary: dict[str, Any]  # a RunSummary as its version stored it
    disturbed: str | None  # why it was set aside
    foreign: dict[str, Any] | None  # the foreign load measured around it
