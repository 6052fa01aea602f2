"""Engine `sglang` against a real SGLang 0.5.23 server on CPU
(tests/harness/sglang_fixtures.py): its version, its flags from its own parser, its facts as
the server reports them, the concurrency its scheduler admits, an attribution by the engine's
own resolution of a start it refuses, and a trial that loses capacity, all on one server the
module shares. Nothing here rests on a measured difference (that trial is in
test_sglang_measured.py), so the module shares the machine (harness/machine.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from flagtrial import sourceread
from flagtrial.engines import promtext
from flagtrial.engines.pyengine import installed_version, parser_table, read_table
from flagtrial.engines.resolve import compare, resolve_specs
from flagtrial.engines.sglang import PARSER, parse_startup_log
from flagtrial.load.prompts import build_prompt
from flagtrial.load.workload import Workload
from flagtrial.settings import load_project
from flagtrial.targets import make_target
from flagtrial.targets.process import ProcessTarget
from harness import procs
from harness.cli import cli
from harness.sglang_fixtures import KV_TOKENS, SglangServer, SglangTrials

pytestmark = pytest.mark.shares_machine


def host(tmp_path: Path) -> ProcessTarget:
    (tmp_path / "unit.service").write_text("[Service]\nExecStart=/bin/true\n")
    return ProcessTarget(tmp_path / "unit.service", tmp_path / "state")


def test_version_and_flags_from_the_installed_module(
    sglang_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLAGTRIAL_CACHE", str(tmp_path / "cache"))
    target = host(tmp_path)
    found = asyncio.run(installed_version(target, "sglang", str(sglang_bin)))
    assert (found.version, found.build, found.imports) == ("0.5.23", "sglang 0.5.23", True)
    _, table = asyncio.run(read_table(target, "sglang", str(sglang_bin), PARSER))
    assert table["read_from"] == "the engine's own parser"
    by_name = {n: f for f in table["flags"] for n in f["names"]}
    assert by_name["--max-running-requests"]["type"] == "int"
    # The source still names where a parser flag is declared and what resolves it.
    assert by_name["--max-running-requests"]["where"].startswith("srt/arg_groups/fields/")
    assert "max_running_requests" in table["resolvers"]
    # SGLang's DeprecatedStoreTrueAction keeps its replacement.
    assert by_name["--disable-cuda-graph"]["deprecated"] == (
        "--cuda-graph-backend-{decode,prefill}=disabled"
    )


def _by_name(flags: list[dict]) -> dict[str, dict]:
    return {n: f for f in flags if not f.get("positional") for n in f["names"]}


def _choices(spec: dict) -> list[str] | None:
    return None if spec["choices"] is None else sorted(map(str, spec["choices"]))


def test_static_reader_matches_the_real_parser(sglang_bin: Path, tmp_path: Path) -> None:
    """The static reader against SGLang 0.5.23's own parser, flag by flag: any difference is
    a bug in the reader."""
    target = host(tmp_path)
    real = asyncio.run(parser_table(target, str(sglang_bin), PARSER))
    reader = sourceread.program()
    rc, out = asyncio.run(target.run([str(sglang_bin), "-c", reader, "sglang"], timeout_s=120.0))
    static = json.loads(out.strip().splitlines()[-1])
    assert rc == 0, static
    by_real, by_static = _by_name(real["flags"]), _by_name(static["flags"])
    assert sorted(by_real) == sorted(by_static)
    assert len({id(f) for f in by_real.values()}) > 500
    differences = []
    for name, r in by_real.items():
        s = by_static[name]
        for key in ("names", "negative", "action", "type", "nargs", "deprecated"):
            if key == "type" and r["nargs"] == 0:
                continue  # a switch takes no value
            if (sorted(r[key]) if key in ("names", "negative") else r[key]) != (
                sorted(s[key]) if key in ("names", "negative") else s[key]
            ):
                differences.append((name, key, r[key], s[key]))
        if _choices(r) != _choices(s) and not (s["choices"] is None and "choices_unresolved" in s):
            differences.append((name, "choices", _choices(r), _choices(s)))
    assert differences == []


def test_real_server_facts(sglang_server: SglangServer) -> None:
    facts = sglang_server.facts()
    assert facts.version == "0.5.23"
    assert facts.capacity["kv_tokens"] == KV_TOKENS
    assert facts.capacity["context_per_request"] == 2048  # the model's max_position_embeddings
    assert facts.capacity["concurrent_requests"] == 8
    assert facts.sources["concurrent_requests"] == (
        "bound by max_running_requests = 8 (GET /server_info "
        "internal_states[].effective_max_running_requests_per_dp, summed over 1 DP rank(s))"
    )
    # Resolved by SGLang on this CPU, not asked for: the fallback it logs.
    assert facts.settings["device"] == "cpu"
    assert facts.settings["attention_backend"] == "torch_native"
    assert facts.settings["override: The current platform does not support Intel AMX"] == (
        "The current platform does not support Intel AMX, will fallback to torch_native backend."
    )
    # The scheduler's startup line says the same as /server_info.
    numbers, _, _ = parse_startup_log(sglang_server.log())
    assert (numbers["tokens"], numbers["running"], numbers["context"]) == (KV_TOKENS, 8, 2048)
    assert any("max_total_num_tokens=2048, " in line for line in facts.log_lines)
    # A seed drawn at each start is not a setting, and nothing volatile is: two reads agree.
    assert "random_seed" not in facts.settings
    assert facts.settings == sglang_server.facts().settings


async def _flood(url: str, workload: Workload, n: int) -> tuple[float, float]:
    """n of the workload's requests at once; (peak running, peak queued) from /metrics."""
    peaks = [0.0, 0.0]
    done = asyncio.Event()
    async with httpx.AsyncClient(timeout=600.0) as client:
        model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]

        async def sample() -> None:
            while not done.is_set():
                metrics = promtext.parse((await client.get(f"{url}/metrics")).text)
                for i, name in enumerate(("sglang:num_running_reqs", "sglang:num_queue_reqs")):
                    found = promtext.first(metrics, name)
                    peaks[i] = max(peaks[i], found.value if found else 0.0)
                await asyncio.sleep(0.05)

        def body(i: int) -> dict:
            prompt = build_prompt(i, workload.prompt_words)
            return {"model": model, "prompt": prompt, "max_tokens": workload.max_tokens,
                    "ignore_eos": True, "temperature": 0}  # fmt: skip

        sampler = asyncio.create_task(sample())
        replies = await asyncio.gather(
            *(client.post(f"{url}/v1/completions", json=body(i)) for i in range(n))
        )
        done.set()
        await sampler
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    assert all(r.json()["usage"]["completion_tokens"] == workload.max_tokens for r in replies)
    return peaks[0], peaks[1]


def test_the_resolution_before_the_restart_is_what_the_server_reports(
    sglang_server: SglangServer,
) -> None:
    """The engine's own resolution of the server's command (engines/resolve.py, on this
    host's own platform: nothing declared, nothing patched) against the running server's
    /server_info."""
    spec = asyncio.run(sglang_server.target.read_spec())
    (predicted,) = asyncio.run(resolve_specs(sglang_server.target, "sglang", [spec], None))
    assert predicted.status == "resolved", predicted
    assert predicted.patched == [] and predicted.stood_in == []
    same, differ = compare(predicted, sglang_server.facts())
    assert differ == [], differ
    assert same > 400  # the whole resolved record, as the server reports it


def test_short_requests_run_at_most_max_running_requests(sglang_server: SglangServer) -> None:
    workload = Workload(prompt_words=4, max_tokens=128)
    facts = sglang_server.facts(workload)
    limits = {limit.name: limit for limit in facts.limits}
    assert limits["max_running_requests"].admits == 8
    assert limits["max_total_num_tokens"].admits > 8  # 2048 tokens, ~135 per request
    assert facts.capacity["concurrent_requests"] == 8
    # Three times what it admits: the rest queue, and the running count peaks at the bound.
    running, queued = asyncio.run(_flood(sglang_server.url, workload, 24))
    assert running == facts.capacity["concurrent_requests"]
    assert queued > 0


def test_long_requests_are_bound_by_the_kv_cache(sglang_server: SglangServer) -> None:
    """Requests of ~500 tokens: four fit in 2048 KV tokens, though 8 may run. No log line
    says so; the scheduler's running count shows it."""
    workload = Workload(prompt_words=4, max_tokens=480)
    facts = sglang_server.facts(workload)
    limits = {limit.name: limit for limit in facts.limits}
    assert limits["max_running_requests"].admits == 8
    assert limits["max_total_num_tokens"].admits == 4
    assert facts.capacity["concurrent_requests"] == 4
    assert facts.sources["concurrent_requests"].startswith(
        "bound by max_total_num_tokens = 2048 (GET /server_info "
        "internal_states[].memory_usage.token_capacity, "
    )
    running, queued = asyncio.run(_flood(sglang_server.url, workload, 6))
    assert running == facts.capacity["concurrent_requests"]
    assert queued > 0


@pytest.mark.slow
@pytest.mark.timeout(1200)  # one or two real SGLang starts on CPU, or more
def test_a_start_the_engines_own_resolution_refuses_is_attributed_without_a_restart(
    sglang_trials: SglangTrials,
) -> None:
    """Deterministic inference needs an attention backend the CPU platform does not run:
    SGLang's resolution raises, the forced candidate does not start. Resolved alone on the
    known-good, only that edit raises: harmful, no restart spent (a search by restarts would
    start each edit alone and restore: 3 starts); the other edit is left."""
    out = sglang_trials.attributed_trial(
        "--set", "--watchdog-timeout=400", "--add", "--enable-deterministic-inference",
        "--force",
    )  # fmt: skip
    assert out["verdict"]["decision"] == "REVERT"
    attributed = out["attribution"]
    assert attributed["used"]["restarts"] == 0 and attributed["resolutions"] == 3
    watchdog, deterministic = attributed["edits"]
    assert deterministic["outcome"] == "harmful"
    (said,) = deterministic["evidence"]
    assert said.startswith(
        "fails at startup per the engine's own resolution: ValueError: Currently only "
    ), said
    assert "(sglang/srt/arg_groups/overrides.py:" in said
    assert watchdog["outcome"] == "unresolved"


@pytest.mark.slow
def test_fewer_running_requests_revert_with_the_binding_limit_named(
    sglang_trials: SglangTrials,
) -> None:
    """`flagtrial trial` as a user runs it, on the module's known-good (--max-running-requests
    8, serving or started): the candidate (2) starts, then the restore. Last in the module:
    it stops the server to see every process of it gone."""
    project = sglang_trials.project(policy='runs = 2\ncapacity_guard = "revert"\n')
    unit = sglang_trials.root / "sglang.service"
    before = unit.read_bytes()
    target = make_target(load_project(project))
    try:
        result = cli(project, "trial", "--set", "--max-running-requests=2", "--json", timeout=900)
        assert result.returncode == 10, result.stdout + result.stderr  # REVERT
        outcome = json.loads(result.stdout)
        leader = asyncio.run(target.state()).pid
        members = target.group_members(leader) if leader else []  # type: ignore[attr-defined]
    finally:
        asyncio.run(target.stop())  # type: ignore[attr-defined]
    loss = outcome["verdict"]["reasons"][0]
    assert loss["code"] == "capacity"
    assert {
        k: loss["values"][k] for k in ("name", "before", "after", "pct", "bound_by", "limit")
    } == {
        "name": "concurrent_requests",
        "before": 8,
        "after": 2,
        "pct": -75.0,
        "bound_by": "max_running_requests = 2",
        "limit": 5.0,
    }
    assert outcome["facts_after"]["sources"]["concurrent_requests"].startswith(
        "bound by max_running_requests = 2 (GET /server_info"
    )
    # The workload's requests (16 words + 16 tokens) fit the KV cache many times over.
    kv = {limit["name"]: limit for limit in outcome["facts_after"]["limits"]}
    assert kv["max_total_num_tokens"]["admits"] > 8
    explicit = {c["name"] for c in outcome["diff"]["explicit"]}
    assert "max_running_requests" in explicit
    assert outcome["restore"]["verified"] is True
    assert outcome["restore"]["facts"]["capacity"]["concurrent_requests"] == 8
    assert unit.read_bytes() == before
    # the trial's resolution of the candidate before its restart, as the server then reported
    [confirmed] = [r for r in outcome["verdict"]["reasons"] if r["code"] == "prediction-confirmed"]
    assert confirmed["values"]["settings"] > 400
    assert confirmed["values"]["implicit"] == confirmed["values"]["predicted"]
    shown = cli(project, "show", str(outcome["trial_id"]))
    assert "predicted implicit changes confirmed" in shown.stdout
    # HTTP server, scheduler and detokenizer: all of them gone once the server is stopped.
    assert len(members) >= 3
    assert procs.gone(members)
