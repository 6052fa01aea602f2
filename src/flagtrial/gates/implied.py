"""An edit that acts through a setting the engine's resolution changes on its own.

SGLang's argument-resolution hooks set other settings from the one edited (the model's
auto-enable list turning allreduce fusion on, `--enforce-disable-...` turning it back off, a
KV-cache dtype choosing a decode backend). The resolution of both commands shows those
settings move; each is then analysed in turn as an edit of its own, on the same host, model
and candidate command:

- it fails at startup with its new value: the edit FAILS AT STARTUP;
- it acts: an edit the source analysis left UNKNOWN or called a NO-OP is ACTIVE.

A setting is followed only where its change can be put as one edit against the value the
known-good resolves to: a switch turned on or off (on and off act alike; failing is judged
only for turning on), or a value set where the known-good keeps the flag's default.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from flagtrial.engines.resolve import Resolution
from flagtrial.gates.analyze import analyze_change, source_index
from flagtrial.gates.model import Evidence, GateFinding, GateHost, Outcome
from flagtrial.sourceread.fields import FlagTable

# Each followed setting costs one analysis; a change moving more than this many is not
# followed past them (their order is the settings' names).
MAX_FOLLOWED = 8


class Followed(NamedTuple):
    setting: str
    before: Any
    after: Any
    finding: GateFinding  # the setting's own analysis
    forward: bool  # that analysis' edit goes the move's way (a switch turned on, a value set)


def follow_implied(
    findings: list[GateFinding],
    good: Resolution | None,
    cand: Resolution | None,
    host: GateHost,
    command: list[str],
    model: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> list[GateFinding]:
    """The findings, with each not FAILS corrected by the settings the resolution moved that
    the change does not name (SGLang's whole records, both resolved)."""
    if good is None or cand is None or not (good.complete and cand.complete):
        return findings
    if good.status != "resolved" or cand.status != "resolved":
        return findings
    if not findings:
        return findings
    first = findings[0]
    table = source_index(first.engine, first.version).table
    # the edited settings themselves; a field an edit maps to besides (the setting an
    # `--enforce-disable-...` turns off) is followed like any other
    named = {(table.lookup(f.flag) or {}).get("dest") for f in findings}
    moved = sorted(
        k
        for k in set(good.settings) | set(cand.settings)
        if k not in named and good.settings.get(k) != cand.settings.get(k)
    )
    flags = _flags_by_setting(table)
    followed: list[Followed] = []
    for setting in moved:
        edit = _as_edit(flags.get(setting), good.settings.get(setting), cand.settings.get(setting))
        if edit is None:
            continue
        (flag, value), forward = edit
        words = [flag] if value is None else [flag, value]
        (found,) = analyze_change(
            first.engine,
            first.version,
            [(flag, value)],
            host,
            first.tp,
            command=[*command, *words],
            model=model,
            env=env,
        )
        before, after = good.settings.get(setting), cand.settings.get(setting)
        followed.append(Followed(setting, before, after, found, forward))
        if len(followed) == MAX_FOLLOWED:
            break
    return [_corrected(f, followed, cand) for f in findings]


def _corrected(finding: GateFinding, followed: list[Followed], cand: Resolution) -> GateFinding:
    if finding.outcome == Outcome.FAILS:
        return finding
    fails = [x for x in followed if x.finding.outcome == Outcome.FAILS and x.forward]
    acts = [x for x in followed if x.finding.outcome == Outcome.ACTIVE]
    if fails:
        outcome, through = Outcome.FAILS, fails[0]
    elif acts and finding.outcome in (Outcome.UNKNOWN, Outcome.NO_OP):
        outcome, through = Outcome.ACTIVE, acts[0]
    else:
        return finding
    moved = f"{through.setting} ({through.before!r} -> {through.after!r})"
    note = Evidence(
        role="note",
        note=f"the engine's own resolution moves {moved} with this edit ({cand.facts}); that"
        " setting's own analysis follows",
    )
    return finding.model_copy(
        update={
            "outcome": outcome,
            "unless_raised": None,
            "reason": f"through {moved}, which the engine's resolution moves with it:"
            f" {through.finding.reason}",
            "evidence": [note, *through.finding.evidence],
        }
    )


def _flags_by_setting(table: FlagTable) -> dict[str, dict[str, Any]]:
    """Each setting's flag (the first declared for its field)."""
    out: dict[str, dict[str, Any]] = {}
    for flag in table.flags.values():
        if flag.get("dest") and not flag.get("removed"):
            out.setdefault(flag["dest"], flag)
    return out


def _as_edit(
    flag: dict[str, Any] | None, before: Any, after: Any
) -> tuple[tuple[str, str | None], bool] | None:
    """The move as one edit ((flag, value), and whether that edit goes the move's way: a
    switch turned off is judged as turned on), or None where it cannot be put as one."""
    if flag is None:
        return None
    name = flag["names"][0]
    if flag.get("action") == "store_true" and {before, after} == {True, False}:
        return (name, None), after is True
    if flag.get("nargs") == 0 or after is None or isinstance(after, bool | list | dict):
        return None
    if str(before) != str(flag.get("default")):
        return None
    return (name, str(after)), True
