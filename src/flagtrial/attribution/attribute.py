"""Which edit of a trial's change did it: the evidence that costs no restart first (the
engine's --help, the gate analysis the trial recorded), then restarts with no load (the
facts of subsets of the edits, group testing: attribution/search.py), then measured effects
last (probe trials of subsets, judged by the trial's own sequential procedure, never kept).

Every restart is journaled: the fact reads in one trial-shaped journal of their own (a
killed attribution is recovered to the known-good like a trial), each probe in its own
trial. The result is kept in the ledger's attributions table."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from flagtrial.attribution import resolution
from flagtrial.attribution.effects import FAILS_TO_START, describe, fact_effects, trial_effects
from flagtrial.attribution.evidence import inert
from flagtrial.attribution.outcome import Attribution, Cost, EditOutcome, Found, judge
from flagtrial.attribution.search import FactSearch, Subset
from flagtrial.errors import ServerNotReadyError, UsageError
from flagtrial.facts import Facts, FactsDiff, diff_facts
from flagtrial.gates.model import Outcome
from flagtrial.launch.change import Change, Edit, last_value
from flagtrial.launch.schema import FlagSchema
from flagtrial.launch.spec import LaunchSpec
from flagtrial.plan import Journal
from flagtrial.records import TrialRow
from flagtrial.redact import MARK
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
        self.probes: dict[int, Cost] = {}  # the journals that are probe trials, their cost
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
        if measured is not None and good.id == trial.baseline_gen:
            await self._search_measured(FactSearch({measured}, candidates))
        elif measured is not None:
            # A probe trial measures against the known-good that serves: not the trial's.
            self.found.unsettled[measured] = set(candidates)
            self.stopped = (
                f"measured effects are probed against the known-good trial {trial.id} measured "
                f"against (generation {trial.baseline_gen}); generation {good.id} serves now"
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
        for a measured effect, a probe trial each, as costly as the probes run cost on
        average (as the trial attributed, when none ran)."""
        n = len(self.edits)
        if not measured:
            return Cost(restarts=n + 1, load_s=0.0)
        costs = list(self.probes.values()) or [ledger_cost(self.s, self.trial.id)]
        restarts = sum(c.restarts for c in costs) / len(costs)
        load_s = sum(c.load_s for c in costs) / len(costs)
        return Cost(restarts=round(n * restarts), load_s=round(n * load_s, 1))

    def _bound(self) -> bool:
        """Whether the policy's bounds leave room for another read; else why the search stops
        (a probe trial's own bounds are the policy's as for any trial)."""
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

    # measured effects last: probe trials of subsets

    def _probe_session(self) -> Session:
        """The session a probe runs in: a probe asks whether a subset carries the trial's
        effect, so it may stop at "no effect" once its interval lies within half that effect
        (never finer than the policy's own margin)."""
        s = self.s
        pct = self.trial.reasons[0].values.get("pct") if self.trial.reasons else None
        policy = s.project.policy
        margin = round(max(policy.equivalence_margin_pct, abs(float(pct or 0.0)) / 2), 1)
        project = s.project.model_copy(
            update={"policy": policy.model_copy(update={"equivalence_margin_pct": margin})}
        )
        return Session(project, s.target, s.engine, s.ledger, s.notify, s.progress)

    async def _search_measured(self, search: FactSearch) -> None:
        from flagtrial.trial import Trial  # the trial imports the session's whole loop

        (effect,) = search.effects
        probing = self._probe_session()
        while (subset := search.next()) is not None and self._bound():
            outcome = await Trial(probing, self._subset(subset), probe_of=self.trial.id).run()
            self.journals.append(outcome.trial_id)
            cost = self.probes[outcome.trial_id] = ledger_cost(self.s, outcome.trial_id)
            self.used = Cost(
                restarts=self.used.restarts + cost.restarts,
                load_s=round(self.used.load_s + cost.load_s, 1),
            )
            finding = outcome.verdict.finding
            shown = {f"measured:{finding}"} if f"measured:{finding}" == effect else set()
            search.observe(subset, shown)
            if len(subset) == 1:
                lead = outcome.verdict.reasons[0].message
                said = f"{lead} (trial {outcome.trial_id}, this edit alone)"
                (i,) = subset
                if shown:
                    self.found.said.setdefault(effect, {})[i] = said
                else:
                    self.found.notes.setdefault(i, []).append(said)
                if finding == "equivalent":
                    self.found.equivalent.add(i)
        self._leave(search)
        for i in search.found[effect].alone - self.found.said.get(effect, {}).keys():
            lead = self.trial.reasons[0].message if self.trial.reasons else describe(effect)
            said = f"{lead} (trial {self.trial.id}: the only edit that can act)"
            self.found.said.setdefault(effect, {})[i] = said


async def fixed_change(s: Session, trial_id: int) -> Change:
    """The change the latest attribution of `trial_id` leaves (no harmful or interacting
    edit), its values as the trial's candidate ran them: the ledger keeps a change's secret
    values redacted, the candidate's spec keeps them whole."""
    stored = s.ledger.attribution(trial_id)
    if stored is None:
        raise UsageError(
            f"trial {trial_id} was never attributed: run `flagtrial attribute {trial_id}`"
        )
    fixed = Attribution.model_validate(stored).fixed()
    if fixed is None:
        raise UsageError(
            f"the attribution of trial {trial_id} leaves no change to try: every edit "
            "was harmful or interacting, or none was (the trial's own change)"
        )
    if not any(e.value is not None and MARK in e.value for e in fixed.edits):
        return fixed
    trial = s.ledger.trial(trial_id)
    serving = await s.target.read_spec()
    ran = LaunchSpec(
        kind=serving.kind,
        text=s.ledger.generation(trial.candidate_gen or trial.baseline_gen).spec_text,
        dropin=serving.dropin,
    )
    schema = await s.engine.flag_schema(s.target, ran.program)
    return Change(edits=[_as_ran(e, ran, schema) for e in fixed.edits])


def _as_ran(edit: Edit, ran: LaunchSpec, schema: FlagSchema) -> Edit:
    if edit.value is None or MARK not in edit.value:
        return edit
    value = (
        ran.env.get(edit.name)
        if edit.op == "setenv"
        else last_value(ran, schema, schema.lookup(edit.name))
    )
    if value is None:
        raise UsageError(f"{edit.name}: its value is kept only redacted: give the change by hand")
    return edit.model_copy(update={"value": value})


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
