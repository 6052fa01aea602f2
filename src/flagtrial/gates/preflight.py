"""The source gate analysis as a preflight step: which host, which edits, which tp."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from flagtrial.engines import ENGINES, GATED
from flagtrial.engines.resolve import Resolution
from flagtrial.gates.analyze import analyze_change
from flagtrial.gates.implied import follow_implied
from flagtrial.gates.model import Evidence, GateFinding, GateHost, Outcome
from flagtrial.launch.change import Change
from flagtrial.launch.schema import flag_value
from flagtrial.launch.spec import LaunchSpec
from flagtrial.reasons import Code, Reason
from flagtrial.settings import DeclaredGpu
from flagtrial.targets.base import HostFacts


def tensor_parallel(argv: list[str], engine: str) -> int:
    text = flag_value(argv, ENGINES[engine].tp_flags) or "1"
    return int(text) if text.isdigit() else 1


def gate_host(host: HostFacts, declared: DeclaredGpu) -> GateHost | None:
    """The host's own GPUs; else the project's declared GPU; else None (nothing to analyse)."""
    if host.gpus:
        return GateHost.from_host_facts(host, cuda_version=declared.cuda)
    return GateHost.declared(declared)


async def analyze(
    engine: str,
    version: str | None,
    change: Change,
    candidate: LaunchSpec,
    host: GateHost | None,
    model: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> list[GateFinding]:
    """Findings for every add/set edit, judged within the whole candidate command (and the
    model's config.json and the launch's environment when given); [] where the analysis
    does not apply. Runs in a thread: the index may take seconds to build the first time
    for a version."""
    edits = [(e.name, e.value) for e in change.edits if e.op in ("add", "set")]
    if engine not in GATED or not version or host is None or not edits:
        return []
    tp = tensor_parallel(candidate.argv, engine)
    return await asyncio.to_thread(
        partial(analyze_change, command=candidate.argv, model=model, env=env),
        engine,
        version,
        edits,
        host,
        tp,
    )


def failing(findings: list[GateFinding]) -> list[GateFinding]:
    return [f for f in findings if f.outcome == Outcome.FAILS]


def reasons(findings: list[GateFinding]) -> list[Reason]:
    """One reason per finding that matters to a verdict: a flag that cannot act here."""
    return [
        Reason(
            code=Code.SOURCE_GATE,
            values={
                "flag": f.flag,
                "setting": f.flag if f.value is None else f"{f.flag} {f.value}",
                "outcome": f.outcome.value,
                "why": f.reason,
            },
        )
        for f in findings
        if f.outcome in (Outcome.NO_OP, Outcome.FAILS)
    ]


def _same_config(finding: GateFinding, cand: Resolution) -> GateFinding:
    """vLLM resolves both commands to the same configuration: an edit whose settings reach
    the server only through it is a NO-OP there; any other stands (`--disable-log-stats`
    leaves the configuration alone and acts in the engine client)."""
    if finding.outcome not in (Outcome.ACTIVE, Outcome.UNKNOWN) or not finding.fields:
        return finding
    # The finding's fields name the engine argument and the config fields it fills
    # (`attention_backend`, AttentionConfig's `backend`): the argument is read by the
    # configuration's creation, and none of them by name beside it.
    fields = set(finding.fields)
    if not fields & set(cand.config_only) or fields & set(cand.read_beyond_config):
        return finding
    note = Evidence(
        role="note",
        note=f"the engine resolves both commands to the same configuration, all "
        f"{len(cand.record)} fields ({cand.facts}); {', '.join(finding.fields)} reach the "
        "server only through it",
    )
    reason = "the engine's own resolution gives the same configuration with and without it"
    return finding.model_copy(
        update={"outcome": Outcome.NO_OP, "reason": reason, "evidence": [note, *finding.evidence]}
    )


def _moves_only_itself(finding: GateFinding, good: Resolution, cand: Resolution) -> GateFinding:
    """SGLang resolves both commands to records apart only in the edit's own settings, and
    the edit acts only through reads in argument resolution (which that resolution ran):
    those reads changed no other setting, and every read after resolution is ruled out."""
    moved = {k for k in good.settings.keys() | cand.settings.keys()
             if good.settings.get(k) != cand.settings.get(k)}  # fmt: skip
    if finding.outcome != Outcome.ACTIVE or not finding.acts_in_resolution_only:
        return finding
    if not moved <= set(finding.fields):
        return finding
    note = Evidence(
        role="note",
        note=f"the engine's own resolution moves no setting but {', '.join(sorted(moved))}"
        f" ({cand.facts}); its reads in argument resolution change nothing else",
    )
    reason = (
        "the engine's own resolution moves no other setting, and every read after it is"
        " ruled out on this host"
    )
    return finding.model_copy(
        update={"outcome": Outcome.NO_OP, "reason": reason, "evidence": [note, *finding.evidence]}
    )


def corrected(
    findings: list[GateFinding],
    good: Resolution,
    cand: Resolution,
    host: GateHost,
    command: list[str],
    model: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> list[GateFinding]:
    """The findings as the engine's own resolution of both commands corrects them (`combine`),
    then with the settings it moves on its own analysed in turn (gates/implied.py). Runs
    analyses: call it off the event loop."""
    return follow_implied(combine(findings, good, cand), good, cand, host, command, model, env)


def combine(
    findings: list[GateFinding],
    resolution_known_good: Resolution | None,
    resolution_candidate: Resolution | None,
) -> list[GateFinding]:
    """The static findings, corrected by the engine's own resolution of both commands (None,
    or the candidate's "unresolved": the findings stand).

    - The candidate raises where the known-good does not: every edit FAILS AT STARTUP, with
      the engine's message and its file:line (the raise is the command's, not one edit's).
      So too where the known-good's resolution could not run here ("unresolved": what this
      venv lacks, not a verdict), since the known-good is the command that runs.
    - The candidate raises at the very startup raise an UNKNOWN edit's analysis left open
      (`unless_raised`, its file:line cited), and the known-good raises elsewhere: FAILS AT
      STARTUP.
    - Otherwise both raise: the known-good, which runs, is refused too, so the resolution
      cannot tell what fails here; findings stand.
    - Both resolve to the same whole record (SGLang's resolved_dict): the server gets the same
      configuration either way, so an ACTIVE or UNKNOWN edit is a NO-OP on this host.
    - Both resolve to the same configuration (vLLM's VllmConfig, every field, with the
      attention backend its selector picks for the model): an ACTIVE or UNKNOWN edit whose
      settings reach the server only through it is a NO-OP.
    - Both resolve to whole records (SGLang) apart only in an ACTIVE edit's own settings, and
      its reads that act all lie in argument resolution: a NO-OP on this host.
    - The candidate resolves through the whole resolution (SGLang): an edit UNKNOWN only for
      a raise in argument resolution not ruled out (`unless_raised`) gets the outcome its
      reads show, since that code ran with this command on this host and did not raise.
    - Otherwise the findings stand: a resolved difference does not show a read that acts."""
    good, cand = resolution_known_good, resolution_candidate
    if good is None or cand is None or cand.status == "unresolved":
        return findings
    if good.status == "unresolved" and cand.raised is None:
        return findings
    if cand.raised is not None and good.raised is None:
        raised = cand.raised
        evidence = [_engine_raise(cand, "the engine's own resolution of the candidate")]
        if good.status == "unresolved":
            evidence.append(
                Evidence(role="note", note=f"the known-good's did not run here: {good.reason}")
            )
        reason = f"the engine's own argument resolution refuses the command: {raised.describe()}"
        return [
            f.model_copy(
                update={
                    "outcome": Outcome.FAILS,
                    "reason": reason,
                    "evidence": [*evidence, *f.evidence],
                }
            )
            for f in findings
        ]
    if cand.raised is not None and cand.raised.file:
        raised, where = cand.raised, cand.raised.where
        confirmed = _engine_raise(cand, "the engine's own resolution of the candidate raises here")
        return [
            f.model_copy(
                update={
                    "outcome": Outcome.FAILS,
                    "unless_raised": None,
                    "reason": f"the engine's own argument resolution raises where the source"
                    f" analysis could not rule it out: {raised.describe()}",
                    "evidence": [confirmed, *f.evidence],
                }
            )
            if f.outcome == Outcome.UNKNOWN
            and f.unless_raised is not None
            and f.cites(where)
            and (good.raised is None or good.raised.where != where)
            else f
            for f in findings
        ]
    if good.raised is None and good.complete and cand.complete and good.settings == cand.settings:
        note = Evidence(
            role="note",
            note=f"the engine resolves both commands to the same settings ({cand.facts})",
        )
        reason = "the engine's own resolution gives the same settings with and without it"
        return [
            f.model_copy(
                update={"outcome": Outcome.NO_OP, "reason": reason, "evidence": [note, *f.evidence]}
            )
            if f.outcome in (Outcome.ACTIVE, Outcome.UNKNOWN)
            else f
            for f in findings
        ]
    if good.record and good.runs_as() == cand.runs_as():
        return [_same_config(f, cand) for f in findings]
    if cand.status == "resolved" and cand.complete:
        ran = Evidence(
            role="note",
            note=f"the engine's own resolution of the candidate runs through ({cand.facts})",
        )
        findings = [
            f.model_copy(
                update={
                    "outcome": f.unless_raised,
                    "unless_raised": None,
                    "reason": f"{f.reason}; ruled out by the engine's own resolution, which"
                    " runs through with this command",
                    "evidence": [ran, *f.evidence],
                }
            )
            if f.outcome == Outcome.UNKNOWN and f.unless_raised is not None
            else f
            for f in findings
        ]
        if good.raised is None and good.complete:
            findings = [_moves_only_itself(f, good, cand) for f in findings]
    return findings


def _engine_raise(cand: Resolution, note: str) -> Evidence:
    """The candidate's raise in its own resolution, as evidence (`note`, then the facts)."""
    raised = cand.raised
    assert raised is not None
    return Evidence(
        role="raise",
        file=raised.file,
        line=raised.line,
        code=f"{raised.type}: {raised.message.strip().splitlines()[0]}"[:300],
        note=f"{note} ({cand.facts})",
    )
