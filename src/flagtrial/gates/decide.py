"""The outcome of an edit, decided from the walk by rules taken in order; the first that
decides gives the finding:

1. FAILS AT STARTUP: a raise certain with the edit, not without it, in code that runs at
   every launch; or vLLM's selector rejecting the named attention backend on this GPU;
2. NO-OP: argument resolution turns the setting off again here, replaces it at every
   launch, or picks the edited value anyway (gates/rewrites.py); unless a startup check
   of that value is reached with every test holding (then UNKNOWN);
3. from the reads (gates/reads.py): ACTIVE when one acts (or a function registered for the
   value runs), unless a startup failure is certain with the settings left out at their
   defaults (UNKNOWN); NO-OP when every read that would act is ruled out on this host (its
   GPU, the model, the command, the launch's environment) and every function was walked;
   else UNKNOWN.

An UNKNOWN given only for such a raise in argument resolution (rules 2 and 3) names the
outcome behind it (`unless_raised`), for the engine's own resolution to decide
(gates/preflight.py `combine`).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import TYPE_CHECKING

from flagtrial.gates.bodies import ruled_out_inside
from flagtrial.gates.callers import never_called_here
from flagtrial.gates.leveldefaults import level_default
from flagtrial.gates.model import Evidence, GateFinding, Outcome
from flagtrial.gates.paths import Walker
from flagtrial.gates.picked import picked_anyway
from flagtrial.gates.reads import Effect, classify, consumer, declaration_read, shown, writes_field
from flagtrial.gates.rewrites import overwritten, platform_choice, resets
from flagtrial.gates.selector import selected_backend_failure
from flagtrial.gates.sites import RaiseSite, all_hold

if TYPE_CHECKING:
    from flagtrial.gates.analysis import Analysis

MAX_SHOWN = 4
MAX_EFFECTS = 60


def decide(a: Analysis, walker: Walker) -> GateFinding:
    rules: tuple[Callable[[], GateFinding | None], ...] = (
        lambda: _startup_failure(a, walker),
        lambda: _backend_rejected(a),
        lambda: _reset(a, walker),
        lambda: overwritten(a, walker),
        lambda: _platform_pick(a, walker),
        lambda: level_default(a, walker),
    )
    for rule in rules:
        found = rule()
        if found is not None:
            return found
    return _from_reads(a, walker)


def _startup_failure(a: Analysis, walker: Walker) -> GateFinding | None:
    certain = [r for r in walker.raises if r.certain]
    failures = [r for r in certain if r.runs_at_startup]
    if not failures:
        return None
    first = min(failures, key=lambda r: (len(r.chain), r.stmt.lineno))
    # The reads nearest before the raise (or before the first call followed to it).
    fi, start, _ = first.unit
    until = first.chain[0][2] if first.chain else first.stmt.lineno
    near = sorted(
        (r.node.lineno, r.field)
        for r in walker.reads
        if r.fi == fi and start <= r.node.lineno <= until
    )
    for line, name in near[-2:]:
        a.chain.add("read", fi, line, f"reads {name}")
    a.chain.raised(first)
    return a.finding(Outcome.FAILS, a.chain.raise_reason(first))


def _reset(a: Analysis, walker: Walker) -> GateFinding | None:
    reset = next((r for r in walker.reads if resets(a, r)), None)
    if reset is None:
        return None
    a.chain.add("read", reset.fi, reset.node.lineno, f"reads {reset.field}")
    if reset.context is not None and reset.ctx is not None:
        a.chain.value(reset.fi, reset.context, reset.ctx.new)
    assert isinstance(reset.stmt, ast.If)  # resets holds only for an `if`
    write = next(
        (
            getattr(n, "lineno", reset.stmt.lineno)
            for b in reset.stmt.body
            for n in ast.walk(b)
            if writes_field(n, reset.field)
        ),
        reset.stmt.lineno,
    )
    a.chain.add("gate", reset.fi, write, f"turns {reset.field} off again on this host")
    return a.finding(
        Outcome.NO_OP,
        f"{a.where(reset)} turns {reset.field} off again on this host",
    )


def _platform_pick(a: Analysis, walker: Walker) -> GateFinding | None:
    choice = platform_choice(a, walker)
    if choice is None:
        return None
    blocking = _config_failure(a)
    if blocking is not None:
        a.chain.raised(blocking)
        return a.finding(
            Outcome.UNKNOWN,
            f"without the flag this host picks the same value, but"
            f" {a.chain.raise_reason(blocking).removesuffix(' on this host')} is reached"
            " with every test holding (with the settings left out at their defaults)",
            Outcome.NO_OP if _in_resolution(a, blocking) else None,
        )
    site, value = choice
    a.chain.add("read", site.fi, site.node.lineno, f"reads {site.field}")
    a.chain.add("gate", site.fi, site.stmt.lineno, "the platform's choice when not given")
    for trace in value.traces:
        a.chain.trace(trace)
    return a.finding(
        Outcome.NO_OP,
        f"{a.where(site)}: without the flag this host gets {site.field}={value.value!r} anyway",
    )


def _from_reads(a: Analysis, walker: Walker) -> GateFinding:
    effects = _effects(a, walker)
    alive = [e for e in effects if e.status == "alive"]
    blocked = [e for e in effects if e.status in ("hw", "foreign")]
    if alive or a.selected:
        return _active(a, walker, effects, alive, blocked)
    if blocked and a.skipped:
        return a.finding(
            Outcome.UNKNOWN,
            f"the reads walked are ruled out on this host, but {a.skipped} functions that"
            " mention the field were not walked",
        )
    if blocked:
        for effect in blocked[:MAX_SHOWN]:
            a.chain.read(effect)
        return a.finding(
            Outcome.NO_OP,
            f"every read that would act ({len(blocked)}) is ruled out on this host",
        )
    if effects:
        return a.finding(Outcome.UNKNOWN, "no read changes what runs for this value")
    return a.finding(
        Outcome.UNKNOWN, f"no read of {', '.join(sorted(a.edited))} that acts was found"
    )


def _active(
    a: Analysis, walker: Walker, effects: list[Effect], alive: list[Effect], blocked: list[Effect]
) -> GateFinding:
    """Some read acts (or a function registered for the value runs): ACTIVE, unless a
    startup failure is certain with the settings the command leaves out at their defaults."""
    # Reads behind a host-dependent guard that holds (or may) say most about the GPU.
    # Reads every guard of which holds come first (they are shown to run), then
    # those in the code that serves, not in argument resolution.
    alive.sort(
        key=lambda e: (
            not shown(e.site),
            e.site.runs_at_startup,
            not any(g.new.hw for g in e.site.guards)
            and not (e.site.ctx is not None and e.site.ctx.new.hw),
        )
    )
    for effect in alive[:MAX_SHOWN]:
        a.chain.read(effect)
    for effect in blocked[:2]:
        a.chain.read(effect)  # what this GPU rules out, though others act
    _possible_failures(a, walker)
    if a.skipped:
        a.chain.items.append(
            Evidence(
                role="note",
                note=f"{a.skipped} more functions mention the field and were not"
                " walked: a startup failure there is not ruled out",
            )
        )
    possible = _failure_with_defaults(a)
    if possible is not None:
        a.chain.raised(possible)
        return a.finding(
            Outcome.UNKNOWN,
            f"{a.chain.raise_reason(possible).removesuffix(' on this host')} on this host"
            " if the settings the command leaves out keep their defaults (argument"
            " resolution may change them): not ruled out",
            Outcome.ACTIVE if _in_resolution(a, possible) else None,
        )
    count = f"{len(alive)}+" if len(effects) >= MAX_EFFECTS else str(len(alive))
    parts = [f"selects {', '.join(a.selected)}"] if a.selected else []
    if alive:
        parts.append(
            f"{count} read(s) of {', '.join(sorted(a.edited))} can act on this"
            f" host, e.g. {a.where(alive[0].site)}"
        )
    finding = a.finding(Outcome.ACTIVE, "; ".join(parts))
    finding.acts_in_resolution_only = (
        not a.selected
        and not a.skipped
        and len(effects) < MAX_EFFECTS
        and all(a.startup_file(e.site.fi) for e in alive)
    )
    return finding


def _backend_rejected(a: Analysis) -> GateFinding | None:
    """vLLM: an attention backend the command names is validated alone at startup; its
    own capability check False on this GPU is a ValueError (gates/selector.py)."""
    value = a.new.get("attention_backend")
    cap = a.host.capability
    if a.index.engine != "vllm" or value is None or cap is None:
        return None
    if not isinstance(value.value, str):
        return None
    hit = selected_backend_failure(a.index, a.reader, a.host.platform, cap, value.value)
    if hit is None:
        return None
    a.chain.add(
        "gate",
        hit.check_fi,
        hit.check_line,
        f"`{hit.check}` is False for capability {cap[0]}.{cap[1]}",
    )
    a.chain.add(
        "raise",
        hit.raise_fi,
        hit.raise_line,
        "a selected backend that reports a"
        " reason is not replaced: ValueError while the attention layers are built",
    )
    where = f"{a.index.files[hit.raise_fi].path}:{hit.raise_line}"
    return a.finding(
        Outcome.FAILS,
        f"raise ValueError at {where} on this host: {hit.backend} does not support"
        f" compute capability {cap[0]}.{cap[1]}",
    )


def _effects(a: Analysis, walker: Walker) -> list[Effect]:
    """The reads that change what runs, classified (at most MAX_EFFECTS: a long list
    proves nothing more, and each costs evaluating its guards)."""
    effects = []
    for site in walker.reads:
        if declaration_read(site, a.index.table):
            continue
        if consumer(site, a.index.table.fields, a.new)[0] == "effect":
            effect = classify(site, a.foreign(site.fi, site.stmt.lineno))
            inert = None
            if effect.status == "alive":
                inert = (
                    ruled_out_inside(a, site)
                    or never_called_here(a, site)
                    or picked_anyway(a, site)
                )
            effects.append(Effect(site, "hw", inert) if inert is not None else effect)
            if len(effects) >= MAX_EFFECTS:
                break
    return effects


def _config_failure(a: Analysis) -> RaiseSite | None:
    """A startup check of the edited value whose every test holds once the settings left
    out take their defaults, host-dependent or not: no NO-OP is claimed over it."""
    walker = a.walk(everything_default=True)
    for r in walker.raises:
        guards = [g for g in r.guards if not g.assumed]
        # in a check that itself tests the edited value (`if view.x == "v": ...`)
        if (
            r.runs_at_startup
            and not r.in_try
            and not r.chain
            and any(g.tainted for g in guards)
            # earlier checks of the function pass too: it is this one that raises
            and all_hold(g.holds_new for g in r.guards) is True
        ):
            return r
    return None


def _failure_with_defaults(a: Analysis) -> RaiseSite | None:
    """The startup raise that is certain once every setting the command leaves out is
    taken at its declared default (argument resolution may rewrite some: a guess, so
    it makes the outcome UNKNOWN, never FAILS)."""
    walker = a.walk(everything_default=True)
    failures = [r for r in walker.raises if r.certain and r.runs_at_startup]
    return min(failures, key=lambda r: (len(r.chain), r.stmt.lineno)) if failures else None


def _in_resolution(a: Analysis, r: RaiseSite) -> bool:
    """The raise, and the walk that reached it, lie in argument resolution: the code the
    engine's own resolution runs (engines/resolve_dump.py), so that runs through without it
    rule it out for this command on this host."""
    return a.startup_file(r.fi) and a.startup_file(r.unit[0])


def _possible_failures(a: Analysis, walker: Walker) -> None:
    """Raises that the edit reaches on this host when something not known here holds:
    the function runs (a kernel selected by the model), or a guard not known here."""
    for r in walker.raises:
        if r.certain:
            fn = a.chain.function_at(r.fi, r.stmt.lineno)
            a.chain.add(
                "note",
                r.fi,
                r.stmt.lineno,
                f"raises on this host when {fn} runs; whether it runs at startup depends"
                " on the model and other settings",
            )
            return
    for r in walker.raises:
        if r.in_try or any(g.holds_new is False for g in r.guards):
            continue
        if (
            any(g.new.hw for g in r.guards)
            and all(g.holds_old is not True for g in r.guards if g.holds_new is None)
            and any(g.holds_old is False for g in r.guards)
        ):
            a.chain.add(
                "note",
                r.fi,
                r.stmt.lineno,
                "may raise here, depending on what is not known about the host",
            )
            return
