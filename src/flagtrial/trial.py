"""The trial: one change tried on one target, journaled step by step in the ledger.

planned -> measuring-baseline -> installing -> restarting -> waiting -> facts -> measuring
-> judged -> kept | reverting -> reverted. Any failure after the install goes to reverting.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel

from flagtrial.engines.base import Engine, wait_ready
from flagtrial.engines.flag_table import check_candidate
from flagtrial.errors import FlagtrialError, GateError, RollbackError, ServerNotReadyError
from flagtrial.facts import Facts, FactsDiff, diff_facts
from flagtrial.faults import checkpoint
from flagtrial.gates import preflight as gating
from flagtrial.gates.model import GateFinding
from flagtrial.judge import Verdict, capacity_breach, judge
from flagtrial.launch.change import Change, apply_change, names_touched
from flagtrial.launch.spec import LaunchSpec
from flagtrial.ledger import Generation, Ledger
from flagtrial.load.runner import run_level
from flagtrial.load.summary import RunSummary
from flagtrial.settings import Project
from flagtrial.targets.base import Target

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
        self, project: Project, target: Target, engine: Engine, ledger: Ledger, notify: Notify
    ) -> None:
        self.project = project
        self.target = target
        self.engine = engine
        self.ledger = ledger
        self.notify = notify

    async def restart_and_read(self) -> Facts:
        """Restart on the installed spec, wait until ready, read the server's facts."""
        mark = await self.target.restart()
        took = await wait_ready(
            self.engine, self.target, self.project.endpoint, mark, self.project.ready_timeout_s
        )
        self.notify("ready", f"server ready in {took:.1f}s")
        async with httpx.AsyncClient(timeout=10.0) as client:
            return await self.engine.facts(
                client, self.project.endpoint, await self.target.logs_since(mark)
            )

    async def close(self) -> None:
        await self.target.aclose()
        self.ledger.close()

    async def recover(self) -> None:
        """Finish what a killed flagtrial left: a trial judged KEEP is promoted, any other
        unfinished trial is rolled back to its baseline and verified."""
        for trial in self.ledger.unfinished_trials(self.target.name):
            self.notify("recover", f"trial {trial.id} was left unfinished in state {trial.state}")
            facts_after = trial.record.get("facts_after")
            if trial.verdict == "KEEP" and trial.candidate_gen and facts_after:
                installed = await self.target.read_spec()
                candidate = self.ledger.generation(trial.candidate_gen)
                if installed.sha256 == candidate.spec_sha256:
                    self.ledger.mark_known_good(candidate.id, facts_after)
                    self.ledger.step(
                        trial.id, "kept", "recovered: promotion finished", finished_at=time.time()
                    )
                    continue
            restore = await self.restore(self.ledger.generation(trial.baseline_gen))
            self.ledger.step(
                trial.id,
                "recovered",
                "recovered: " + _restore_detail(restore),
                finished_at=time.time(),
            )
            self.notify("recovered", _restore_detail(restore))
            if not restore.verified:
                raise RollbackError(
                    f"recovered trial {trial.id}, but the facts differ: "
                    + "; ".join(restore.mismatches)
                )

    async def known_good(self) -> tuple[Generation, LaunchSpec, Facts]:
        """The known-good generation, running and read. The installed spec becomes the baseline
        when the ledger has none, or when someone changed the spec outside flagtrial."""
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
        notes = check_candidate(schema, candidate)
        named = {k for f in names_touched(change, schema) for k in self.engine.settings_for_flag(f)}
        return Preflight(candidate=candidate, notes=notes, named_settings=named)

    async def restore(self, gen: Generation) -> Restore:
        """Install a generation, restart, and verify the server reports its known facts again."""
        installed = await self.target.read_spec()
        spec = LaunchSpec(kind=installed.kind, text=gen.spec_text, dropin=installed.dropin)
        await self.target.install_spec(spec)
        checkpoint("restore-installed")
        facts = await self.restart_and_read()
        expected = Facts.model_validate(gen.facts) if gen.facts else None
        tolerance = self.engine.capacity_tolerance_pct
        mismatches = verify_facts(expected, facts, tolerance) if expected else []
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


class Trial:
    def __init__(self, session: Session, change: Change, *, force: bool = False) -> None:
        self.s = session
        self.change = change
        # deploy even when the engine's source says the change fails at startup here
        self.force = force
        self.gate_reasons: list[str] = []
        self.trial_id = 0
        self.context: dict[str, Any] = {}
        # True once the server is on a judged spec (kept candidate or verified restore):
        # from then on an interruption must not revert anything.
        self._settled = False

    def _step(self, state: str, detail: str = "", **fields: Any) -> None:
        """Journal a step before acting on it (write-ahead), then announce it."""
        if "record_json" in fields:
            fields["record_json"] = {**self.context, **fields["record_json"]}
        self.s.ledger.step(self.trial_id, state, detail, **fields)
        self.s.notify(state, detail)
        checkpoint(state)

    async def _measure(self, arm: str) -> dict[int, list[RunSummary]]:
        project = self.s.project
        levels = project.workload.concurrency
        out: dict[int, list[RunSummary]] = {lvl: [] for lvl in levels}
        for run_index in range(project.policy.runs):
            for level in levels:
                result = await run_level(
                    project.endpoint,
                    project.workload,
                    level,
                    warmup=run_index == 0,
                    seed=run_index * 1000 + level,
                )
                state = await self.s.target.state()
                if state.status != "running":
                    raise ServerDiedError(
                        f"server died during the {arm} measurement (c={level}, run {run_index + 1})"
                    )
                out[level].append(result.summary)
                self.s.ledger.add_run(
                    self.trial_id, arm, level, run_index, result.summary.model_dump()
                )
                checkpoint(f"{arm}-run-{run_index + 1}")
                self.s.notify(
                    "run",
                    f"{arm} c={level} run {run_index + 1}/{project.policy.runs}: "
                    f"{result.summary.output_tok_s:.1f} tok/s, "
                    f"{result.summary.n_errors} errors",
                )
        return out

    async def run(self) -> TrialOutcome:
        s = self.s
        good, spec, facts_before = await s.known_good()
        checked = await s.preflight(spec, self.change)
        candidate, named = checked.candidate, checked.named_settings
        candidate_gen = s.ledger.record_generation(s.target.name, candidate.text, note="candidate")
        host = await s.target.host_facts()
        # kept in every record of this trial: the host it ran on and what preflight said
        self.context = {"host": host.model_dump(), "preflight_notes": checked.notes}
        # The source gate analysis runs beside the baseline measurement, not before it.
        gate_task = asyncio.create_task(
            gating.analyze(s.engine.name, facts_before.version, self.change, candidate,
                          gating.gate_host(host, s.project.gpu))
        )  # fmt: skip
        self.trial_id = s.ledger.start_trial(s.target.name, self.change.model_dump(), good.id)
        self._step(
            "preflighted",
            "; ".join([f"candidate is generation {candidate_gen.id}", *checked.notes]),
            candidate_gen=candidate_gen.id,
            record_json={},
        )

        facts_after: Facts | None = None
        diff: FactsDiff | None = None
        installed = False
        try:
            self._step("measuring-baseline", f"generation {good.id}")
            baseline = await self._measure("baseline")
            await self._check_gates(gate_task)
            self._step("installing", f"generation {candidate_gen.id}")
            installed = True
            await s.target.install_spec(candidate)
            self._step("restarting")
            try:
                facts_after = await s.restart_and_read()
            except ServerNotReadyError as e:
                verdict = Verdict(decision="REVERT", reasons=[str(e)], effects=[])
                return await self._finish(verdict, good, candidate_gen, facts_before, None, None)
            diff = diff_facts(facts_before, facts_after, named)
            self._step(
                "facts",
                "; ".join(c.describe() for c in diff.capacity),
                record_json={"facts_after": facts_after.model_dump(), "diff": diff.model_dump()},
            )
            breach = capacity_breach(s.project.policy, diff)
            if breach and s.project.policy.capacity_guard == "revert":
                verdict = Verdict(
                    decision="REVERT",
                    effects=[],
                    reasons=[breach, "capacity_guard = revert: no load spent on the candidate"],
                )
                return await self._finish(
                    verdict, good, candidate_gen, facts_before, facts_after, diff
                )
            self._step("measuring", f"generation {candidate_gen.id}")
            try:
                cand = await self._measure("candidate")
            except ServerDiedError as e:
                verdict = Verdict(decision="REVERT", reasons=[str(e)], effects=[])
                return await self._finish(
                    verdict, good, candidate_gen, facts_before, facts_after, diff
                )
            verdict = judge(s.project.policy, diff, baseline, cand)
            return await self._finish(verdict, good, candidate_gen, facts_before, facts_after, diff)
        except BaseException as e:
            # Ctrl-C, SIGTERM, a lost link, a crash of our own code: never leave the candidate.
            gate_task.cancel()
            if not installed:
                with contextlib.suppress(Exception):
                    self._step("aborted", f"{type(e).__name__}: {e}")
                raise
            if self._settled:
                raise
            with contextlib.suppress(Exception):
                self._step(
                    "reverting", f"interrupted ({type(e).__name__}): restoring generation {good.id}"
                )
            try:
                restore = await asyncio.shield(s.restore(good))
            except Exception:
                # The journal stays unfinished; the next command recovers from it.
                raise e from None
            with contextlib.suppress(Exception):
                self._step("reverted", _restore_detail(restore), finished_at=time.time())
            raise

    async def _check_gates(self, task: asyncio.Task[list[GateFinding]]) -> None:
        findings = await task
        if not findings:
            return
        self.context["gates"] = [f.model_dump(mode="json") for f in findings]
        self.gate_reasons = gating.reasons(findings)
        self._step("gates", "; ".join(f"{f.flag}: {f.outcome.value}" for f in findings),
                   record_json={})  # fmt: skip
        fails = gating.failing(findings)
        if fails and not self.force:
            first = fails[0]
            raise GateError(
                f"{first.flag} fails at startup on this GPU per {first.engine} {first.version}'s "
                f"source: {first.reason} (see `flagtrial preflight`; --force deploys anyway)"
            )

    async def _finish(
        self,
        verdict: Verdict,
        good: Generation,
        candidate_gen: Generation,
        facts_before: Facts,
        facts_after: Facts | None,
        diff: FactsDiff | None,
    ) -> TrialOutcome:
        s = self.s
        if self.gate_reasons:
            verdict = verdict.model_copy(update={"reasons": [*verdict.reasons, *self.gate_reasons]})
        self._step(
            "judged",
            verdict.decision,
            verdict=verdict.decision,
            reasons_json=verdict.reasons,
            record_json=_record(verdict, facts_before, facts_after, diff),
        )
        keep = verdict.decision == "KEEP" or (
            verdict.decision == "INCONCLUSIVE" and s.project.policy.on_inconclusive == "keep"
        )
        restore = None
        if keep and facts_after is not None:
            s.ledger.mark_known_good(candidate_gen.id, facts_after.model_dump())
            self._settled = True
            self._step(
                "kept", f"generation {candidate_gen.id} is now known-good", finished_at=time.time()
            )
        else:
            self._step("reverting", f"restoring generation {good.id}")
            restore = await s.restore(good)
            self._settled = True
            self._step(
                "reverted",
                _restore_detail(restore),
                finished_at=time.time(),
                record_json={
                    **_record(verdict, facts_before, facts_after, diff),
                    "restore": restore.model_dump(),
                },
            )
            if not restore.verified:
                raise RollbackError(
                    f"restored generation {good.id} but its facts differ: "
                    + "; ".join(restore.mismatches)
                )
        return TrialOutcome(
            trial_id=self.trial_id,
            verdict=verdict,
            outcome="kept" if keep else "reverted",
            baseline_gen=good.id,
            candidate_gen=candidate_gen.id,
            facts_before=facts_before,
            facts_after=facts_after,
            diff=diff,
            restore=restore,
        )


def _restore_detail(restore: Restore) -> str:
    if restore.verified:
        return f"generation {restore.generation} serving, facts match the known-good"
    return f"generation {restore.generation} serving, facts differ: " + "; ".join(
        restore.mismatches
    )


def _record(
    verdict: Verdict, before: Facts, after: Facts | None, diff: FactsDiff | None
) -> dict[str, Any]:
    return {
        "verdict": verdict.model_dump(),
        "facts_before": before.model_dump(),
        "facts_after": after.model_dump() if after else None,
        "diff": diff.model_dump() if diff else None,
    }
