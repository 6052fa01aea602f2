"""The source gate analysis inside a trial, on the SGLang stand-in with the real wheels: the
seed's flag FAILS AT STARTUP on SM120 with sglang 0.5.23 (the trial stops before deploying
unless forced) and is a NO-OP ON THIS HARDWARE with 0.5.10 (cited in the REVERT); and the
engine's own resolution, run by the trial, held against what the candidate reports."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

import flagtrial
from flagtrial.demo import free_port
from flagtrial.engines.resolve import SHOWN_MISMATCHES
from flagtrial.errors import GateError
from flagtrial.facts import Facts
from flagtrial.fleet.promote import Differences
from flagtrial.launch.change import Change, Edit
from flagtrial.ledger import Ledger
from flagtrial.preflight import GateReport
from flagtrial.reasons import Code
from flagtrial.targets.process import ProcessTarget
from flagtrial.trial import Trial, TrialOutcome
from harness.cli import cli
from harness.project import update_project_file
from harness.session import recorder, session_for
from harness.sglang_fixtures import sglang_bin, sglang_model  # noqa: F401
from harness.standin import write_project
from harness.wheels import SGLANG, SGLANG_OLD, engine_site

# The gates corpus' model configs (config.json only: what the resolution reads of a model).
CORPUS_MODELS = Path(__file__).resolve().parent.parent / "benchmarks/gates/corpus/models"

# What it asserts rests on the server's facts, crashes, bounds and files, never on a
# measured difference: may run beside another module (harness/machine.py).
pytestmark = [pytest.mark.slow, pytest.mark.shares_machine]

ARGS = ["--model-path", "/models/Qwen3.5-122B-A10B", "--tp-size", "4",
        "--max-running-requests", "48", "--host", "127.0.0.1"]  # fmt: skip
ENV = {"FLAGTRIAL_STANDIN_GPU": "sm120:96", "FLAGTRIAL_STANDIN_TOKEN_DELAY_S": "0.01"}
# nvidia-smi cannot be read here: the project declares the GPU the stand-in pretends to be
DECLARED = '[gpu]\ncompute_cap = "12.0"\ncount = 4\ncuda = "12.8"\n'
FUSION = Change(edits=[Edit(op="add", name="--enable-flashinfer-allreduce-fusion")])


def project_for(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    release: tuple[str, str],
    env: dict[str, str] = ENV,
) -> Path:
    monkeypatch.setenv("PYTHONPATH", str(engine_site(*release)))
    path = write_project(tmp_path, "sglang", [*ARGS, "--port", str(free_port())], env)
    return update_project_file(path, DECLARED)


def trial(project: Path, force: bool = False, change: Change = FUSION) -> TrialOutcome:
    session = session_for(project)
    target = session.target
    assert isinstance(target, ProcessTarget)

    async def run() -> TrialOutcome:
        try:
            return await Trial(session, change, force=force).run()
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


def real_resolution_project(root: Path, python: Path, model: Path, cap: str) -> Path:
    """The stand-in served by the real SGLang's interpreter, so the trial's resolution is the
    real one (SGLang 0.5.23, the declared GPU answering the platform query)."""
    src = Path(flagtrial.__file__).parents[1]
    args = ["--model-path", str(model), "--host", "127.0.0.1", "--port", str(free_port()),
            "--max-running-requests", "8"]  # fmt: skip
    env = {"FLAGTRIAL_STANDIN_GPU": f"sm{cap.replace('.', '')}:80",
           "FLAGTRIAL_STANDIN_TOKEN_DELAY_S": "0.01", "PYTHONPATH": str(src),
           "HF_HUB_OFFLINE": "1"}  # fmt: skip
    project = write_project(
        root, "sglang", args, env, policy="runs = 2\nmax_runs = 4\n",
        program=[str(python), "-m", "flagtrial.standin.sglang"],
    )  # fmt: skip
    return update_project_file(project, f'[gpu]\ncompute_cap = "{cap}"\ncuda = "12.8"\n')


def test_the_engines_own_resolution_refuses_before_any_restart(
    tmp_path: Path,
    sglang_bin: Path,  # noqa: F811
    sglang_model: Path,  # noqa: F811
) -> None:
    project = real_resolution_project(tmp_path, sglang_bin, sglang_model, "9.0")
    nvfp4 = Change(edits=[Edit(op="add", name="--kv-cache-dtype", value="nvfp4")])
    with pytest.raises(GateError) as refused:
        trial(project, change=nvfp4)
    # SGLang 0.5.23 srt/arg_groups/kv_cache_hook.py handle_kv4_compatibility, on SM90
    assert str(refused.value).startswith(
        "--kv-cache-dtype fails at startup on this GPU per sglang's own argument resolution "
        "(declared SM90, CUDA 12.8, 1 GPU(s)): RuntimeError: --kv-cache-dtype=nvfp4 requires "
        "Blackwell SM100 or SM120"
    )
    assert "(sglang/srt/arg_groups/kv_cache_hook.py:" in str(refused.value)
    ledger = Ledger(project.parent / ".flagtrial" / "ledger.db")
    row = ledger.trials()[0]
    assert row.state == "aborted"
    assert "restarting" not in [e.state for e in ledger.events(row.id)]
    assert row.record["resolution"]["candidate"].startswith("FAILS AT STARTUP: RuntimeError")


def test_the_candidate_is_held_against_the_engines_own_resolution(
    tmp_path: Path,
    sglang_bin: Path,  # noqa: F811
    sglang_model: Path,  # noqa: F811
) -> None:
    """After the candidate's restart its report is held against the prediction: the
    stand-in, which resolves only the few settings that decide capacity, differs from the
    engine on others."""
    project = real_resolution_project(tmp_path, sglang_bin, sglang_model, "10.0")
    change = Change(edits=[Edit(op="set", name="--max-running-requests", value="2")])
    outcome = trial(project, change=change)
    missed = outcome.verdict.first({Code.PREDICTION_MISSED})
    assert missed is not None, outcome.verdict.reasons
    assert outcome.verdict.first({Code.PREDICTION_CONFIRMED}) is None
    row = Ledger(project.parent / ".flagtrial" / "ledger.db").trials()[0]
    checked = row.record["prediction"]
    assert len(checked["mismatches"]) > SHOWN_MISMATCHES  # the stand-in resolves few
    assert missed.values["count"] == len(checked["mismatches"])
    assert missed.values["compared"] == checked["settings"] + len(checked["mismatches"])
    # the verdict shows the first few, the record all of them
    assert missed.values["mismatches"].startswith("; ".join(checked["mismatches"][:2]))
    assert missed.message.endswith(f"and {len(checked['mismatches']) - SHOWN_MISMATCHES} more")
    # the setting the change names, reported as the engine resolves it
    assert checked["settings"] > 0
    assert not any(m.startswith("max_running_requests:") for m in checked["mismatches"])
    assert row.record["resolution"]["candidate"].startswith("resolved")
    assert all(": predicted " in m and ", the server reports " in m for m in checked["mismatches"])


def test_the_models_config_on_the_host_decides_what_the_analysis_follows(
    tmp_path: Path,
    sglang_bin: Path,  # noqa: F811
) -> None:
    """The model's config.json, read on the host by the engine's own resolution, goes to the
    source analysis: `--attention-backend fa3` on SM80 fails at startup for an MLA model
    (sglang 0.5.23 layers/attention/attention_registry.py: FA3 on SM8x for non-MLA models
    only), so the trial stops before any restart; the same flag for a dense Llama in the
    same folder acts. Without the model both would read as acting."""
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(CORPUS_MODELS / "mla-deepseek.json", model / "config.json")
    project = real_resolution_project(tmp_path, sglang_bin, model, "8.0")
    fa3 = Change(edits=[Edit(op="add", name="--attention-backend", value="fa3")])
    with pytest.raises(GateError) as refused:
        trial(project, change=fa3)
    assert str(refused.value).startswith(
        "--attention-backend fails at startup on this GPU per sglang 0.5.23's source: "
    ), refused.value
    assert "sglang/srt/layers/attention/attention_registry.py:" in str(refused.value)
    ledger = Ledger(project.parent / ".flagtrial" / "ledger.db")
    row = ledger.trials()[0]
    assert "restarting" not in [e.state for e in ledger.events(row.id)]
    assert row.record["resolution"]["model"] == f"DeepseekV3ForCausalLM ({model}/config.json)"

    # the known-good that trial read gives preflight the version; now a dense model there
    shutil.copy(CORPUS_MODELS / "dense-llama.json", model / "config.json")
    done = cli(project, "preflight", "--add=--attention-backend=fa3", "--json", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout)
    assert [g["outcome"] for g in out["gates"]] == ["ACTIVE"]
    read = out["resolution"]["candidate"]["model"]
    assert read["source"] == str(model / "config.json")
    assert read["config"]["architectures"] == ["LlamaForCausalLM"]


def aiter_fusion_gates(project: Path) -> GateReport:
    """Preflight's gate analysis of adding AITER's all-reduce fusion, on sglang 0.5.23."""
    from flagtrial.fleet.promote import host_gates

    session = session_for(project)
    aiter = Change(edits=[Edit(op="add", name="--enable-aiter-allreduce-fusion")])

    async def gates() -> GateReport:
        try:
            return await host_gates(session, SGLANG[1], aiter)
        finally:
            await session.close()

    return asyncio.run(gates())


@pytest.mark.parametrize(
    ("gpu", "described", "outcome"),
    [
        ({"gfx": "gfx942", "rocm": "6.3", "count": 4}, "gfx942, ROCm 6.3, 4 GPU(s)", "ACTIVE"),
        (
            {"compute_cap": "9.0", "count": 4},
            "SM90, CUDA unknown, 4 GPU(s)",
            "NO-OP ON THIS HARDWARE",
        ),
    ],
)
def test_an_amd_host_declared_by_its_gfx_is_analysed_on_rocm(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    gpu: dict[str, object],
    described: str,
    outcome: str,
) -> None:
    """A host whose GPUs nvidia-smi cannot read, an AMD one, declares them by gfx architecture
    and ROCm version, and preflight's analysis runs for that platform: AITER's all-reduce
    fusion acts on gfx942 with AITER on (sglang 0.5.23 layers/layernorm.py:54 `_use_aiter`,
    SGLANG_USE_AITER on a HIP build; its read at :270) and is a no-op on a declared NVIDIA
    SM90, where every read of it is ruled out."""
    project = project_for(tmp_path, monkeypatch, SGLANG, {**ENV, "SGLANG_USE_AITER": "1"})
    # in place of the SM120 project_for declares
    update_project_file(project, gpu={"compute_cap": None, "cuda": None, **gpu})
    (finding,) = aiter_fusion_gates(project).findings
    assert (finding.host, finding.outcome.value) == (described, outcome), finding.reason


def test_the_environment_the_server_starts_with_reaches_the_analysis(
    tmp_path: Path,
    sglang_bin: Path,  # noqa: F811
) -> None:
    """AITER's all-reduce fusion on gfx942 acts only with SGLANG_USE_AITER on (sglang 0.5.23
    layers/layernorm.py:54). The unit sets it on in Environment= and off in an
    EnvironmentFile=, whose value the server starts with (as in systemd): preflight's
    analysis, of a dense Llama read on the host, finds the fusion a no-op. (With it on, the
    fusion acts: tests/test_gates.py.)"""
    in_file, other = "0", "1"
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(CORPUS_MODELS / "dense-llama.json", model / "config.json")
    project = real_resolution_project(tmp_path, sglang_bin, model, "9.0")
    gfx942 = {"compute_cap": None, "cuda": None, "gfx": "gfx942", "rocm": "6.3", "count": 4}
    update_project_file(project, gpu=gfx942)
    env_file = tmp_path / "sglang.env"
    env_file.write_text(f"SGLANG_USE_AITER={in_file}\n")
    unit = project.parent / "sglang.service"
    lines = f"Environment=SGLANG_USE_AITER={other}\nEnvironmentFile={env_file}\nExecStart="
    unit.write_text(unit.read_text().replace("ExecStart=", lines, 1))
    (finding,) = aiter_fusion_gates(project).findings
    assert finding.outcome.value == "NO-OP ON THIS HARDWARE", finding.reason
    notes = {e.note for e in finding.evidence if e.role == "note"}
    assert f"SGLANG_USE_AITER={in_file} in the launch's environment" in notes
    assert f"SGLANG_USE_AITER={other} in the launch's environment" not in notes


def test_the_seed_change_is_attributed_to_the_no_op_that_costs_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed's two flags on SGLang 0.5.10 at SM120: the all-reduce fusion is a NO-OP by
    the source, yet its workspace costs KV memory; a NO-OP is therefore searched like any
    edit, and the facts of each flag alone find it. What is left to try is the seed
    engineer's final state: the fused MoE sum alone."""
    from flagtrial.attribution.attribute import Attribute
    from flagtrial.attribution.fixed import fixed_change

    project = project_for(tmp_path, monkeypatch, SGLANG_OLD)
    update_project_file(project, policy={"capacity_guard": "revert"})
    moe = Edit(op="add", name="--enable-fused-moe-sum-all-reduce")
    outcome = trial(project, change=Change(edits=[moe, FUSION.edits[0]]))
    assert outcome.verdict.decision == "REVERT"
    session = session_for(project)
    target = session.target
    assert isinstance(target, ProcessTarget)

    async def attribute() -> tuple[list[tuple[str, list[str]]], Change]:
        try:
            async with target.lock("test"):
                done = await Attribute(session, outcome.trial_id).run()
                return [(v.outcome, v.evidence) for v in done.edits], await fixed_change(
                    session, outcome.trial_id
                )
        finally:
            await target.stop()

    (moe_found, fusion_found), fixed = asyncio.run(attribute())
    assert fusion_found[0] == "harmful"
    # the stand-in's KV cache, sized as SGLang sizes it, less the fusion's workspace
    kv = "KV cache tokens 459533 -> 424996 (-7.5 %) (a start with only this edit)"
    assert kv in fusion_found[1], fusion_found
    assert any(
        e.startswith("NO-OP ON THIS HARDWARE by the engine's source") for e in fusion_found[1]
    )
    assert moe_found[0] in ("useless", "unresolved")
    assert fixed == Change(edits=[moe])


@pytest.mark.parametrize(
    ("release", "here"), [(SGLANG, "FAILS AT STARTUP"), (SGLANG_OLD, "NO-OP ON THIS HARDWARE")]
)
def test_a_fleet_host_gets_the_gate_analysis_of_its_own_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: tuple[str, str], here: str
) -> None:
    """A fleet's canary on SM90 and a host on SM120 (GPUs declared, as a fleet host's
    flagtrial_gpu var declares them), each analysed as preflight analyses it, on the real
    wheel's source: the seed's flag acts on the canary; the other host is named with its own
    finding, and with 0.5.23, where the flag fails at startup there, skipped (0.5.10: a
    NO-OP there, named only). Each host's session is the stand-in's own (process target)
    in place of its SSH one: what differs is the GPU, not how the host is reached."""
    from flagtrial.fleet.hosts import Fleet
    from flagtrial.fleet.promote import HostRead, name_differences
    from flagtrial.targets.base import HostFacts

    for name in ("sm90", "sm120"):
        (tmp_path / name).mkdir()
    on_sm90 = project_for(tmp_path / "sm90", monkeypatch, release)
    update_project_file(on_sm90, gpu={"compute_cap": "9.0"})
    (tmp_path / "sm90" / "hosts.ini").write_text("[gpus]\nsm90\nsm120\n")
    events: list[tuple[str, str]] = []
    fleet = Fleet.open(
        update_project_file(on_sm90, fleet={"inventory": "hosts.ini"}), "gpus", lambda k, d: None
    )
    fleet.sessions = {
        "sm90": session_for(on_sm90),
        "sm120": session_for(
            project_for(tmp_path / "sm120", monkeypatch, release), recorder(events)
        ),
    }
    facts = Facts(engine="sglang", version=release[1])
    read = {
        name: HostRead(facts, HostFacts(hostname=name, kernel="", cpus=1))
        for name in fleet.sessions
    }

    async def differences() -> Differences:
        try:
            return await name_differences(fleet, FUSION, read)
        finally:
            await fleet.aclose()

    found = asyncio.run(differences())
    assert found.named == {
        "sm120": ["GPUs ['4 x SM 12.0 (declared, CUDA 12.8)'] vs the canary's "
                  "['4 x SM 9.0 (declared, CUDA 12.8)']"]
    }  # fmt: skip
    [line] = found.findings["sm120"]
    assert line.startswith(f"--enable-flashinfer-allreduce-fusion: {here} here (")
    assert line.endswith("), ACTIVE on the canary")
    assert [kind for kind, _ in events][:2] == ["host differs", "gates"]
    if here == "FAILS AT STARTUP":
        assert "flashinfer_comm_fusion.py:49" in line
        refusal = found.skipped["sm120"]
        assert refusal.startswith("--enable-flashinfer-allreduce-fusion fails at startup on this")
        assert events[-1] == ("skipped", f"left on its known-good: {refusal}")
    else:
        assert found.skipped == {}
