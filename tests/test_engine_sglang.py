"""Engine `sglang` against the real sglang 0.5.23 and 0.5.10 wheels: the flag table read from
their parser code, removed and deprecated flags found there, facts from log lines and bodies
shaped like the real ones, and whole trials on a stand-in server driven by those tables."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from flagtrial.demo import free_port
from flagtrial.engines import make_engine
from flagtrial.engines.flag_table import EngineSchema, check_candidate
from flagtrial.engines.pyengine import engine_schema
from flagtrial.engines.sglang import _metric, parse_startup_log, server_args_from_log
from flagtrial.errors import ChangeError, UnknownFlagError
from flagtrial.launch.change import Change, Edit, apply_change
from flagtrial.launch.spec import LaunchSpec
from flagtrial.reasons import Code
from flagtrial.settings import load_project
from flagtrial.sourceread import extract
from flagtrial.targets import make_target
from flagtrial.targets.process import ProcessTarget
from flagtrial.trial import Trial
from harness.session import recorder, session_for
from harness.standin import write_project
from harness.wheels import SGLANG, SGLANG_OLD, engine_site, package_dir

PROGRAM = "python3 -m sglang.launch_server"


@pytest.fixture(scope="module")
def table() -> dict:
    return extract("sglang", package_dir(*SGLANG))


@pytest.fixture(scope="module")
def old_table() -> dict:
    return extract("sglang", package_dir(*SGLANG_OLD))


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ProcessTarget:
    """This machine as the engine's host, with a schema cache of its own."""
    engine_site(*SGLANG), engine_site(*SGLANG_OLD)  # fetched before the cache moves
    monkeypatch.setenv("FLAGTRIAL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "unit.service").write_text("[Service]\nExecStart=/bin/true\n")
    return ProcessTarget(tmp_path / "unit.service", tmp_path / "state")


async def schema_for(
    host: ProcessTarget, monkeypatch: pytest.MonkeyPatch, release: tuple[str, str]
) -> EngineSchema:
    """The schema flagtrial reads on a host where `release` is installed."""
    monkeypatch.setenv("PYTHONPATH", str(engine_site(*release)))
    import sys

    return await engine_schema(host, "sglang", [sys.executable, "-m", "sglang.launch_server"])


def spec(args: str) -> LaunchSpec:
    return LaunchSpec(kind="unit", text=f"[Service]\nExecStart={PROGRAM} {args}\n")


def test_flag_table_of_0_5_23_matches_its_parser(table: dict) -> None:
    flags = table["flags"]
    # docs/engines.md: 531 flags, 559 option strings with aliases.
    assert len(flags) == 531
    assert sum(len(f["names"]) for f in flags) == 559
    by_name = {n: f for f in flags for n in f["names"]}
    tp = by_name["--tensor-parallel-size"]
    assert (tp["names"], tp["type"], tp["where"]) == (
        ["--tp-size", "--tensor-parallel-size"],
        "int",
        "srt/arg_groups/fields/parallel.py:45",
    )
    assert by_name["--mem-fraction-static"]["type"] == "float"
    assert "fa3" in by_name["--attention-backend"]["choices"]
    assert by_name["--model-path"]["required"] is True
    # The hand-registered flags of ServerArgs.add_cli_args are there too.
    assert by_name["--enable-flashinfer-allreduce-fusion"]["where"].startswith(
        "srt/server_args.py:"
    )


def test_flag_table_of_0_5_10(old_table: dict) -> None:
    # docs/engines.md: 0.5.10 had 354 flags, each registered by hand in server_args.py.
    assert len(old_table["flags"]) == 354
    names = {n for f in old_table["flags"] for n in f["names"]}
    assert {"--disable-piecewise-cuda-graph", "--cuda-graph-max-bs"} <= names
    # ServerArgs.from_cli_args copies args.tensor_parallel_size into the field tp_size.
    tp = next(f for f in old_table["flags"] if "--tp-size" in f["names"])
    assert (tp["dest"], tp["settings"]) == ("tensor_parallel_size", ["tp_size"])
    switch = next(f for f in old_table["flags"] if "--disable-piecewise-cuda-graph" in f["names"])
    assert switch["default"] == "False"


def test_deprecated_flags_are_read_from_the_code(table: dict) -> None:
    deprecated = {
        f["names"][0]: f["deprecated"] for f in table["flags"] if f["deprecated"] is not None
    }
    assert deprecated["--enable-flashinfer-allreduce-fusion"] == (
        "--flashinfer-allreduce-fusion-backend=auto"
    )
    assert deprecated["--grpc-mode"] == "--smg-grpc-mode"
    assert deprecated["--disable-cuda-graph"].startswith("--cuda-graph-backend-")
    # Every one of them is declared deprecated at the line the table cites.
    root = package_dir(*SGLANG) / "srt"
    for flag in table["flags"]:
        if flag["deprecated"] is not None:
            path, line = flag["where"].rsplit(":", 1)
            text = (root.parent / path).read_text().splitlines()
            nearby = "\n".join(text[int(line) - 1 : int(line) + 8])
            assert "eprecated" in nearby, flag["names"]


def test_removed_flags_come_from_the_older_table_and_name_the_version(
    host: ProcessTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(schema_for(host, monkeypatch, SGLANG_OLD))  # a host seen on 0.5.10 before
    schema = asyncio.run(schema_for(host, monkeypatch, SGLANG))
    assert schema.program == "sglang 0.5.23"
    assert schema.removed["--disable-piecewise-cuda-graph"] == "sglang 0.5.10"
    change = Change(edits=[Edit(op="add", name="--disable-piecewise-cuda-graph")])
    with pytest.raises(UnknownFlagError) as e:
        apply_change(spec("--model-path /m --tp-size 4"), change, schema)
    assert str(e.value) == (
        "sglang 0.5.23 removed --disable-piecewise-cuda-graph (sglang 0.5.10 had it)"
    )
    # A known-good spec that still carries a removed flag fails the same way.
    with pytest.raises(UnknownFlagError, match="now names --cuda-graph-max-bs-decode"):
        apply_change(
            spec("--model-path /m --cuda-graph-max-bs 256"),
            Change(edits=[Edit(op="set", name="--tp-size", value="4")]),
            schema,
        )


def test_schema_is_cached_per_version(host: ProcessTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    asyncio.run(schema_for(host, monkeypatch, SGLANG))
    cached = list((Path(host.state_dir).parent / "cache" / "schemas").glob("sglang-0.5.23-*.json"))
    assert len(cached) == 1
    assert json.loads(cached[0].read_text())["version"] == "0.5.23"


def test_abbreviations_types_choices_and_deprecations(
    host: ProcessTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = asyncio.run(schema_for(host, monkeypatch, SGLANG))
    base = spec("--model-path /m --tp-size 4 --mem-fraction-static 0.68")
    # argparse's allow_abbrev: a unique prefix is written as the full flag.
    out = apply_change(
        base,
        Change(
            edits=[
                Edit(op="set", name="--mem-frac", value="0.7"),
                Edit(op="add", name="--enable-fused-moe"),
            ]
        ),
        schema,
    )
    assert out.argv[3:] == [
        "--model-path",
        "/m",
        "--tp-size",
        "4",
        "--mem-fraction-static",
        "0.7",
        "--enable-fused-moe-sum-all-reduce",
    ]
    with pytest.raises(UnknownFlagError, match="ambiguous flag --cuda-graph-max-bs-"):
        schema.resolve("--cuda-graph-max-bs-")
    with pytest.raises(ChangeError, match="--attention-backend fa9: not one of"):
        apply_change(
            base, Change(edits=[Edit(op="add", name="--attention-backend", value="fa9")]), schema
        )
    with pytest.raises(ChangeError, match=r"sglang 0.5.23 rejects .*invalid int value: 'four'"):
        schema.check_argv(["--model-path", "/m", "--tp-size", "four"])
    with pytest.raises(ChangeError, match="required: --model-path"):
        schema.check_argv(["--tp-size", "4"])
    assert check_candidate(schema, out) == []
    deprecated = apply_change(
        base, Change(edits=[Edit(op="add", name="--enable-flashinfer-allreduce-fusion")]), schema
    )
    assert check_candidate(schema, deprecated) == [
        "--enable-flashinfer-allreduce-fusion is deprecated in sglang 0.5.23; "
        "use --flashinfer-allreduce-fusion-backend=auto"
    ]
    assert schema.settings_for("--enable-flashinfer-allreduce-fusion") == {
        "enable_flashinfer_allreduce_fusion",
        "flashinfer_allreduce_fusion_backend",
    }


# Log lines exactly as SGLang formats them (srt/utils/common.py:2630 `[%(asctime)s{prefix}]`).
LOG_0_5_23 = """\
[2026-01-05 10:00:01] server_args={'model_path': '/m', 'tp_size': 4, 'mem_fraction_static': 0.68, 'cuda_graph_config': CudaGraphConfig(decode=None), 'max_running_requests': None}
[2026-01-05 10:00:40 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 75423, K size: 0.86 GB, V size: 0.86 GB
[2026-01-05 10:00:52 TP0] Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 16], elapsed=11.52 s, mem usage=1.00 GB, avail mem=30.72 GB.
[2026-01-05 10:00:53 TP0] Post-capture KV sizing: max_running_requests 48 -> 40
[2026-01-05 10:00:53 TP0] Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 70000, KV size: 1.60 GB, avail mem=30.00 GB
[2026-01-05 10:00:53 TP0] max_total_num_tokens=70000, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=40, context_len=262144, available_gpu_mem=30.72 GB
[2026-01-05 10:01:05] The server is fired up and ready to roll!
"""  # noqa: E501
# srt/entrypoints/engine.py:311; srt/mem_cache/memory_pool.py:2088;
# model_executor/model_runner_components/cuda_graph_setup.py:788;
# model_executor/model_runner_components/kv_pool_runtime.py:171 and :195;
# srt/managers/scheduler.py:1269; srt/entrypoints/http_server.py:2600.

LOG_0_5_10 = """\
[2025-10-01 09:00:00] server_args=ServerArgs(model_path='/m', tp_size=4, mem_fraction_static=0.68, max_running_requests=48, disable_piecewise_cuda_graph=False)
[2025-10-01 09:00:30 TP0] KV Cache is allocated. #tokens: 75423, K size: 0.86 GB, V size: 0.86 GB
[2025-10-01 09:00:31 TP0] Capture cuda graph bs [1, 2, 4, 8]
[2025-10-01 09:00:40 TP0] max_total_num_tokens=75423, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=48, context_len=262144, available_gpu_mem=30.72 GB
"""  # noqa: E501
# 0.5.10: srt/entrypoints/engine.py:181; srt/mem_cache/memory_pool.py:696;
# model_executor/cuda_graph_runner.py:570; srt/managers/scheduler.py:691.


def test_startup_log_of_each_version() -> None:
    numbers, settings, lines = parse_startup_log(LOG_0_5_23)
    assert numbers == {"kv_pool_tokens": 70000, "tokens": 70000, "running": 40, "context": 262144}
    assert settings["cuda_graph_bs_target_decode"] == "[1, 2, 4, 8, 16]"
    assert settings["kv_cache_dtype_resolved"] == "torch.bfloat16"
    assert len(lines) == 5
    dump = server_args_from_log(LOG_0_5_23, "0.5.23")
    assert dump["mem_fraction_static"] == 0.68
    assert dump["cuda_graph_config"] == "CudaGraphConfig(decode=None)"
    assert dump["max_running_requests"] is None

    numbers, settings, _ = parse_startup_log(LOG_0_5_10)
    assert numbers["running"] == 48 and numbers["kv_pool_tokens"] == 75423
    assert settings["cuda_graph_bs_decode"] == "[1, 2, 4, 8]"
    assert server_args_from_log(LOG_0_5_10, "0.5.10")["disable_piecewise_cuda_graph"] is False


def test_crash_reasons() -> None:
    engine = make_engine("sglang")
    argparse_error = (
        "usage: launch_server.py [-h] --model-path MODEL_PATH\n"
        "launch_server.py: error: unrecognized arguments: --disable-piecewise-cuda-graph\n"
    )
    assert engine.crash_reason(argparse_error) == (
        "launch_server.py: error: unrecognized arguments: --disable-piecewise-cuda-graph"
    )
    traceback = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.\n"
    )
    assert engine.crash_reason(traceback).startswith("ValueError: FlashInfer allreduce")


# ---------------------------------------------------------------------------------------------
# Whole trials on the stand-in.

SEED_ARGS = [
    "--model-path",
    "/models/Qwen3.5-122B-A10B",
    "--tp-size",
    "4",
    "--mem-fraction-static",
    "0.68",
    "--max-running-requests",
    "48",
    "--host",
    "127.0.0.1",
]
SEED_CHANGE = Change(
    edits=[
        Edit(op="add", name="--enable-fused-moe-sum-all-reduce"),
        Edit(op="add", name="--enable-flashinfer-allreduce-fusion"),
    ]
)
STANDIN_ENV = {"FLAGTRIAL_STANDIN_GPU": "sm120:96", "FLAGTRIAL_STANDIN_TOKEN_DELAY_S": "0.01"}


def run_trial(project_file: Path, change: Change) -> tuple[object, list[tuple[str, str]]]:
    events: list[tuple[str, str]] = []
    session = session_for(project_file, recorder(events))
    target = session.target
    assert isinstance(target, ProcessTarget)
    try:
        outcome = asyncio.run(Trial(session, change).run())
    finally:
        asyncio.run(target.stop())
    return outcome, events


@pytest.fixture
def seed_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def make(release: tuple[str, str]) -> Path:
        monkeypatch.setenv("PYTHONPATH", str(engine_site(*release)))
        monkeypatch.setenv("FLAGTRIAL_CACHE", str(tmp_path / "cache"))
        args = [*SEED_ARGS, "--port", str(free_port()), "--enable-metrics"]
        return write_project(tmp_path, "sglang", args, STANDIN_ENV)

    return make


@pytest.mark.slow
def test_seed_on_0_5_10_reverts_on_the_capacity_loss(seed_project) -> None:
    project = seed_project(SGLANG_OLD)
    unit = project.parent / "sglang.service"
    before = unit.read_text()
    outcome, events = run_trial(project, SEED_CHANGE)
    assert outcome.verdict.decision == "REVERT"
    assert outcome.facts_before.capacity["concurrent_requests"] == 48
    assert outcome.facts_after.capacity["concurrent_requests"] == 26
    # -45.8 %: the seed's 48 -> 26, a 46 % capacity loss, and no throughput gain.
    loss = outcome.verdict.first({Code.CAPACITY})
    assert loss is not None
    assert (loss.values["name"], loss.values["before"], loss.values["after"]) == (
        "concurrent_requests",
        48,
        26,
    )
    assert round(loss.values["pct"], 1) == -45.8
    # no gain either way: equal work on the stand-in reads as no gain (or, on a noisy run,
    # as a loss); never as a gain that could pay for the capacity
    assert outcome.verdict.reasons[0].code in (Code.COST_WITHOUT_GAIN, Code.HARM)
    assert outcome.facts_after.version == "0.5.10"
    assert "concurrent_requests" in outcome.facts_after.sources
    # The KV pool shrank too, an implicit change the change never named.
    implicit = {c.name for c in outcome.diff.implicit}
    assert "max_req_input_len" in implicit
    assert outcome.restore is not None and outcome.restore.verified
    assert unit.read_text() == before
    assert (
        "facts",
        outcome.diff and "; ".join(c.describe() for c in outcome.diff.capacity),
    ) in events


@pytest.mark.slow
def test_same_change_on_0_5_23_crashes_at_start_on_sm120(seed_project) -> None:
    project = seed_project(SGLANG)
    outcome, _ = run_trial(project, SEED_CHANGE)
    assert outcome.verdict.decision == "REVERT"
    crashed = outcome.verdict.reasons[0]
    assert crashed.code == Code.CANDIDATE_NOT_READY
    assert crashed.values["error"] == (
        "server crashed at start (exit 1): ValueError: FlashInfer allreduce fusion requires "
        "SM90 or SM10X NVIDIA GPUs."
    )
    assert outcome.restore is not None and outcome.restore.verified


def test_standin_rejects_a_removed_flag_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import subprocess
    import sys

    monkeypatch.setenv("PYTHONPATH", str(engine_site(*SGLANG)))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flagtrial.standin.sglang",
            "--model-path",
            "/m",
            "--disable-piecewise-cuda-graph",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "error: unrecognized arguments: --disable-piecewise-cuda-graph" in done.stderr


@pytest.mark.slow
def test_facts_from_a_0_5_23_server(seed_project) -> None:
    project_file = seed_project(SGLANG)
    project = load_project(project_file)
    target = make_target(project)
    engine = make_engine("sglang")

    async def read() -> object:
        # Reading the flags caches the table, whose resolvers explain resolved values.
        await engine.flag_schema(target, (await target.read_spec()).program)
        mark = await target.restart()
        from flagtrial.engines.base import wait_ready

        await wait_ready(engine, target, project.endpoint, mark, 30)
        async with httpx.AsyncClient() as client:
            metrics = await _metric(client, project.endpoint, "sglang:max_total_num_tokens")
            return await engine.facts(
                client, project.endpoint, await target.logs_since(mark)
            ), metrics

    try:
        facts, metrics = asyncio.run(read())
    finally:
        asyncio.run(target.stop())
    assert facts.version == "0.5.23"
    assert facts.capacity == {
        "concurrent_requests": 48.0,
        "kv_tokens": 75423.0,
        "context_per_request": 262144.0,
    }
    assert facts.settings["max_req_input_len"] == 75417
    assert facts.settings["tp_size"] == 4
    # The resolvers SGLang 0.5.23 records behind a resolved value (declare_resolution).
    assert facts.sources["chunked_prefill_size"].startswith(
        "resolved by _handle_multi_item_scoring (srt/arg_groups/attention_hook.py:566); "
        "_handle_gpu_memory_settings (srt/arg_groups/memory_hook.py:174, 94, 108"
    )
    assert metrics == 75423  # what facts fall back on when /server_info is not served
