"""The source gate analysis as a preflight step: which host, which edits, which tp."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from flagtrial.engines import ENGINES, GATED
from flagtrial.gates.analyze import analyze_change
from flagtrial.gates.model import GateFinding, GateHost, Outcome
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
    if declared.compute_cap:
        return GateHost.sm(declared.compute_cap.replace(".", ""), cuda=declared.cuda,
                           gpus=declared.count)  # fmt: skip
    return None


async def analyze(
    engine: str,
    version: str | None,
    change: Change,
    candidate: LaunchSpec,
    host: GateHost | None,
    model: dict[str, Any] | None = None,
) -> list[GateFinding]:
    """Findings for every add/set edit, judged within the whole candidate command (and the
    model's config.json when given); [] where the analysis does not apply. Runs in a
    thread: the index may take seconds to build the first time for a version."""
    edits = [(e.name, e.value) for e in change.edits if e.op in ("add", "set")]
    if engine not in GATED or not version or host is None or not edits:
        return []
    tp = tensor_parallel(candidate.argv, engine)
    return await asyncio.to_thread(
        partial(analyze_change, command=candidate.argv, model=model),
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
