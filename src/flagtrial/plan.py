"""A trial's plan: what is fixed before its first run (the known-good as found, the
candidate, the gates started) and the journal it writes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from flagtrial import preflight
from flagtrial.facts import Facts
from flagtrial.faults import checkpoint
from flagtrial.launch.change import Change
from flagtrial.launch.spec import LaunchSpec
from flagtrial.records import Generation
from flagtrial.sequential import Arm
from flagtrial.session import Session
from flagtrial.states import TrialState

ARM_NAMES: dict[Arm, str] = {"baseline": "known-good", "candidate": "candidate"}


class Journal:
    """One trial's journal: each step written before it is acted on (write-ahead), then
    announced; `context` goes into every record the trial writes."""

    def __init__(self, session: Session, trial_id: int, context: dict[str, Any]) -> None:
        self.s = session
        self.trial_id = trial_id
        # the host the trial ran on and what preflight said; the design and the source
        # gates' findings once known
        self.context = context

    def step(self, state: TrialState, detail: str = "", **fields: Any) -> None:
        if "record_json" in fields:
            fields["record_json"] = {**self.context, **fields["record_json"]}
        self.s.ledger.step(self.trial_id, state, detail, **fields)
        self.s.notify(state, detail)
        checkpoint(state)


@dataclass
class Plan:
    """What is fixed before the first run: the known-good as found, the candidate, and the
    journal the trial writes."""

    good: Generation
    candidate_gen: Generation
    specs: dict[Arm, LaunchSpec]
    facts_before: Facts  # the known-good's, as the trial found it
    named: set[str]  # resolved settings the change names
    gate_task: asyncio.Task[preflight.GateReport]
    journal: Journal

    def generation(self, arm: Arm) -> Generation:
        return self.good if arm == "baseline" else self.candidate_gen


async def plan(s: Session, change: Change) -> Plan:
    """Check the change, record the candidate and open the trial's journal; the gates (the
    source analysis and the engine's own resolution) start, for the trial to await before its
    first run."""
    good, spec, facts_before = await s.known_good()
    checked = await s.check_change(spec, change)
    candidate_gen = s.ledger.record_generation(
        s.target.name, checked.candidate.text, note="candidate"
    )
    host = await s.target.host_facts()
    gate_task = asyncio.create_task(
        preflight.gates(s, facts_before.version, change, spec, checked, host)
    )
    trial_id = s.ledger.start_trial(s.target.name, change.model_dump(), good.id)
    journal = Journal(s, trial_id, {"host": host.model_dump(), "preflight_notes": checked.notes})
    journal.step(
        TrialState.PREFLIGHTED,
        "; ".join([f"candidate is generation {candidate_gen.id}", *checked.notes]),
        candidate_gen=candidate_gen.id,
        record_json={},
    )
    return Plan(
        good=good,
        candidate_gen=candidate_gen,
        specs={"baseline": spec, "candidate": checked.candidate},
        facts_before=facts_before,
        named=checked.named_settings,
        gate_task=gate_task,
        journal=journal,
    )
