"""The source gate analysis inside a trial, on the SGLang stand-in with the real wheels: the
seed's flag FAILS AT STARTUP on SM120 with sglang 0.5.23 (the trial stops before deploying
unless forced) and is a NO-OP ON THIS HARDWARE with 0.5.10 (cited in the REVERT)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from flagtrial.demo import free_port
from flagtrial.errors import GateError
from flagtrial.launch.change import Change, Edit
from flagtrial.ledger import Ledger
from flagtrial.reasons import Code
from flagtrial.targets.process import ProcessTarget
from flagtrial.trial import Trial, TrialOutcome
from harness.cli import cli
from harness.project import update_project_file
from harness.session import session_for
from harness.standin import write_project
from harness.wheels import SGLANG, SGLANG_OLD, engine_site

pytestmark = pytest.mark.slow

ARGS = ["--model-path", "/models/Qwen3.5-122B-A10B", "--tp-size", "4",
        "--max-running-requests", "48", "--host", "127.0.0.1"]  # fmt: skip
ENV = {"FLAGTRIAL_STANDIN_GPU": "sm120:96", "FLAGTRIAL_STANDIN_TOKEN_DELAY_S": "0.01"}
# nvidia-smi cannot be read here: the project declares the GPU the stand-in pretends to be
DECLARED = '[gpu]\ncompute_cap = "12.0"\ncount = 4\ncuda = "12.8"\n'
FUSION = Change(edits=[Edit(op="add", name="--enable-flashinfer-allreduce-fusion")])


def project_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: tuple[str, str]) -> Path:
    monkeypatch.setenv("PYTHONPATH", str(engine_site(*release)))
    path = write_project(tmp_path, "sglang", [*ARGS, "--port", str(free_port())], ENV)
    return update_project_file(path, DECLARED)


def trial(project: Path, force: bool = False) -> TrialOutcome:
    session = session_for(project)
    target = session.target
    assert isinstance(target, ProcessTarget)

    async def run() -> TrialOutcome:
        try:
            return await Trial(session, FUSION, force=force).run()
        finally:
            await target.stop()

    return asyncio.run(run())


def test_fails_at_startup_stops_before_deploying(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    project = project_for(tmp_path, monkeypatch, SGLANG)
    unit = project.parent / "sglang.service"
    before = unit.read_text()
    with pytest.raises(GateError, match=r"fails at startup on this GPU per sglang 0\.5\.23"):
        trial(project)
    assert unit.read_text() == before
    ledger = Ledger(project.parent / ".flagtrial" / "ledger.db")
    row = ledger.trials()[0]
    assert row.state == "aborted"
    # not even the known-good was restarted for it
    assert "restarting" not in [e.state for e in ledger.events(row.id)]
    # preflight says the same, with the evidence chain, and fails (exit 4)
    result = cli(project, "preflight", "--add", "--enable-flashinfer-allreduce-fusion")
    assert result.returncode == 4, result.stdout + result.stderr
    assert "FAILS AT STARTUP" in result.stdout
    assert "sglang/srt/layers/flashinfer_comm_fusion.py:49" in result.stdout


def test_forced_deploy_crashes_and_reverts_citing_the_source(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    outcome = trial(project_for(tmp_path, monkeypatch, SGLANG), force=True)
    assert outcome.verdict.decision == "REVERT"
    crashed = outcome.verdict.reasons[0]
    assert crashed.code == Code.CANDIDATE_NOT_READY
    assert str(crashed.values["error"]).startswith("server crashed at start")
    gate = outcome.verdict.first({Code.SOURCE_GATE})
    assert gate is not None
    assert (gate.values["flag"], gate.values["setting"], gate.values["outcome"]) == (
        "--enable-flashinfer-allreduce-fusion",
        "--enable-flashinfer-allreduce-fusion",
        "FAILS AT STARTUP",
    )


def test_seed_version_reads_as_a_no_op_in_the_revert(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    outcome = trial(project_for(tmp_path, monkeypatch, SGLANG_OLD))
    assert outcome.verdict.decision == "REVERT"
    assert outcome.verdict.first({Code.CAPACITY}) is not None
    gate = outcome.verdict.first({Code.SOURCE_GATE})
    assert gate is not None
    assert (gate.values["setting"], gate.values["outcome"]) == (
        "--enable-flashinfer-allreduce-fusion",
        "NO-OP ON THIS HARDWARE",
    )
