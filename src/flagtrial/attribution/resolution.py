"""The engine's own argument resolution of the known-good with each edit alone, before any
restart (SGLang, vLLM: engines/resolve.py): which resolved settings each edit moves, and
whether the engine refuses the command with it.

A setting the server changed unasked, that the whole candidate's resolution predicted and
exactly one edit's own resolution moves, is that edit's: no restart. Where two or more move
it, it is searched by restarts as before, among the edits whose resolution moves one of the
searched settings (an edit that moves none can still carry a capacity effect: only that
setting's search is narrowed). Where the candidate failed to start, an edit whose own
resolution raises is harmful. Where nothing resolves (llama.cpp, an engine not importable on
the host), nothing is settled here."""

from __future__ import annotations

from dataclasses import dataclass, field

from flagtrial.attribution.outcome import EditOutcome, Found
from flagtrial.attribution.search import Culprits, Subset
from flagtrial.engines import resolve as resolving
from flagtrial.engines.resolve import Resolution, ResolveFacts
from flagtrial.errors import ChangeError
from flagtrial.facts import Scalar
from flagtrial.launch.change import Change, Edit
from flagtrial.launch.spec import LaunchSpec
from flagtrial.records import TrialRow
from flagtrial.session import Session

Settled = dict[int, tuple[EditOutcome, str]]
SETTING = "setting:"
_OWN = "the engine's own resolution of the known-good with only this edit"


@dataclass
class EachResolved:
    """The known-good resolved, and each edit resolved alone on it (`alone`, by index), on
    the same GPU facts (`facts`: declared, or None for the host's own)."""

    known_good: Resolution
    alone: dict[int, Resolution] = field(default_factory=dict)
    facts: ResolveFacts | None = None

    @property
    def spent(self) -> int:
        """Resolutions run: the known-good's and one per edit."""
        return 1 + len(self.alone)

    def moved(self, i: int, setting: str) -> tuple[Scalar, Scalar] | None:
        """(known-good's value, edit i's) where edit i alone moves `setting`, else None."""
        own = self.alone.get(i)
        if own is None or own.status != "resolved":
            return None
        before, after = self.known_good.settings.get(setting), own.settings.get(setting)
        return None if before == after else (before, after)


async def known_good(
    s: Session, spec: LaunchSpec, trial: TrialRow, effects: set[str], failed: bool
) -> EachResolved | None:
    """The known-good resolved on the target's host (declared GPU facts where it reports
    none), where a resolution can settle one of `effects` (a start that failed, a setting the
    whole candidate's resolution predicted); None where none can, where the engine has no
    resolution here, or where the known-good does not resolve."""
    engine = s.engine.name
    if engine not in resolving.ENGINES or not (failed or _settings(effects, predicted(trial))):
        return None
    facts = resolving.declared_facts(await s.target.host_facts(), s.project.gpu)
    (good,) = await resolving.resolve_specs(s.target, engine, [spec], facts)
    return EachResolved(known_good=good, facts=facts) if good.status == "resolved" else None


async def resolve_each(
    s: Session, spec: LaunchSpec, each: EachResolved, edits: list[Edit], among: Subset
) -> None:
    """Each edit of `among` resolved alone on the known-good `spec`, on the known-good's facts
    (one after the other, the engine imported once); an edit that does not resolve is left
    out."""
    alone: dict[int, LaunchSpec] = {}
    for i in sorted(among):
        try:
            alone[i] = (await s.check_change(spec, Change(edits=[edits[i]]))).candidate
        except ChangeError:
            continue  # alone it leaves the spec as it is: nothing of its own to resolve
    got = await resolving.resolve_specs(s.target, s.engine.name, list(alone.values()), each.facts)
    each.alone.update((i, r) for i, r in zip(alone, got, strict=True) if r.status != "unresolved")


def predicted(trial: TrialRow) -> set[str]:
    """The settings the trial's resolution of the whole candidate predicted it would change
    unasked (recorded by the trial's gates)."""
    implicit = (trial.record.get("resolution") or {}).get("implicit") or []
    return {c["name"] for c in implicit}


def _settings(effects: set[str], predicted: set[str]) -> list[str]:
    """The setting effects the whole candidate's resolution predicted."""
    return sorted(e for e in effects if e.startswith(SETTING) and e[len(SETTING) :] in predicted)


@dataclass
class ByResolution:
    """What the resolutions settle: startup failures (`harmful`), settings each carried by
    one edit (`alone`: effect -> (edit, evidence)), the settings' searches narrowed (`among`),
    and what to say of edits whose settings are still searched (`notes`)."""

    harmful: dict[int, str] = field(default_factory=dict)
    alone: dict[str, tuple[int, str]] = field(default_factory=dict)
    among: dict[str, Subset] = field(default_factory=dict)
    notes: dict[int, list[str]] = field(default_factory=dict)


def settle(
    each: EachResolved, effects: set[str], predicted: set[str], candidates: Subset, failed: bool
) -> ByResolution:
    """What `each` settles of the trial's `effects` among `candidates`; `failed`: the
    candidate did not start. Pure."""
    by = ByResolution()
    if failed:
        for i in sorted(candidates):
            raised = each.alone[i].raised if i in each.alone else None
            if raised is not None and each.known_good.raised is None:
                by.harmful[i] = (
                    f"fails at startup per the engine's own resolution: {raised.describe()} "
                    f"({_OWN}, {each.alone[i].facts})"
                )
    settings = _settings(effects, predicted)
    movers = {
        e: {i for i in candidates if each.moved(i, e[len(SETTING) :]) is not None} for e in settings
    }
    moving = frozenset(set().union(*movers.values())) if movers else frozenset()
    for effect, who in movers.items():
        name = effect[len(SETTING) :]
        if len(who) == 1:
            (i,) = who
            before, after = each.moved(i, name) or (None, None)
            by.alone[effect] = (i, f"{_OWN}: {name} {before!r} -> {after!r}")
        elif who:
            by.among[effect] = moving
            shown = ", ".join(str(o + 1) for o in sorted(who))
            for i in who:
                by.notes.setdefault(i, []).append(
                    f"{name}: edits {shown} each move it alone by the engine's own "
                    "resolution: searched by restarts"
                )
    return by


async def before_restarts(
    s: Session,
    spec: LaunchSpec,
    each: EachResolved,
    trial: TrialRow,
    edits: list[Edit],
    effects: set[str],
    settled: Settled,
    found: Found,
    failed: bool,
) -> dict[str, Subset]:
    """Each edit not settled yet resolved alone, and what that settles: startup failures into
    `settled`, settings carried by one edit out of `effects` into `found`; the narrowed
    searches of the rest."""
    candidates = frozenset(range(len(edits))) - settled.keys()
    await resolve_each(s, spec, each, edits, candidates)
    by = settle(each, effects, predicted(trial), candidates, failed)
    settled.update({i: ("harmful", why) for i, why in by.harmful.items()})
    for effect, (i, said) in by.alone.items():
        effects.discard(effect)
        found.culprits[effect] = Culprits(alone={i})
        found.said[effect] = {i: said}
    for i, notes in by.notes.items():
        found.notes.setdefault(i, []).extend(notes)
    return by.among
