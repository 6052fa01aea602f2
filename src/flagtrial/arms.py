"""Switching a trial's server between the known-good and the candidate: install, restart,
check the facts each restart reads; the gates before the first restart, and the engine's
predicted settings against what the candidate reports."""

from __future__ import annotations

from flagtrial.blocks import ServerDiedError
from flagtrial.errors import FlagtrialError, GateError, ServerNotReadyError
from flagtrial.facts import Facts, FactsDiff, diff_facts
from flagtrial.gates import preflight as gating
from flagtrial.guardrails import CAPACITY
from flagtrial.judge import Verdict
from flagtrial.plan import ARM_NAMES, Plan
from flagtrial.preflight import GateReport
from flagtrial.reasons import Code, Reason
from flagtrial.sequential import Arm, Sequential
from flagtrial.session import Session, restore_detail, verify_facts
from flagtrial.states import TrialState


class Arms:
    """Switching the server between the known-good and the candidate: install, restart,
    check the facts each restart reads."""

    def __init__(self, s: Session, plan: Plan, *, force: bool) -> None:
        self.s = s
        self.plan = plan
        # deploy even when the engine's source says the change fails at startup here
        self.force = force
        self.installed: Arm = "baseline"
        # True from the first install of the candidate: from then on any failure restores.
        self.touched = False
        self.gates: GateReport | None = None  # read before the first restart
        self.gate_reasons: list[Reason] = []
        self.notes: list[Reason] = []  # added to the verdict's reasons
        self.baseline_facts: Facts | None = plan.facts_before  # at its last restart
        self.facts_after: Facts | None = None
        self.diff: FactsDiff | None = None

    async def enter(self, arm: Arm, seq: Sequential) -> Verdict | None:
        """Install `arm` if it is not installed, restart into it and check its facts. Returns
        a verdict when the trial must end here (the candidate did not start, or broke a
        guardrail with capacity_guard = "revert", or the known-good came back different)."""
        s, plan = self.s, self.plan
        if self.installed != arm:
            gen = plan.generation(arm)
            plan.journal.step(TrialState.INSTALLING, f"generation {gen.id} ({ARM_NAMES[arm]})")
            self.touched = True  # before the install: a kill inside it must restore
            await s.target.install_spec(plan.specs[arm])
            self.installed = arm
        plan.journal.step(TrialState.RESTARTING, ARM_NAMES[arm])
        try:
            facts = await s.restart_and_read()
        except ServerNotReadyError as e:
            if arm == "baseline":
                raise
            return Verdict.revert(Reason(code=Code.CANDIDATE_NOT_READY, values={"error": str(e)}))
        if arm == "baseline":
            return self._baseline_restarted(facts)
        if self.facts_after is not None:
            mismatches = verify_facts(self.facts_after, facts, s.engine.capacity_tolerance_pct)
            if mismatches:
                changed = {"mismatches": "; ".join(mismatches)}
                self.notes.append(Reason(code=Code.CANDIDATE_FACTS_CHANGED, values=changed))
            return None
        return self._candidate_first_read(facts, seq)

    def _baseline_restarted(self, facts: Facts) -> Verdict | None:
        """The known-good must come back with the facts it was found with, or the comparison
        is void."""
        tolerance = self.s.engine.capacity_tolerance_pct
        mismatches = verify_facts(self.plan.facts_before, facts, tolerance)
        self.baseline_facts = facts if not mismatches else None
        if mismatches:
            void = {"mismatches": "; ".join(mismatches)}
            return Verdict.revert(Reason(code=Code.BASELINE_FACTS_CHANGED, values=void))
        return None

    def _candidate_first_read(self, facts: Facts, seq: Sequential) -> Verdict | None:
        """The candidate's facts after its first restart: the diff, the engine's prediction
        held against them, the capacity guardrail."""
        s, plan = self.s, self.plan
        self.facts_after = facts
        self.diff = diff_facts(plan.facts_before, facts, plan.named)
        self._check_prediction(facts)
        plan.journal.step(
            TrialState.FACTS,
            "; ".join(c.describe() for c in self.diff.capacity),
            record_json={"facts_after": facts.model_dump(), "diff": self.diff.model_dump()},
        )
        breach = CAPACITY.breach(s.project.policy, self.diff)
        if breach and s.project.policy.capacity_guard == "revert":
            return Verdict.revert(breach, Reason(code=Code.CAPACITY_GUARD_REVERT))
        if breach:
            seq.breached("capacity guardrail")
        return None

    def _check_prediction(self, facts: Facts) -> None:
        """The candidate's settings as the engine's own resolution predicted them, against
        what its server reports: a note for the verdict, and the journal's record."""
        prediction = self.gates.prediction if self.gates is not None else None
        checked = prediction.check(facts) if prediction is not None else None
        if checked is None:
            return
        self.plan.journal.context["prediction"] = checked.model_dump()
        if (reason := checked.reason()) is not None:
            self.notes.append(reason)

    async def keep_candidate(self, facts_after: Facts) -> list[str]:
        """Install the candidate again to keep it (the measurement ended on the known-good),
        restart it and compare its facts with those it was judged on: the mismatches."""
        s, plan = self.s, self.plan
        plan.journal.step(TrialState.INSTALLING, f"generation {plan.candidate_gen.id}, to keep it")
        await s.target.install_spec(plan.specs["candidate"])
        self.installed = "candidate"
        plan.journal.step(TrialState.RESTARTING, "candidate, to keep it")
        facts = await s.restart_and_read()
        return verify_facts(facts_after, facts, s.engine.capacity_tolerance_pct)

    async def restart_known_good(self, died: ServerDiedError) -> ServerDiedError:
        """The known-good died while measured as found (nothing of the candidate installed):
        start it again, so the trial never leaves the server down, and say how it came back."""
        self.plan.journal.step(TrialState.RESTARTING, f"known-good, after it died: {died}")
        try:
            restore = await self.s.restore(self.plan.good)
        except FlagtrialError as e:
            return ServerDiedError(f"{died}; restarting the known-good failed too: {e}")
        return ServerDiedError(f"{died}; restarted: {restore_detail(restore)}")

    async def check_gates(self) -> None:
        """The gates, awaited before the first run (the engine's resolution is a busy child
        process: beside a run it would disturb it) and before any restart (a change that fails
        at startup must not cost the known-good one): journaled, and a change they say fails
        at startup refused unless forced."""
        self.gates = report = await self.plan.gate_task
        journal = self.plan.journal
        prediction = report.prediction
        if prediction is not None:
            journal.context["resolution"] = {
                "facts": prediction.candidate.facts,
                "known_good": prediction.known_good.describe(),
                "candidate": prediction.candidate.describe(),
                "model": prediction.model.describe() if prediction.model else None,
                "implicit": [c.model_dump() for c in prediction.diff.implicit]
                if prediction.diff
                else None,
            }
        refusal = report.refusal()
        if report.findings or refusal:
            findings = report.findings
            journal.context["gates"] = [f.model_dump(mode="json") for f in findings]
            self.gate_reasons = gating.reasons(findings)
            said = [f"{f.flag}: {f.outcome.value}" for f in findings]
            if prediction is not None and prediction.refused:
                said.append(f"engine's own resolution: {prediction.candidate.describe()}")
            journal.step(TrialState.GATES, "; ".join(said), record_json={})
        if refusal and not self.force:
            raise GateError(f"{refusal} (see `flagtrial preflight`; --force deploys anyway)")
