"""Preflight as a library call: everything knowable about a change before a deploy. The
candidate checked against the engine's own flags (Session.check_change), the source gate
analysis corrected by the engine's own resolution of both commands (`gates`), and the diff.
`flagtrial preflight` renders a PreflightReport; a trial runs `gates` beside its first
baseline runs and refuses to deploy what it says fails at startup."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from flagtrial.engines import GATED
from flagtrial.engines import resolve as resolving
from flagtrial.gates import preflight as gating
from flagtrial.gates.model import GateFinding
from flagtrial.launch.change import Change
from flagtrial.launch.spec import LaunchSpec
from flagtrial.session import CheckedChange, Session
from flagtrial.targets.base import HostFacts


class GateReport(BaseModel):
    """Will the change act, or fail at startup, on this host: the static findings (corrected
    by the resolution), why there are none, and the engine's own resolution of both commands."""

    findings: list[GateFinding]
    skipped: str | None = None  # why the static analysis did not run
    prediction: resolving.Prediction | None = None

    def refusal(self) -> str | None:
        """Why the candidate fails at startup here, from the engine's own resolution or its
        source; None when neither says so."""
        prediction = self.prediction
        if prediction is not None and prediction.refused:
            raised = prediction.candidate.raised
            assert raised is not None
            flags = ", ".join(dict.fromkeys(f.flag for f in self.findings)) or "the change"
            return (
                f"{flags} fails at startup on this GPU per {prediction.candidate.engine}'s own "
                f"argument resolution ({prediction.candidate.facts}): {raised.describe()}"
            )
        if fails := gating.failing(self.findings):
            first = fails[0]
            return (
                f"{first.flag} fails at startup on this GPU per {first.engine} {first.version}'s "
                f"source: {first.reason}"
            )
        return None

    @property
    def passed(self) -> bool:
        return self.refusal() is None


class PreflightReport(GateReport):
    """What `flagtrial preflight` shows: the change, the engine's notes on the candidate
    (deprecations and the like: not fatal), the gates, the spec diff (secrets redacted)."""

    change: Change
    notes: list[str]
    diff: str


async def gates(
    session: Session,
    version: str | None,
    change: Change,
    known_good: LaunchSpec,
    checked: CheckedChange,
    host: HostFacts,
) -> GateReport:
    """The source gate analysis of the change for engine `version` on `host`, and the
    engine's own resolution of known-good and candidate (SGLang, vLLM), which corrects it,
    with the settings it moves on its own analysed in turn (gates/implied.py)."""
    engine, declared = session.engine.name, session.project.gpu
    gate_host = gating.gate_host(host, declared)
    # The resolution first: it reads the model's config.json on the host, which decides what
    # of the engine's code the model builds (its architectures, MLA, MoE, quantization).
    prediction = await resolving.predict(
        session.target,
        engine,
        known_good,
        checked.candidate,
        resolving.declared_facts(host, declared),
        checked.named_settings,
    )
    model = prediction.model.config if prediction is not None and prediction.model else None
    env = await session.target.environment(checked.candidate) if engine in GATED else {}
    findings = await gating.analyze(
        engine, version, change, checked.candidate, gate_host, model, env
    )
    if prediction is not None and gate_host is not None:
        findings = await asyncio.to_thread(
            gating.corrected,
            findings,
            prediction.known_good,
            prediction.candidate,
            gate_host,
            checked.candidate.argv,
            model,
            env,
        )
    skipped = None
    if not findings and engine in GATED:
        skipped = "source gate analysis skipped: " + (
            "no GPU facts for this host ([gpu] in the project file)"
            if gate_host is None
            else "engine version unknown (run `flagtrial facts` once)"
        )
    return GateReport(findings=findings, skipped=skipped, prediction=prediction)


async def preflight(session: Session, change: Change) -> PreflightReport:
    """The change checked against the installed spec and the known-good's engine version;
    deploys nothing and restarts nothing."""
    spec = await session.target.read_spec()
    secrets = session.ledger.secrets
    secrets.learn_spec(spec.text)
    checked = await session.check_change(spec, change)
    good = session.ledger.last_known_good(session.target.name)
    version = (good.facts or {}).get("version") if good else None
    host = await session.target.host_facts()
    report = await gates(session, version, change, spec, checked, host)
    return PreflightReport(
        **dict(report),
        change=change,
        notes=checked.notes,
        diff=secrets.diff(spec.text, checked.candidate.text, "known-good", "candidate"),
    )
