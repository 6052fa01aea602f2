"""The trial: one change tried on one target, journaled step by step in the ledger.

planned -> measuring-baseline -> installing -> restarting -> waiting -> facts -> measuring
-> judged -> kept | reverting -> reverted. Any failure after the install goes to reverting.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel

from flagtrial.engines.base import Engine, ProgressFn, ResolvesDefaults, ValueChecker, wait_ready
from flagtrial.engines.flag_table import check_candidate
from flagtrial.errors import (
    ChangeError,
    FlagtrialError,
    GateError,
    LockHeldError,
    RollbackError,
    ServerNotReadyError,
)
from flagtrial.facts import Facts, FactsDiff, diff_facts, request_tokens
from flagtrial.faults import checkpoint
from flagtrial.gates import preflight as gating
from flagtrial.gates.model import GateFinding
from flagtrial.guardrails import CAPACITY
from flagtrial.hygiene import disturbed, foreign_load, sample_target
from flagtrial.judge import Verdict
from flagtrial.launch.change import (
    Change,
    apply_change,
    check_listen_address,
    checkable_args,
    names_touched,
)
from flagtrial.launch.spec import LaunchSpec, byte_difference
from flagtrial.ledger import Ledger
from flagtrial.load.runner import run_level
from flagtrial.reasons import Code, Reason
from flagtrial.records import Generation
from flagtrial.sequential import Arm, Continue, Sequential
from flagtrial.settings import Project
from flagtrial.states import TrialState
from flagtrial.targets.base import Target
from flagtrial.targets.holder import held_message

Notify = Callable[[str, str], None]


class ServerDiedError(FlagtrialError):
    exit_code = 7


@dataclass(frozen=True)
class Preflight:
    candidate: LaunchSpec
    notes: list[str]  # deprecations and the like: shown, not fatal
    named_settings: set[str]


class Restore(BaseModel):
    generation: int
    facts: Facts
    verified: bool
    mismatches: list[str]


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


def verify_facts(expected: Facts, actual: Facts, tolerance_pct: float = 0.0) -> list[str]:
    """Mismatches between two fact sets: capacity within the engine's tolerance, resolved
    settings exactly."""
    diff = diff_facts(expected, actual, set())
    return [c.describe() for c in diff.capacity if abs(c.pct) > tolerance_pct] + [
        s.describe() for s in diff.implicit
    ]


class Session:
    """What every command that touches a server needs: project, target, engine, ledger."""

    def __init__(
        self,
        project: Project,
        target: Target,
        engine: Engine,
        ledger: Ledger,
        notify: Notify,
        progress: ProgressFn | None = None,
    ) -> None:
        self.project = project
        self.target = target
        self.engine = engine
        self.ledger = ledger
        self.notify = notify
        self.progress = progress  # told how each restart's start goes, while it goes

    async def restart_and_read(self) -> Facts:
        """Restart on the installed spec, wait until ready, read the server's facts."""
        began = time.monotonic()
        mark = await self.target.restart()
        await wait_ready(
            self.engine,
            self.target,
            self.project.endpoint,
            mark,
            self.project.ready_timeout_s,
            self.progress,
        )
        took = time.monotonic() - began
        self.notify("ready", f"server ready in {took:.1f}s")
        async with httpx.AsyncClient(timeout=10.0) as client:
            facts = await self.engine.facts(
                client, self.project.endpoint, await self.target.logs_since(mark)
            )
        if isinstance(self.engine, ResolvesDefaults):
            program = (await self.target.read_spec()).program
            facts = await self.engine.with_defaults(self.target, program, facts)
        # Capacity at the workload's lengths, as this server counts its prompts.
        tokens = await request_tokens(self.project.endpoint, self.project.workload)
        return facts.at_tokens(tokens).model_copy(update={"ready_s": took})

    async def close(self) -> None:
        await self.target.aclose()
        self.ledger.close()

    async def recover(self) -> None:
        """Finish what a killed flagtrial left: a trial judged KEEP is promoted (the candidate
        installed, restarted and verified against the facts it was judged on), any other
        unfinished trial is rolled back to its baseline and verified. A journal is unfinished
        only when its holder is gone: while another command holds the lock, its trial runs,
        and this refuses (LockHeldError) rather than restart the server under it."""
        holder = await self.target.lock_holder()
        if holder is not None and not holder.ours:
            raise LockHeldError(held_message(self.target.name, holder))
        for trial in self.ledger.unfinished_trials(self.target.name):
            self.notify("recover", f"trial {trial.id} was left unfinished in state {trial.state}")
            facts_after = trial.facts_after
            if trial.verdict == "KEEP" and trial.candidate_gen and facts_after:
                candidate = self.ledger.generation(trial.candidate_gen)
                promoted = await self.restore(candidate, facts_after)
                if promoted.verified:
                    self.ledger.mark_known_good(candidate.id, trial.record["facts_after"])
                    self.ledger.step(
                        trial.id,
                        TrialState.KEPT,
                        "recovered: promotion finished",
                        finished_at=time.time(),
                    )
                    continue
                self.notify("recover", "the kept candidate came back different: "
                            + "; ".join(promoted.mismatches))  # fmt: skip
            restore = await self.restore(self.ledger.generation(trial.baseline_gen))
            self.ledger.step(
                trial.id,
                TrialState.RECOVERED,
                "recovered: " + _restore_detail(restore),
                finished_at=time.time(),
            )
            self.notify("recovered", _restore_detail(restore))
            if not restore.verified:
                raise RollbackError(
                    f"recovered trial {trial.id}, but the facts differ: "
                    + "; ".join(restore.mismatches)
                )

    async def live_facts(self) -> Facts | None:
        """The running server's facts read over HTTP, restarting nothing (no startup log, so
        facts only a log gives are missing); None when it does not answer."""
        async with httpx.AsyncClient(timeout=10.0) as client:
            if not await _ready(self.engine, client, self.project.endpoint):
                return None
            try:
                return await self.engine.facts(client, self.project.endpoint, "")
            except (httpx.HTTPError, FlagtrialError, KeyError, ValueError):
                return None

    async def known_good(self) -> tuple[Generation, LaunchSpec, Facts]:
        """The known-good generation, running and read, for a command that holds the lock:
        unfinished trials are recovered first. The installed spec becomes the baseline when
        the ledger has none, or when someone changed the spec outside flagtrial."""
        await self.recover()
        spec = await self.target.read_spec()
        installed = self.ledger.record_generation(self.target.name, spec.text, note="installed")
        good = self.ledger.last_known_good(self.target.name)
        state = await self.target.state()
        if (
            good is not None
            and good.id == installed.id
            and state.status == "running"
            and good.facts
        ):
            async with httpx.AsyncClient(timeout=10.0) as client:
                if await _ready(self.engine, client, self.project.endpoint):
                    return good, spec, Facts.model_validate(good.facts)
        if good is not None and good.id != installed.id:
            self.notify(
                "baseline",
                f"installed spec differs from known-good generation {good.id}; "
                f"taking the installed spec (generation {installed.id}) as the baseline",
            )
        self.notify("baseline", f"starting generation {installed.id} to read its facts")
        facts = await self.restart_and_read()
        self.ledger.mark_known_good(installed.id, facts.model_dump())
        return self.ledger.generation(installed.id), spec, facts

    async def preflight(self, spec: LaunchSpec, change: Change) -> Preflight:
        """Everything knowable before a deploy: the candidate, checked against the engine's own
        flags and parser, and which resolved settings the change names."""
        schema = await self.engine.flag_schema(self.target, spec.program)
        candidate = apply_change(spec, change, schema)
        if candidate.text == spec.text:
            # An A/A trial by accident costs restarts and says nothing about the change.
            raise ChangeError(
                "the change leaves the launch spec as it is (the values are already set): "
                "nothing to trial"
            )
        check_listen_address(
            spec, candidate, schema, self.project.endpoint, self.engine.default_port
        )
        if isinstance(self.engine, ValueChecker):
            await self.engine.check_values(
                self.target, spec.program, checkable_args(change, schema)
            )
        notes = check_candidate(schema, candidate)
        named = {k for f in names_touched(change, schema) for k in self.engine.settings_for_flag(f)}
        return Preflight(candidate=candidate, notes=notes, named_settings=named)

    async def restore(self, gen: Generation, expected: Facts | None = None) -> Restore:
        """Install a generation, restart, and verify the spec reads back as the generation's
        exact bytes and the server reports its known facts again (`expected`, by default the
        generation's own)."""
        installed = await self.target.read_spec()
        spec = LaunchSpec(kind=installed.kind, text=gen.spec_text, dropin=installed.dropin)
        await self.target.install_spec(spec)
        # Facts cannot see a changed line ending or comment byte: the bytes are compared too.
        differs = byte_difference(gen.spec_text, (await self.target.read_spec()).text)
        checkpoint("restore-installed")
        facts = await self.restart_and_read()
        if expected is None and gen.facts:
            expected = Facts.model_validate(gen.facts)
        tolerance = self.engine.capacity_tolerance_pct
        mismatches = verify_facts(expected, facts, tolerance) if expected else []
        mismatches = [differs, *mismatches] if differs else mismatches
        return Restore(
            generation=gen.id,
            facts=facts,
            verified=expected is not None and not mismatches,
            mismatches=mismatches,
        )


async def _ready(engine: Engine, client: httpx.AsyncClient, base_url: str) -> bool:
    try:
        return await engine.is_ready(client, base_url)
    except httpx.HTTPError:
        return False


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
    gate_task: asyncio.Task[list[GateFinding]]
    journal: Journal

    def generation(self, arm: Arm) -> Generation:
        return self.good if arm == "baseline" else self.candidate_gen


async def plan(s: Session, change: Change) -> Plan:
    """Preflight the change, record the candidate and open the trial's journal; the source
    gate analysis starts, to run beside the first baseline runs, not before them."""
    good, spec, facts_before = await s.known_good()
    checked = await s.preflight(spec, change)
    candidate_gen = s.ledger.record_generation(
        s.target.name, checked.candidate.text, note="candidate"
    )
    host = await s.target.host_facts()
    gate_task = asyncio.create_task(
        gating.analyze(s.engine.name, facts_before.version, change, checked.candidate,
                       gating.gate_host(host, s.project.gpu))
    )  # fmt: skip
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
        self.gates_checked = False
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
        if not self.gates_checked:
            # Before the first restart of any kind: a change that fails at startup here
            # must not cost the known-good even one restart.
            self.gates_checked = True
            await self._check_gates()
        if self.installed != arm:
            gen = plan.generation(arm)
            plan.journal.step(TrialState.INSTALLING, f"generation {gen.id} ({_ARM_NAMES[arm]})")
            self.touched = True  # before the install: a kill inside it must restore
            await s.target.install_spec(plan.specs[arm])
            self.installed = arm
        plan.journal.step(TrialState.RESTARTING, _ARM_NAMES[arm])
        try:
            facts = await s.restart_and_read()
        except ServerNotReadyError as e:
            if arm == "baseline":
                raise
            return Verdict.revert(Reason(code=Code.CANDIDATE_NOT_READY, values={"error": str(e)}))
        tolerance = s.engine.capacity_tolerance_pct
        if arm == "baseline":
            mismatches = verify_facts(plan.facts_before, facts, tolerance)
            self.baseline_facts = facts if not mismatches else None
            if mismatches:
                void = {"mismatches": "; ".join(mismatches)}
                return Verdict.revert(Reason(code=Code.BASELINE_FACTS_CHANGED, values=void))
            return None
        if self.facts_after is not None:
            mismatches = verify_facts(self.facts_after, facts, tolerance)
            if mismatches:
                changed = {"mismatches": "; ".join(mismatches)}
                self.notes.append(Reason(code=Code.CANDIDATE_FACTS_CHANGED, values=changed))
            return None
        self.facts_after = facts
        self.diff = diff_facts(plan.facts_before, facts, plan.named)
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
        return ServerDiedError(f"{died}; restarted: {_restore_detail(restore)}")

    async def _check_gates(self) -> None:
        findings = await self.plan.gate_task
        if not findings:
            return
        journal = self.plan.journal
        journal.context["gates"] = [f.model_dump(mode="json") for f in findings]
        self.gate_reasons = gating.reasons(findings)
        journal.step(TrialState.GATES, "; ".join(f"{f.flag}: {f.outcome.value}" for f in findings),
                     record_json={})  # fmt: skip
        fails = gating.failing(findings)
        if fails and not self.force:
            first = fails[0]
            raise GateError(
                f"{first.flag} fails at startup on this GPU per {first.engine} {first.version}'s "
                f"source: {first.reason} (see `flagtrial preflight`; --force deploys anyway)"
            )


class Blocks:
    """Measuring a block: one run at every workload level on the running arm, each between
    two samples of the server machine's foreign load, passed to the procedure."""

    def __init__(self, s: Session, journal: Journal) -> None:
        self.s = s
        self.journal = journal
        self.runs_done: dict[Arm, int] = {"baseline": 0, "candidate": 0}
        self.clock = time.monotonic()  # when the last run ended (observe's elapsed_s)

    async def measure(self, seq: Sequential, step: Continue) -> None:
        s = self.s
        project = s.project
        arm = step.arm
        index = self.runs_done[arm]
        self.runs_done[arm] += 1
        # one sample between two levels' runs serves as the after of one and the before of
        # the next: half the samples (each a round trip on a remote target)
        before = await sample_target(s.target)
        for level in project.workload.concurrency:
            result = await run_level(
                project.endpoint,
                project.workload,
                level,
                warmup=step.warmup,
                # unique prompts across both arms: no prefix cache can serve one arm's
                # prompts to the other
                seed=(index * 2 + (arm == "candidate")) * 1000 + level,
            )
            state = await s.target.state()
            if state.status != "running":
                raise ServerDiedError(
                    f"server died during the {arm} measurement (c={level}, run {index + 1})"
                )
            after = await sample_target(s.target)
            own_pid = os.getpid() if s.target.local else None
            load = foreign_load(before, after, state.pid, own_pid) if before and after else None
            before = after
            why = disturbed(load, project.policy.foreign_cpu_max_cores) if load else None
            set_aside = why is not None and project.policy.set_aside_disturbed
            now = time.monotonic()
            seq.observe(
                arm,
                level,
                result.summary,
                records=result.records,
                disturbed=why,
                elapsed_s=now - self.clock,
            )
            self.clock = now
            s.ledger.add_run(
                self.journal.trial_id, arm, level, index, result.summary.model_dump(),
                block=step.block, disturbed=why, foreign=dataclasses.asdict(load) if load else None,
            )  # fmt: skip
            checkpoint(f"{arm}-run-{index + 1}")
            s.notify(
                "run",
                f"{arm} c={level} run {index + 1} (block {step.block + 1}): "
                f"{result.summary.output_tok_s:.1f} tok/s, {result.summary.n_errors} errors"
                + (f"; {'set aside' if set_aside else 'counted'}, {why}" if why else ""),
            )


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

    async def run(self) -> TrialOutcome:
        s = self.s
        policy = s.project.policy
        p = await plan(s, self.change)
        arms = Arms(s, p, force=self.force)
        seq = Sequential(policy, s.project.workload.concurrency, restart_s=p.facts_before.ready_s)
        try:
            blocks = Blocks(s, p.journal)
            while isinstance(step := seq.decision(), Continue):
                if step.restart:
                    early = await arms.enter(step.arm, seq)
                    if early is not None:
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
                    s.notify("design", d.why)
                    p.journal.context["design"] = {
                        "kind": d.kind,
                        "runs_per_block": d.runs_per_block,
                        "why": d.why,
                    }
            diff = arms.diff or diff_facts(p.facts_before, p.facts_before, set())
            return await self._finish(p, arms, step.verdict(policy, diff))
        except BaseException as e:
            # Ctrl-C, SIGTERM, a lost link, a crash of our own code: never leave the candidate.
            p.gate_task.cancel()
            if self._settled:
                raise  # the journal is closed (kept or reverted)
            if not arms.touched:
                with contextlib.suppress(Exception):
                    p.journal.step(TrialState.ABORTED, f"{type(e).__name__}: {e}")
                raise
            with contextlib.suppress(Exception):
                p.journal.step(
                    TrialState.REVERTING,
                    f"interrupted ({type(e).__name__}): restoring generation {p.good.id}",
                )
            try:
                restore = await asyncio.shield(s.restore(p.good))
            except Exception:
                # The journal stays unfinished; the next command recovers from it.
                raise e from None
            with contextlib.suppress(Exception):
                p.journal.step(
                    TrialState.REVERTED, _restore_detail(restore), finished_at=time.time()
                )
            raise

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
            _restore_detail(restore),
            finished_at=time.time(),
            reasons_json=_reasons_json(verdict),
            record_json={**_record(p, arms, verdict), "restore": restore.model_dump()},
        )
        if not restore.verified:
            raise RollbackError(
                f"restored generation {p.good.id} but its facts differ: "
                + "; ".join(restore.mismatches)
            )
        return restore


def _record(p: Plan, arms: Arms, verdict: Verdict) -> dict[str, Any]:
    return {
        "verdict": verdict.model_dump(),
        "facts_before": p.facts_before.model_dump(),
        "facts_after": arms.facts_after.model_dump() if arms.facts_after else None,
        "diff": arms.diff.model_dump() if arms.diff else None,
    }


_ARM_NAMES: dict[Arm, str] = {"baseline": "known-good", "candidate": "candidate"}


def _reasons_json(verdict: Verdict) -> list[dict[str, Any]]:
    """The verdict's reasons as the ledger stores them: with their codes and values."""
    return [r.model_dump(mode="json") for r in verdict.reasons]


def _restore_detail(restore: Restore) -> str:
    if restore.verified:
        return f"generation {restore.generation} serving, facts match the known-good"
    return f"generation {restore.generation} serving, facts differ: " + "; ".join(
        restore.mismatches
    )
