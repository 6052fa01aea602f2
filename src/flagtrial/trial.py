"""The trial: one change tried on one target, journaled step by step in the ledger.

planned -> measuring-baseline -> installing -> restarting -> waiting -> facts -> measuring
-> judged -> kept | reverting -> reverted. Any failure after the install goes to reverting.
Its parts: plan.py (Plan, Journal), arms.py (Arms), blocks.py (Blocks).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from pydantic import BaseModel

from flagtrial import noise
from flagtrial.arms import Arms
from flagtrial.blocks import Blocks, ServerDiedError
from flagtrial.designs import Interleaved
from flagtrial.facts import Facts, FactsDiff, diff_facts
from flagtrial.judge import Verdict
from flagtrial.launch.change import Change
from flagtrial.plan import Plan, plan
from flagtrial.reasons import Code, Reason
from flagtrial.sequential import Continue, Sequential
from flagtrial.session import Restore, Session, restore_detail
from flagtrial.states import TrialState


class TrialOutcome(BaseModel):
    trial_id: int
    verdict: Verdict
    outcome: str  # "kept" or "reverted"
    baseline_gen: int
    candidate_gen: int
    facts_before: Facts
    facts_after: Facts | None
    diff: FactsDiff | None
    restore: Restore | None


class Trial:
    """One change measured against the known-good by the sequential procedure
    (flagtrial.sequential): the procedure says which arm to measure next and whether to
    restart into it; the trial's parts plan it (Plan), switch arms (Arms: install, restart,
    facts), measure a block (Blocks: runs with foreign-load samples) and finish it."""

    def __init__(self, session: Session, change: Change, *, force: bool = False) -> None:
        self.s = session
        self.change = change
        self.force = force
        # True once the server is on a judged spec (kept candidate or verified restore):
        # from then on an interruption must not revert anything.
        self._settled = False
        self.resolves: Reason | None = None  # what the bound can resolve, said before the load

    async def run(self) -> TrialOutcome:
        s = self.s
        p = await plan(s, self.change)
        arms = Arms(s, p, force=self.force)
        self.resolves = self._resolves()  # said now, and in a verdict the load reached
        s.notify("resolves", self.resolves.message)
        seq = Sequential(
            s.project.policy, s.project.workload.concurrency, restart_s=p.facts_before.ready_s
        )
        try:
            return await self._measure(p, arms, seq)
        except BaseException as e:
            # Ctrl-C, SIGTERM, a lost link, a crash of our own code: never leave the candidate.
            p.gate_task.cancel()
            if not self._settled:  # else the journal is closed (kept or reverted)
                await self._interrupted(p, arms, e)
            raise

    async def _measure(self, p: Plan, arms: Arms, seq: Sequential) -> TrialOutcome:
        """Restart into and measure what the procedure asks for until it stops; then act on
        its verdict, or on an early one."""
        blocks = Blocks(self.s, p.journal)
        await arms.check_gates()
        while isinstance(step := seq.decision(), Continue):
            if step.restart and (early := await arms.enter(step.arm, seq)) is not None:
                return await self._finish(p, arms, early)
            if step.warmup:
                p.journal.step(
                    TrialState.MEASURING_BASELINE
                    if step.arm == "baseline"
                    else TrialState.MEASURING,
                    f"generation {p.generation(step.arm).id}: {step.step}",
                )
            try:
                await blocks.measure(seq, step)
            except ServerDiedError as e:
                if step.arm == "baseline" and not arms.touched:
                    raise await arms.restart_known_good(e) from None
                if step.arm == "baseline":
                    raise
                died = Reason(code=Code.SERVER_DIED, values={"error": str(e)})
                return await self._finish(p, arms, Verdict.revert(died))
            if (d := seq.design) is not None and "design" not in p.journal.context:
                # chosen by the procedure once the first block is measured
                self.s.notify("design", d.why)
                planned = d.looks(seq.policy).at if isinstance(d, Interleaved) else ()
                p.journal.context["design"] = {
                    "kind": d.kind,
                    "runs_per_block": d.runs_per_block,
                    "why": d.why,
                    **({"looks": list(planned)} if planned else {}),
                }
        if (measured := noise.measured(seq, self.s.project)) is not None:
            p.journal.context["noise"] = measured.model_dump()  # for the next trial's plan
        diff = arms.diff or diff_facts(p.facts_before, p.facts_before, set())
        verdict = step.verdict(self.s.project.policy, diff)
        if self.resolves is not None:
            verdict = verdict.adding(self.resolves)
        return await self._finish(p, arms, verdict)

    def _resolves(self) -> Reason:
        """What this trial's bound can resolve, at the noise the last trial of this workload
        on this target measured."""
        s = self.s
        if (prior := noise.last_measured(s.ledger, s.target.name, s.project)) is None:
            return Reason(code=Code.RESOLVES_UNKNOWN)
        trial_id, measured = prior
        return noise.resolvable(s.project.policy, measured, trial_id)

    async def _interrupted(self, p: Plan, arms: Arms, e: BaseException) -> None:
        """Stopped by `e` before the end: aborted when nothing of the candidate was installed,
        else the known-good restored (a failed restore re-raises `e` and leaves the journal
        unfinished: the next command recovers from it)."""
        if not arms.touched:
            with contextlib.suppress(Exception):
                p.journal.step(TrialState.ABORTED, f"{type(e).__name__}: {e}")
            return
        with contextlib.suppress(Exception):
            p.journal.step(
                TrialState.REVERTING,
                f"interrupted ({type(e).__name__}): restoring generation {p.good.id}",
            )
        try:
            restore = await asyncio.shield(self.s.restore(p.good))
        except Exception:
            raise e from None
        with contextlib.suppress(Exception):
            p.journal.step(TrialState.REVERTED, restore_detail(restore), finished_at=time.time())

    async def _finish(self, p: Plan, arms: Arms, verdict: Verdict) -> TrialOutcome:
        """Act on the verdict: keep the candidate (installing it again if the measurement
        ended on the known-good) or restore the known-good (no restart when the measurement
        ended on it, its facts verified at its last restart)."""
        s = self.s
        verdict = verdict.adding(*arms.notes, *arms.gate_reasons)
        p.journal.step(
            TrialState.JUDGED,
            verdict.decision,
            verdict=verdict.decision,
            reasons_json=_reasons_json(verdict),
            record_json=_record(p, arms, verdict),
        )
        keep = verdict.decision == "KEEP" or (
            verdict.decision == "INCONCLUSIVE" and s.project.policy.on_inconclusive == "keep"
        )
        if keep and arms.facts_after is not None and arms.installed == "baseline":
            mismatches = await arms.keep_candidate(arms.facts_after)
            if mismatches:
                keep = False
                changed = {"mismatches": "; ".join(mismatches)}
                verdict = verdict.adding(before=[Reason(code=Code.NOT_KEPT, values=changed)])
        restore = None
        if keep and arms.facts_after is not None:
            s.ledger.mark_known_good(p.candidate_gen.id, arms.facts_after.model_dump())
            self._settled = True
            p.journal.step(
                TrialState.KEPT,
                f"generation {p.candidate_gen.id} is now known-good",
                finished_at=time.time(),
            )
        else:
            restore = await self._revert(p, arms, verdict)
        return TrialOutcome(
            trial_id=p.journal.trial_id,
            verdict=verdict,
            outcome="kept" if keep else "reverted",
            baseline_gen=p.good.id,
            candidate_gen=p.candidate_gen.id,
            facts_before=p.facts_before,
            facts_after=arms.facts_after,
            diff=arms.diff,
            restore=restore,
        )

    async def _revert(self, p: Plan, arms: Arms, verdict: Verdict) -> Restore:
        serving = arms.baseline_facts if arms.installed == "baseline" else None
        p.journal.step(
            TrialState.REVERTING,
            f"generation {p.good.id} already serving, verified at its last restart"
            if serving is not None
            else f"restoring generation {p.good.id}",
        )
        if serving is not None:
            # Already serving, restarted and verified for the last measurement block.
            restore = Restore(generation=p.good.id, facts=serving, verified=True, mismatches=[])
        else:
            restore = await self.s.restore(p.good)
        self._settled = True
        p.journal.step(
            TrialState.REVERTED,
            restore_detail(restore),
            finished_at=time.time(),
            reasons_json=_reasons_json(verdict),
            record_json={**_record(p, arms, verdict), "restore": restore.model_dump()},
        )
        restore.raise_unless_verified()
        return restore


def _record(p: Plan, arms: Arms, verdict: Verdict) -> dict[str, Any]:
    return {
        "verdict": verdict.model_dump(),
        "facts_before": p.facts_before.model_dump(),
        "facts_after": arms.facts_after.model_dump() if arms.facts_after else None,
        "diff": arms.diff.model_dump() if arms.diff else None,
    }


def _reasons_json(verdict: Verdict) -> list[dict[str, Any]]:
    """The verdict's reasons as the ledger stores them: with their codes and values."""
    return [r.model_dump(mode="json") for r in verdict.reasons]
