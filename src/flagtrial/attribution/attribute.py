"""Which edit of a trial's change did it: the evidence that costs no restart first (the
engine's --help, the gate analysis the trial recorded), then restarts with no load (the
facts of subsets of the edits, group testing: attribution/search.py), then measured effects
last (a two-level design over the edits, measured in replicates until the trial's confidence
sequence decides each edit: attribution/factorial.py).

Every restart is journaled in a trial-shaped journal of the attribution's own (one for the
fact reads, one for the measured design): a killed attribution is recovered to the
known-good like a trial. The result is kept in the ledger's attributions table."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from flagtrial.attribution import resolution
from flagtrial.attribution.effects import FAILS_TO_START, describe, fact_effects, trial_effects
from flagtrial.attribution.evidence import inert
from flagtrial.attribution.factorial import Design, Factorial
from flagtrial.attribution.measured import ArmRuns, read_design, reused_arms
from flagtrial.attribution.outcome import Attribution, Cost, EditOutcome, Found, judge
from flagtrial.attribution.search import Culprits, FactSearch, Subset
from flagtrial.designs import MAX_RUNS_PER_BLOCK, runs_per_restart
from flagtrial.errors import ServerNotReadyError, UsageError
from flagtrial.facts import Facts, FactsDiff, diff_facts
from flagtrial.gates.model import Outcome
from flagtrial.launch.change import Change, Edit
from flagtrial.launch.schema import FlagSchema
from flagtrial.launch.spec import LaunchSpec
from flagtrial.plan import Journal
from flagtrial.records import TrialRow
from flagtrial.session import Session, restore_detail
from flagtrial.states import FINAL, TrialState

if TYPE_CHECKING:
    from flagtrial.trial import TrialOutcome

Settled = dict[int, tuple[EditOutcome, str]]


def settled_without_restart(
    trial: TrialRow,
    edits: list[Edit],
    argv: list[str],
    schema: FlagSchema,
    failed: bool,
    resolved: bool = False,
) -> Settled:
    """Edits whose outcome is known before any restart: inert by the engine's --help, or,
    where the candidate did not start (`failed`), a startup failure by the gate analysis the
    trial recorded; where each edit is `resolved` alone (attribution/resolution.py), not the
    FAILS the gates took from the whole candidate's resolution (every edit of the command the
    engine refuses: each edit's own resolution says which). A NO-OP by the source is not
    settled: a kernel that never runs may still take memory (the seed's fusion workspace cost
    capacity 48 -> 26), so its edit is searched like any other, its finding kept as evidence
    (`source_no_ops`)."""
    settled: Settled = {}
    gates = _gates(trial)
    for i, edit in enumerate(edits):
        if edit.name.startswith("-") and (why := inert(edit, argv, schema)) is not None:
            settled[i] = ("useless", why)
        elif (
            failed
            and (g := gates.get(edit.name))
            and g["outcome"] == Outcome.FAILS
            and not (resolved and g["evidence"] and g["evidence"][0]["role"] == "raise")
        ):
            settled[i] = ("harmful", f"{Outcome.FAILS} by the engine's source: {g['reason']}")
    return settled


def source_no_ops(trial: TrialRow, edits: list[Edit]) -> dict[int, str]:
    """Edit -> the gate analysis' NO-OP finding for it: no speed of its own to measure."""
    gates = _gates(trial)
    return {
        i: f"{Outcome.NO_OP} by the engine's source: {g['reason']}"
        for i, e in enumerate(edits)
        if (g := gates.get(e.name)) and g["outcome"] == Outcome.NO_OP
    }


def _gates(trial: TrialRow) -> dict[str, dict[str, Any]]:
    return {g["flag"]: g for g in trial.record.get("gates", [])}


def ledger_cost(s: Session, trial_id: int) -> Cost:
    """The restarts a trial journaled and the seconds of load it ran."""
    events = s.ledger.events(trial_id)
    runs = s.ledger.runs(trial_id)
    return Cost(
        restarts=sum(e.state == TrialState.RESTARTING for e in events),
        load_s=round(sum(float(r.summary.get("duration_s", 0.0)) for r in runs), 1),
    )


def _said(effect: str, diff: FactsDiff) -> str:
    """The numbers behind a fact effect in a start's diff."""
    kind, _, rest = effect.partition(":")
    if kind == "capacity":
        name = rest.rpartition(":")[0]
        return next(c.describe() for c in diff.capacity if c.name == name)
    if kind == "setting":
        return next(c.describe() for c in diff.implicit if c.name == rest)
    return describe(effect)


class Attribute:
    """One attribution of trial `trial_id`, under the target's lock the caller holds."""

    def __init__(self, session: Session, trial_id: int) -> None:
        self.s = session
        self.trial = session.ledger.trial(trial_id)
        self.edits = Change.model_validate(self.trial.change).edits
        self.found = Found()
        self.used = Cost(restarts=0, load_s=0.0)
        self.journals: list[int] = []
        self.alone: Cost | None = None  # one edit at a time, for the measured design's widths
        self.stopped: str | None = None
        self.resolutions = 0  # the engine's own resolutions run (attribution/resolution.py)
        self.began = time.monotonic()
        self.restore_to = self.trial.baseline_gen  # the known-good that serves, once read

    async def run(self) -> Attribution:
        s, trial = self.s, self.trial
        self._check()
        good, serving, _ = await s.known_good()
        self.restore_to = good.id
        # Subsets are started on the spec the trial measured against, and read against the
        # facts it found there, whether or not that spec still serves (a kept trial).
        base = s.ledger.generation(trial.baseline_gen)
        spec = LaunchSpec(kind=serving.kind, text=base.spec_text, dropin=serving.dropin)
        facts_before = Facts.model_validate(trial.record["facts_before"])
        schema = await s.engine.flag_schema(s.target, spec.program)
        facts, measured = self.effects()
        if not facts and measured is None:
            raise UsageError(
                f"trial {trial.id} showed nothing to attribute: no capacity or setting its "
                "candidate moved, no measured gain or harm"
            )
        failed = FAILS_TO_START in facts
        args = spec.argv[spec.program_words :]
        each = await resolution.known_good(s, spec, trial, facts, failed)
        settled = settled_without_restart(trial, self.edits, args, schema, failed, each is not None)
        among: dict[str, Subset] = {}
        if each is not None:
            among = await resolution.before_restarts(
                s, spec, each, trial, self.edits, facts, settled, self.found, failed
            )
            self.resolutions = each.spent
        candidates = frozenset(range(len(self.edits))) - settled.keys()
        if any(outcome == "harmful" for outcome, _ in settled.values()):
            facts.discard(FAILS_TO_START)  # the source or resolution names it: no start to spend
        for i, finding in source_no_ops(trial, self.edits).items():
            self.found.notes.setdefault(i, []).append(finding)
            self.found.equivalent.add(i)
        if (trial.record.get("verdict") or {}).get("finding") == "equivalent":
            self.found.equivalent |= candidates
        await self._search_facts(FactSearch(facts, candidates, among), spec, facts_before)
        if measured is not None and len(candidates) == 1:
            self._only_one(measured, candidates)
        elif measured is not None and good.id == trial.baseline_gen:
            await self._measure_design(measured, candidates, spec)
        elif measured is not None:
            # the design measures against the known-good that serves: not the trial's
            self.found.unsettled[measured] = set(candidates)
            self.stopped = (
                f"measured effects are measured against the known-good trial {trial.id} "
                f"measured against (generation {trial.baseline_gen}); generation {good.id} "
                "serves now"
            )
        result = Attribution(
            trial_id=trial.id,
            edits=judge(self.edits, settled, self.found),
            used=self.used,
            one_at_a_time=self._one_at_a_time(measured is not None),
            journals=self.journals,
            stopped=self.stopped,
            resolutions=self.resolutions,
        )
        s.ledger.record_attribution(trial.id, result.model_dump(mode="json"))
        return result

    def effects(self) -> tuple[set[str], str | None]:
        """The trial's fact effects and its measured one, to attribute."""
        return trial_effects(self.trial, self.s.engine.capacity_tolerance_pct)

    def _check(self) -> None:
        trial = self.trial
        if len(self.edits) < 2:
            raise UsageError(f"trial {trial.id} has {len(self.edits)} edit: nothing to attribute")
        if trial.state not in FINAL:
            raise UsageError(f"trial {trial.id} is {trial.state}: attribute a finished trial")
        if (
            "facts_before" not in trial.record
            or {"probe_of", "attribution_of"} & trial.record.keys()
        ):
            raise UsageError(f"trial {trial.id} is not a trial of a change that was measured")

    def _one_at_a_time(self, measured: bool) -> Cost:
        """Each edit alone: a start and a facts read each (and the known-good's restore), or,
        for a measured effect, the runs one edit at a time against the known-good would take
        for the intervals the design gave (each run after its own restart, as here)."""
        n = len(self.edits)
        if not measured:
            return Cost(restarts=n + 1, load_s=0.0)
        if self.alone is None:  # nothing measured: what the trial attributed cost, per edit
            cost = ledger_cost(self.s, self.trial.id)
            return Cost(restarts=n * cost.restarts, load_s=round(n * cost.load_s, 1))
        return self.alone

    def _bound(self) -> bool:
        """Whether the policy's bounds leave room for another restart; else why the search
        stops."""
        policy = self.s.project.policy
        if self.used.restarts >= policy.attribution_max_restarts:
            self.stopped = f"bound: {policy.attribution_max_restarts} restarts"
        elif time.monotonic() - self.began > policy.attribution_max_seconds:
            self.stopped = f"bound: {policy.attribution_max_seconds:g} s"
        return self.stopped is None

    def _leave(self, search: FactSearch) -> None:
        self.found.culprits.update(search.found)
        self.found.unsettled.update(search.unsettled())

    def _subset(self, subset: Subset) -> Change:
        return Change(edits=[self.edits[i] for i in sorted(subset)])

    def _label(self, subset: Subset) -> str:
        return "edits " + ", ".join(str(i + 1) for i in sorted(subset))

    # restarts with no load: the facts of subsets

    async def _search_facts(self, search: FactSearch, spec: LaunchSpec, before: Facts) -> None:
        reads: dict[Subset, FactsDiff] = {}
        journal: Journal | None = None
        try:
            while (subset := search.next()) is not None and self._bound():
                if journal is None:
                    journal = self._open_journal()
                search.observe(subset, await self._read(journal, subset, spec, before, reads))
        except BaseException as e:
            if journal is not None:
                await self._restore(journal, f"interrupted ({type(e).__name__})")
            raise
        if journal is not None:
            await self._restore(journal, "searched")
        self._leave(search)
        whole = self.trial.diff
        for effect, culprits in search.found.items():
            for i in culprits.alone:
                diff = reads.get(frozenset({i}))
                where = "a start with only this edit" if diff is not None else (
                    f"trial {self.trial.id}: the only edit that can move a fact")  # fmt: skip
                if (diff := diff or whole) is not None:
                    said = f"{_said(effect, diff)} ({where})"
                    self.found.said.setdefault(effect, {})[i] = said

    def _open_journal(self) -> Journal:
        s, trial = self.s, self.trial
        # its baseline is the known-good that serves: what a recovery restores
        trial_id = s.ledger.start_trial(s.target.name, trial.change, self.restore_to)
        self.journals.append(trial_id)
        journal = Journal(s, trial_id, {"attribution_of": trial.id})
        journal.step(TrialState.PREFLIGHTED, f"attribution of trial {trial.id}", record_json={})
        return journal

    async def _read(
        self,
        journal: Journal,
        subset: Subset,
        spec: LaunchSpec,
        before: Facts,
        reads: dict[Subset, FactsDiff],
    ) -> set[str]:
        """Start the known-good with `subset` of the edits, read its facts: the effects."""
        s = self.s
        checked = await s.check_change(spec, self._subset(subset))
        gen = s.ledger.record_generation(
            s.target.name, checked.candidate.text, note=f"attribution of trial {self.trial.id}"
        )
        journal.step(
            TrialState.INSTALLING, f"generation {gen.id}: {self._label(subset)}",
            candidate_gen=gen.id,
        )  # fmt: skip
        await s.target.install_spec(checked.candidate)
        journal.step(TrialState.RESTARTING, self._label(subset))
        self.used.restarts += 1
        try:
            facts = await s.restart_and_read()
        except ServerNotReadyError as e:
            s.notify("facts", f"{self._label(subset)}: did not start: {e}")
            return {"start:fails"}
        reads[subset] = diff = diff_facts(before, facts, checked.named_settings)
        shown = fact_effects(diff, s.engine.capacity_tolerance_pct)
        journal.step(
            TrialState.FACTS,
            f"{self._label(subset)}: " + (", ".join(sorted(map(describe, shown))) or "no effect"),
            record_json={"subset": sorted(subset), "diff": diff.model_dump()},
        )
        return shown

    async def _restore(self, journal: Journal, why: str) -> None:
        """Back to the known-good, verified: the journal closes reverted."""
        s, good = self.s, self.s.ledger.generation(self.restore_to)
        with contextlib.suppress(Exception):
            journal.step(TrialState.REVERTING, f"{why}: restoring generation {good.id}")
        restore = await asyncio.shield(s.restore(good))
        self.used.restarts += 1
        journal.step(TrialState.REVERTED, restore_detail(restore), finished_at=time.time())
        restore.raise_unless_verified()

    # measured effects last: a two-level design over the edits

    def _margin(self) -> float:
        """No effect within half the trial's own effect (never finer than the policy's
        margin): the design asks which edits carry that effect."""
        pct = self.trial.reasons[0].values.get("pct") if self.trial.reasons else None
        margin = self.s.project.policy.equivalence_margin_pct
        return round(max(margin, abs(float(pct or 0.0)) / 2), 1)

    def _runs_per_restart(self) -> int:
        """As many runs after each restart as the trial's own interleaved blocks would take
        at the restart and run times it measured (at most MAX_RUNS_PER_BLOCK)."""
        policy, trial = self.s.project.policy, self.trial
        ready_s = Facts.model_validate(trial.record["facts_before"]).ready_s
        level = policy.primary_concurrency or max(self.s.project.workload.concurrency)
        runs = [r for r in self.s.ledger.runs(trial.id) if r.concurrency == level]
        run_s = sum(float(r.summary.get("duration_s", 0.0)) for r in runs) / max(len(runs), 1)
        return min(runs_per_restart(policy, ready_s, run_s), MAX_RUNS_PER_BLOCK)

    def _only_one(self, effect: str, candidates: Subset) -> None:
        """The one edit that can act carries the trial's measured effect: no run to spend."""
        (i,) = candidates
        self.found.culprits.setdefault(effect, Culprits()).alone.add(i)
        lead = self.trial.reasons[0].message if self.trial.reasons else describe(effect)
        said = f"{lead} (trial {self.trial.id}: the only edit that can act)"
        self.found.said.setdefault(effect, {})[i] = said

    async def _measure_design(self, effect: str, candidates: Subset, spec: LaunchSpec) -> None:
        s = self.s
        design = Design.of(candidates)
        factorial = Factorial(design, s.project.policy, self._margin())
        journal = self._open_journal()
        arms = ArmRuns(s, journal, spec, self.edits, self._runs_per_restart())
        load_before = self.used.load_s
        reused = reused_arms(s, self.trial, design)
        try:
            while not factorial.done() and self._bound():
                replicate = factorial.replicates
                logs: dict[Subset, float] = dict(reused) if replicate == 0 else {}
                for k, arm in enumerate(design.order(replicate)):
                    if arm in logs:
                        continue
                    if not self._bound():
                        break
                    self.used.restarts += 1
                    await arms.start(arm)
                    seed = replicate * len(design.arms) + k
                    if (value := await arms.measure(arm, replicate, seed)) is None:
                        break  # every attempt disturbed: the next replicate starts afresh
                    logs[arm] = value
                if len(logs) == len(design.arms):
                    factorial.observe(logs)
                self.used.load_s = round(load_before + arms.load_s, 1)
        except ServerNotReadyError as e:
            self.stopped = f"an arm of the measured design did not start: {e}"
        except BaseException as e:
            await self._restore(journal, f"interrupted ({type(e).__name__})")
            raise
        await self._restore(journal, "measured")
        if why := read_design(self.found, effect, factorial, s.project.policy.primary_metric):
            self.stopped = why
        visits = design.alone_visits(factorial.replicates)
        per_visit = arms.load_s / max(arms.visits, 1)
        self.alone = Cost(restarts=visits + 1, load_s=round(visits * per_visit, 1))


async def after(s: Session, outcome: TrialOutcome) -> Attribution | None:
    """Attribute a trial just judged, where there is something to attribute: two or more
    edits and an effect, not kept, or kept with a capacity loss or a setting the server
    moved on its own."""
    diff = outcome.diff
    moved = diff is not None and (diff.worst_capacity_loss() is not None or bool(diff.implicit))
    attribute = Attribute(s, outcome.trial_id)
    facts, measured = attribute.effects()
    nothing = not facts and measured is None
    if len(attribute.edits) < 2 or nothing or (outcome.outcome == "kept" and not moved):
        return None
    return await attribute.run()
