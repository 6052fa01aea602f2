"""Engine `vllm` against the real vllm 0.33.0 wheel: the flag table read from its parser code,
facts from log lines, metrics and bodies shaped like vLLM's, and a whole trial on a stand-in
server driven by that table."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from flagtrial.demo import free_port
from flagtrial.engines import logfacts, promtext
from flagtrial.engines.pyengine import engine_schema
from flagtrial.engines.vllm import parse_startup_log
from flagtrial.errors import ChangeError, UnknownFlagError
from flagtrial.launch.change import Change, Edit, apply_change
from flagtrial.launch.spec import LaunchSpec
from flagtrial.reasons import Code
from flagtrial.sourceread import extract
from flagtrial.targets.process import ProcessTarget
from harness.standin import write_project
from harness.vllm_fixtures import run_trial
from harness.wheels import VLLM, engine_site, package_dir


@pytest.fixture(scope="module")
def table() -> dict:
    return extract("vllm", package_dir(*VLLM))


def test_flag_table_of_0_33(table: dict) -> None:
    flags = [f for f in table["flags"] if not f.get("positional")]
    # Counted from the code: make_arg_parser, FrontendArgs fields, EngineArgs.add_cli_args.
    assert len(flags) == 320
    assert sum(len(f["names"]) for f in flags) == 483
    by_name = {n: f for f in flags for n in f["names"]}
    # A bool field is a BooleanOptionalAction, which vLLM registers as EnableDisableAction:
    # --enable-x also gets --no-enable-x and --disable-x (vllm/utils/argparse_utils.py:120).
    prefix = by_name["--enable-prefix-caching"]
    assert prefix["names"] == [
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--disable-prefix-caching",
    ]
    assert prefix["settings"] == ["enable_prefix_caching", "cache_config.enable_prefix_caching"]
    assert by_name["-tp"]["names"] == ["--tensor-parallel-size", "-tp"]
    assert by_name["--gpu-memory-utilization"]["type"] == "float"
    assert by_name["--gpu-memory-utilization"]["where"] == "config/cache.py:215"
    assert by_name["--dtype"]["choices"] == [
        "auto",
        "bfloat16",
        "float",
        "float16",
        "float32",
        "half",
    ]
    assert by_name["--served-model-name"]["nargs"] == "+"
    deprecated = {f["names"][0] for f in flags if f["deprecated"] is not None}
    assert {"--disable-cascade-attn", "--mamba-cache-mode", "--log-config-file"} <= deprecated
    assert by_name["--log-config-file"]["deprecated"] == "--logging-config.pylogging_config_file"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ProcessTarget:
    monkeypatch.setenv("PYTHONPATH", str(engine_site(*VLLM)))
    monkeypatch.setenv("FLAGTRIAL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "unit.service").write_text("[Service]\nExecStart=/bin/true\n")
    return ProcessTarget(tmp_path / "unit.service", tmp_path / "state")


def test_schema_accepts_vllm_spellings(host: ProcessTarget) -> None:
    # `vllm serve` is a console script: its interpreter is the python beside it.
    program = [str(Path(sys.executable).parent / "vllm"), "serve"]
    schema = asyncio.run(engine_schema(host, "vllm", program, underscores=True, dotted=True))
    assert schema.program == "vllm 0.33.0"
    spec = LaunchSpec(kind="unit", text="[Service]\nExecStart=vllm serve m --max_num_seqs 64\n")
    out = apply_change(
        spec,
        Change(
            edits=[
                Edit(op="set", name="--gpu-memory-util", value="0.8"),
                Edit(op="add", name="--no-enable-prefix-caching"),
            ]
        ),
        schema,
    )
    assert out.argv[1:] == [
        "serve",
        "m",
        "--max_num_seqs",
        "64",
        "--gpu-memory-utilization",
        "0.8",
        "--no-enable-prefix-caching",
    ]
    assert schema.lookup("--compilation-config.mode").canonical == "--compilation-config"
    with pytest.raises(UnknownFlagError, match=r"unknown flag --max-num-seq5 for vllm 0\.33\.0"):
        schema.lookup("--max-num-seq5")
    with pytest.raises(ChangeError, match="invalid choice: 'float64'"):
        schema.check_argv(["m", "--dtype", "float64"])
    assert schema.check_argv(["m", "--disable-cascade-attn"]) == [
        "--disable-cascade-attn is deprecated in vllm 0.33.0"
    ]


# vLLM's log lines: vllm/logger.py:28 `(%(vllm_process_name)s pid=%(process)d) %(levelname)s
# %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s`.
LOG_0_33 = """\
(APIServer pid=11) INFO 01-05 10:00:00 [startup.py:96] non-default args: {'model_tag': 'm', 'max_model_len': 32768, 'tensor_parallel_size': 4}
(EngineCore_DP0 pid=12) INFO 01-05 10:00:05 [core.py:139] Initializing a V1 LLM engine (v0.33.0) with config: model='m', speculative_config=None, max_seq_len=32768, tensor_parallel_size=4, enforce_eager=False, kv_cache_dtype=auto, compilation_config={'level': 3, 'cudagraph_capture_sizes': [1, 2, 4]}
(EngineCore_DP0 pid=12) WARNING 01-05 10:00:06 [fa_utils.py:121] Cannot use FA version 3 on Blackwell platform, defaulting to FA version 4 if supported, otherwise FA2.
(EngineCore_DP0 pid=12) INFO 01-05 10:00:40 [gpu_worker.py:773] Available KV cache memory: 25.32 GiB
(EngineCore_DP0 pid=12) INFO 01-05 10:00:40 [kv_cache_utils.py:1148] GPU KV cache size: 1,106,240 tokens, Maximum concurrency for 32,768 tokens per request: 33.76x
"""  # noqa: E501
# entrypoints/common/startup.py:96; v1/engine/core.py:139 with VllmConfig.__str__
# (config/vllm.py:2809); v1/attention/backends/fa_utils.py:121; v1/worker/gpu_worker.py:773;
# v1/core/kv_cache_utils.py:1147-1154.
# Earlier V1 releases log the capacity on two lines, V0 as blocks (see engines/vllm.py FORMS).
LOG_TWO_LINES = """\
INFO 03-01 10:00:40 [kv_cache_utils.py:716] GPU KV cache size: 553,120 tokens
INFO 03-01 10:00:40 [kv_cache_utils.py:720] Maximum concurrency for 32,768 tokens per request: 16.88x
"""  # noqa: E501
LOG_V0 = """\
INFO 06-01 10:00:40 executor_base.py:110] # CUDA blocks: 34570, # CPU blocks: 4096
INFO 06-01 10:00:40 executor_base.py:115] Maximum concurrency for 32768 tokens per request: 16.88x
"""


def test_startup_log_forms() -> None:
    numbers, settings, lines = parse_startup_log(LOG_0_33)
    assert numbers == {"kv_tokens": 1106240, "concurrency": 33.76, "for_len": 32768}
    assert settings["arg.max_model_len"] == 32768
    assert settings["max_seq_len"] == 32768 and settings["enforce_eager"] is False
    assert settings["compilation_config"] == '{"cudagraph_capture_sizes": [1, 2, 4], "level": 3}'
    assert lines == [
        "GPU KV cache size: 1,106,240 tokens, Maximum concurrency for 32,768 tokens per "
        "request: 33.76x"
    ]
    numbers, _, _ = parse_startup_log(LOG_TWO_LINES)
    assert numbers == {"kv_tokens": 553120, "concurrency": 16.88, "for_len": 32768}
    numbers, _, _ = parse_startup_log(LOG_V0)
    assert numbers == {"gpu_blocks": 34570, "concurrency": 16.88, "for_len": 32768}
    overrides, _ = logfacts.override_warnings(LOG_0_33)
    assert overrides == {
        "override: Cannot use FA version 3 on Blackwell platform": (
            "Cannot use FA version 3 on Blackwell platform, defaulting to FA version 4 if "
            "supported, otherwise FA2."
        )
    }


# vllm:cache_config_info: CacheConfig.metrics_info() (config/cache.py:440) as labels of a
# gauge set to 1 (v1/metrics/loggers.py:1110-1135), exposed by prometheus_client.
METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",kv_cache_max_concurrency="33.76",kv_cache_size_tokens="1106240",num_gpu_blocks="69140"} 1.0
"""  # noqa: E501


def test_cache_config_info_labels() -> None:
    info = promtext.first(promtext.parse(METRICS), "vllm:cache_config_info")
    assert info is not None
    assert info.labels["kv_cache_size_tokens"] == "1106240"
    assert info.labels["kv_cache_max_concurrency"] == "33.76"


STANDIN_ENV = {
    "FLAGTRIAL_STANDIN_GPU": "sm120:96",
    "FLAGTRIAL_STANDIN_TOKEN_DELAY_S": "0.01",
    "VLLM_SERVER_DEV_MODE": "1",
}


@pytest.fixture
def vllm_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def make(policy: str = "runs = 3\n") -> Path:
        monkeypatch.setenv("PYTHONPATH", str(engine_site(*VLLM)))
        monkeypatch.setenv("FLAGTRIAL_CACHE", str(tmp_path / "cache"))
        args = [
            "Qwen/Qwen3-8B",
            "--tensor-parallel-size",
            "4",
            "--max-model-len",
            "32768",
            "--port",
            str(free_port()),
        ]
        return write_project(tmp_path, "vllm", args, STANDIN_ENV, policy)

    return make


@pytest.mark.slow
def test_enforce_eager_trial_reverts_with_its_implicit_changes(vllm_project) -> None:
    # Runs of 0.2 s: six per arm, as three left an interval of -47..-14 % here and did not
    # exclude zero once in CI, with the other worker's engines starting on the same 2 cores.
    project = vllm_project("runs = 6\n")
    outcome, _ = run_trial(project, Change(edits=[Edit(op="add", name="--enforce-eager")]))
    assert outcome.verdict.decision == "REVERT", (outcome.verdict.reasons, outcome.verdict.effects)
    lead = outcome.verdict.reasons[0]
    assert (lead.code, lead.values["metric"], lead.values["concurrency"]) == (
        Code.HARM,
        "output_tok_s",
        8,
    )
    before, after = outcome.facts_before, outcome.facts_after
    assert before.version == "0.33.0"
    assert before.sources["kv_tokens"] == "GET /metrics vllm:cache_config_info kv_cache_size_tokens"
    # CUDA graphs' memory goes to the KV cache: capacity grows, the speed is what is lost.
    assert after.capacity["kv_tokens"] > before.capacity["kv_tokens"]
    assert after.capacity["context_per_request"] == 32768
    implicit = {c.name: c for c in outcome.diff.implicit}
    assert "override: Enforce eager set" in implicit
    assert implicit["compilation_config.cudagraph_mode"].after == "NONE"
    explicit = {c.name for c in outcome.diff.explicit}
    assert "model_config.enforce_eager" in explicit
    assert outcome.restore is not None and outcome.restore.verified


@pytest.mark.slow
def test_capacity_guard_reverts_before_any_candidate_load(vllm_project) -> None:
    project = vllm_project('runs = 2\ncapacity_guard = "revert"\n')
    outcome, events = run_trial(
        project, Change(edits=[Edit(op="set", name="--max-num-seqs", value="256")])
    )
    assert outcome.verdict.decision == "REVERT"
    # The scheduler's sequence limit binds below the KV cache at the workload's length
    # (a longer --max-model-len would not: the workload's requests still fit as many).
    loss, guard = outcome.verdict.reasons
    assert (loss.code, guard.code) == (Code.CAPACITY, Code.CAPACITY_GUARD_REVERT)
    assert {k: loss.values[k] for k in ("name", "before", "after", "pct", "bound_by", "limit")} == {
        "name": "concurrent_requests",
        "before": 1024,
        "after": 256,
        "pct": -75.0,
        "bound_by": "max_num_seqs = 256",
        "limit": 5.0,
    }
    assert outcome.facts_before.sources["concurrent_requests"] == (
        "bound by max_num_seqs = 1024 (GET /server_info?config_format=json)"
    )
    assert not any(state == "measuring" for state, _ in events)


def test_a_cpp_warning_with_its_timestamp_is_the_same_override_at_every_start() -> None:
    """torch's c10 lines carry a timestamp (seen in the container: Gloo's hostname fallback);
    with it in the override, no restore could ever verify."""
    from flagtrial.engines.logfacts import override_warnings

    line = (
        "[W1201 12:22:27.970113757 ProcessGroupGloo.cpp:524] Warning: Unable to resolve "
        "hostname to a (local) address. Using the loopback address as fallback."
    )
    later = line.replace("12:22:27.970113757", "12:25:01.000000001")
    assert override_warnings(line) == override_warnings(later)
    assert "12:22" not in str(override_warnings(line))


def test_a_leak_report_naming_a_disable_function_is_not_an_override() -> None:
    """nanobind's report at a Triton process's exit comes at some starts and not others; read
    as an override, it made a restored known-good's facts differ (seen over SSH)."""
    log = 'nanobind: leaked 1 functions!\n - leaked function "get_disable_loop_licm_attr"\n'
    assert logfacts.override_warnings(log) == ({}, [])
    kept = "Disabling cascade attention since it is not supported for sliding window."
    assert list(logfacts.override_warnings(kept)[0].values()) == [kept]
