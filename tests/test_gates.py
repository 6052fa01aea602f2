"""Hardware-gate analysis against the real engine wheels (pip download --no-deps, cached).

Every expected outcome below was checked by reading the engine's source by hand; the
comment next to each case names the file:line that proves it, and the test asserts that the
evidence chain cites it. Paths are inside the wheel.
"""

from __future__ import annotations

import ast
import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from flagtrial.gates.analyze import analyze_change, render_text, source_index
from flagtrial.gates.capability import Evaluator
from flagtrial.gates.index import SourceIndex
from flagtrial.gates.model import GateFinding, GateHost, Outcome, parse_compute_cap
from flagtrial.gates.reader import SourceReader
from flagtrial.gates.values import UNKNOWN, Scope
from flagtrial.gates.wheel import engine_source
from flagtrial.targets.base import Gpu, HostFacts

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

SGLANG = ("sglang", "0.5.23")
VLLM = ("vllm", "0.33.0")
SGLANG_SEED = ("sglang", "0.5.10")  # the version of the seed story

SM80 = GateHost.sm("8.0", gpus=4)
SM90 = GateHost.sm("9.0", gpus=4)
SM100 = GateHost.sm("10.0", gpus=4)
SM120 = GateHost.sm("12.0", gpus=4)  # RTX PRO 6000 Blackwell
ROCM = GateHost(compute_cap=(9, 4), platform="rocm", gpu_count=4)  # MI300X
EVERY_HOST = [SM80, SM90, SM100, SM120, ROCM]


@pytest.fixture(scope="session")
def sglang() -> SourceIndex:
    return source_index(*SGLANG)


@pytest.fixture(scope="session")
def vllm() -> SourceIndex:
    return source_index(*VLLM)


@pytest.fixture(scope="session")
def sglang_seed() -> SourceIndex:
    return source_index(*SGLANG_SEED)


def gate(
    engine: tuple[str, str], flag: str, value: str | None, host: GateHost, tp: int = 4
) -> GateFinding:
    (finding,) = analyze_change(*engine, [(flag, value)], host, tp)
    return finding


def assert_cites(finding: GateFinding, *places: str) -> None:
    for place in places:
        assert finding.cites(place), f"{place} not in\n{render_text([finding])}"


# ------------------------------------------------------------------ acceptance: the seed flag


def test_fusion_fails_at_startup_on_sm120(sglang: SourceIndex) -> None:
    f = gate(SGLANG, "--enable-flashinfer-allreduce-fusion", None, SM120)
    assert f.outcome is Outcome.FAILS, render_text([f])
    assert_cites(
        f,
        # registered by hand, store_true
        "sglang/srt/server_args.py:438",
        # deprecated switch -> flashinfer_allreduce_fusion_backend="auto"
        "sglang/srt/arg_groups/serving_hook.py:286",
        # backend = get_exec().comm.flashinfer_allreduce_fusion_backend; not None with "auto"
        "sglang/srt/layers/flashinfer_comm_fusion.py:97",
        "sglang/srt/layers/flashinfer_comm_fusion.py:98",
        # return _resolve_backend(backend, ...)
        "sglang/srt/layers/flashinfer_comm_fusion.py:100",
        # if not (get_platform().is_sm90 or get_platform().is_sm100): raise ValueError(
        "sglang/srt/layers/flashinfer_comm_fusion.py:48",
        "sglang/srt/layers/flashinfer_comm_fusion.py:49",
        # is_sm90_supported = lru_cache(...)(partial(_check_cuda_device_version, [9], (12, 3)))
        "sglang/srt/utils/common.py:333",
        "sglang/srt/utils/common.py:274",
        # get_platform().is_sm90 -> _PLATFORM_PROBES["is_sm90"] = "is_sm90_supported"
        "sglang/srt/runtime_context.py:1824",
    )
    assert f.fields == ["enable_flashinfer_allreduce_fusion", "flashinfer_allreduce_fusion_backend"]


def test_fusion_acts_on_sm90(sglang: SourceIndex) -> None:
    f = gate(SGLANG, "--enable-flashinfer-allreduce-fusion", None, SM90)
    assert f.outcome is Outcome.ACTIVE, render_text([f])
    # flashinfer_ar_fusion_applies(): (_is_sm90_supported or _is_sm100_supported) and ... and
    # get_exec().comm.flashinfer_allreduce_fusion_backend is not None
    assert_cites(
        f,
        "sglang/srt/layers/layer_boundary/residual/add_norm.py:149",
        "sglang/srt/layers/layer_boundary/residual/add_norm.py:146",
    )


def test_fusion_is_what_the_gpu_decides(sglang: SourceIndex) -> None:
    # SM100 passes the same gate; tp does not matter to the raise, which is the platform's.
    assert gate(SGLANG, "--enable-flashinfer-allreduce-fusion", None, SM100).outcome is (
        Outcome.ACTIVE
    )
    assert gate(SGLANG, "--enable-flashinfer-allreduce-fusion", None, SM120, tp=1).outcome is (
        Outcome.FAILS
    )


# ------------------------------------------------------------------ acceptance: fa3


def test_fa3_fails_at_startup_on_sm120_and_sm100(sglang: SourceIndex) -> None:
    for host in (SM120, SM100):
        f = gate(SGLANG, "--attention-backend", "fa3", host)
        assert f.outcome is Outcome.FAILS, render_text([f])
        # @register_attention_backend("fa3") def create_flashattention_v3_backend(runner):
        #     assert (major == 8 and not runner.use_mla_backend) or major == 9
        assert_cites(
            f,
            "sglang/srt/layers/attention/attention_registry.py:239",
            "sglang/srt/layers/attention/attention_registry.py:243",
        )


def test_fa3_acts_on_sm90(sglang: SourceIndex) -> None:
    f = gate(SGLANG, "--attention-backend", "fa3", SM90)
    assert f.outcome is Outcome.ACTIVE, render_text([f])
    assert_cites(f, "sglang/srt/layers/attention/attention_registry.py:239")


# ------------------------------------------------------------------ acceptance: no gate


@pytest.mark.parametrize("host", EVERY_HOST, ids=lambda h: h.describe())
def test_max_running_requests_acts_everywhere(sglang: SourceIndex, host: GateHost) -> None:
    f = gate(SGLANG, "--max-running-requests", "64", host)
    assert f.outcome is Outcome.ACTIVE, render_text([f])
    # self.max_running_requests is read unconditionally in Scheduler.__init__
    assert_cites(f, "sglang/srt/managers/scheduler.py:1230")


# ------------------------------------------------------------------ sglang, found by hand


def test_sglang_deepseek_v4_fp4_indexer_needs_sm100_or_sm120(sglang: SourceIndex) -> None:
    # serving_hook.py:464: if cfg.enable_deepseek_v4_fp4_indexer and not (
    #     get_platform().is_sm100 or get_platform().is_sm120 or is_gfx95_supported()):
    # serving_hook.py:467:     raise ValueError(...)   (handle_environment_variables, every launch)
    f = gate(SGLANG, "--enable-deepseek-v4-fp4-indexer", None, SM90)
    assert f.outcome is Outcome.FAILS, render_text([f])
    assert_cites(
        f, "sglang/srt/arg_groups/serving_hook.py:464", "sglang/srt/arg_groups/serving_hook.py:467"
    )
    assert gate(SGLANG, "--enable-deepseek-v4-fp4-indexer", None, SM100).outcome is (Outcome.ACTIVE)


def test_sglang_trtllm_mla_needs_blackwell(sglang: SourceIndex) -> None:
    # overrides.py:1210: if not get_platform().is_blackwell:
    # overrides.py:1211:     raise ValueError("TRTLLM MLA backend is only supported on Blackwell")
    f = gate(SGLANG, "--attention-backend", "trtllm_mla", SM90)
    assert f.outcome is Outcome.FAILS, render_text([f])
    assert_cites(
        f, "sglang/srt/arg_groups/overrides.py:1210", "sglang/srt/arg_groups/overrides.py:1211"
    )
    # is_blackwell_supported = is_blackwell = ...(majors [10, 11, 12], CUDA >= 12.8)
    assert_cites(f, "sglang/srt/utils/common.py:297")
    assert gate(SGLANG, "--attention-backend", "trtllm_mla", SM100).outcome is Outcome.ACTIVE


def test_sglang_cutedsl_fusion_backend_needs_sm100(sglang: SourceIndex) -> None:
    # flashinfer_comm_fusion.py:53: if backend == "cutedsl":
    # flashinfer_comm_fusion.py:54:     if not get_platform().is_sm100:
    # flashinfer_comm_fusion.py:55:         raise ValueError("... cutedsl ... requires a Blackwell")
    f = gate(SGLANG, "--flashinfer-allreduce-fusion-backend", "cutedsl", SM90)
    assert f.outcome is Outcome.FAILS, render_text([f])
    assert_cites(
        f,
        "sglang/srt/layers/flashinfer_comm_fusion.py:54",
        "sglang/srt/layers/flashinfer_comm_fusion.py:55",
    )
    f = gate(SGLANG, "--flashinfer-allreduce-fusion-backend", "cutedsl", SM100)
    assert f.outcome is Outcome.ACTIVE, render_text([f])


def test_sglang_mamba_stochastic_rounding_needs_cuda(sglang: SourceIndex) -> None:
    # mamba_hook.py:38: if not get_platform().is_cuda:
    # mamba_hook.py:39:     raise ValueError("Stochastic rounding ... only supported on CUDA")
    f = gate(SGLANG, "--enable-mamba-cache-stochastic-rounding", None, ROCM)
    assert f.outcome is Outcome.FAILS, render_text([f])
    assert_cites(
        f, "sglang/srt/arg_groups/mamba_hook.py:38", "sglang/srt/arg_groups/mamba_hook.py:39"
    )
    # get_platform().is_cuda -> is_cuda(): torch.cuda.is_available() and torch.version.cuda ...
    assert_cites(f, "sglang/srt/utils/common.py:158")
    # On CUDA the next check depends on --mamba-backend, which no statement of argument
    # resolution assigns (fields/exec_.py:489 declares "triton"): left out of the command
    # it is "triton", and SM90 raises at mamba_hook.py:45.
    f = gate(SGLANG, "--enable-mamba-cache-stochastic-rounding", None, SM90)
    assert f.outcome is Outcome.FAILS, render_text([f])
    assert_cites(f, "sglang/srt/arg_groups/mamba_hook.py:45")


def test_seed_story_fusion_is_a_noop_on_sm120_in_0_5_10(sglang_seed: SourceIndex) -> None:
    # sglang 0.5.10, layers/communicator.py:96 apply_flashinfer_allreduce_fusion():
    #   :100 (_is_sm90_supported or _is_sm100_supported) and ...
    #   :105 and get_global_server_args().enable_flashinfer_allreduce_fusion
    # the only other read (server_args.py:2090) only auto-enables the field itself.
    f = gate(SGLANG_SEED, "--enable-flashinfer-allreduce-fusion", None, SM120)
    assert f.outcome is Outcome.NO_OP, render_text([f])
    assert_cites(
        f,
        "sglang/srt/server_args.py:4929",
        "sglang/srt/layers/communicator.py:105",
        "sglang/srt/layers/communicator.py:100",
        "sglang/srt/utils/common.py:264",  # is_sm90_supported = lru_cache(...)(partial(...))
    )
    assert gate(SGLANG_SEED, "--enable-flashinfer-allreduce-fusion", None, SM90).outcome is (
        Outcome.ACTIVE
    )


# ------------------------------------------------------------------ vLLM, found by hand


def test_vllm_kda_prefill_backend_platforms(vllm: SourceIndex) -> None:
    # engine/arg_utils.py:2875: if self.kda_prefill_backend == "fused" and not
    #     current_platform.is_rocm():
    # engine/arg_utils.py:2876:     raise ValueError("--kda-prefill-backend=fused ... ROCm.")
    f = gate(VLLM, "--kda-prefill-backend", "fused", SM90)
    assert f.outcome is Outcome.FAILS, render_text([f])
    assert_cites(
        f,
        "vllm/engine/arg_utils.py:2875",
        "vllm/engine/arg_utils.py:2876",
        "vllm/platforms/interface.py:199",  # def is_rocm(self): return self._enum == ROCM
        "vllm/platforms/cuda.py:751",  # current_platform on CUDA: NvmlCudaPlatform
    )
    assert gate(VLLM, "--kda-prefill-backend", "fused", ROCM).outcome is Outcome.ACTIVE
    # engine/arg_utils.py:2869-2872: "flashkda" and not current_platform.is_cuda() -> raise
    f = gate(VLLM, "--kda-prefill-backend", "flashkda", ROCM)
    assert f.outcome is Outcome.FAILS, render_text([f])
    assert_cites(f, "vllm/engine/arg_utils.py:2872")
    assert gate(VLLM, "--kda-prefill-backend", "flashkda", SM90).outcome is Outcome.ACTIVE


def test_vllm_rope_kvcache_fusion_is_a_noop_off_rocm(vllm: SourceIndex) -> None:
    # config/compilation.py:282: if self.fuse_rope_kvcache and not current_platform.is_rocm():
    #     logger.warning_once("... The fusion will be disabled.")
    # config/compilation.py:287:     self.fuse_rope_kvcache = False   (PassConfig.__post_init__)
    flag = "--compilation-config.pass_config.fuse_rope_kvcache"
    f = gate(VLLM, flag, "true", SM90)
    assert f.outcome is Outcome.NO_OP, render_text([f])
    assert_cites(f, "vllm/config/compilation.py:282", "vllm/config/compilation.py:287")
    f = gate(VLLM, flag, "true", ROCM)
    assert f.outcome is Outcome.ACTIVE, render_text([f])
    # config/vllm.py:2696: if compilation_config.pass_config.fuse_rope_kvcache:
    assert_cites(f, "vllm/config/vllm.py:2696")


@pytest.mark.parametrize("host", EVERY_HOST, ids=lambda h: h.describe())
def test_vllm_max_num_seqs_acts_everywhere(vllm: SourceIndex, host: GateHost) -> None:
    f = gate(VLLM, "--max-num-seqs", "64", host)
    assert f.outcome is Outcome.ACTIVE, render_text([f])
    # v1/core/sched/scheduler.py:131: self.max_num_running_reqs = scheduler_config.max_num_seqs
    assert_cites(f, "vllm/engine/arg_utils.py:1753", "vllm/v1/core/sched/scheduler.py:131")


# ------------------------------------------------------------------ capability helpers


def _evaluate(index: SourceIndex, module: str, source: str, host: GateHost) -> object:
    ev = Evaluator(index, SourceReader(index), host, {})
    return ev.expr(ast.parse(source, mode="eval").body, Scope(index.modules[module])).value


@pytest.mark.parametrize(
    ("expr", "host", "expected"),
    [
        ("is_sm90_supported()", GateHost.sm("90", cuda="12.8"), True),
        ("is_sm90_supported()", GateHost.sm("90", cuda="12.2"), False),  # needs CUDA >= 12.3
        ("is_sm90_supported()", SM120, False),
        ("is_sm100_supported()", GateHost.sm("103", cuda="12.9"), True),
        ("is_blackwell()", GateHost.sm("120", cuda="12.8"), True),
        ("is_sm120()", SM120, True),  # torch.cuda.get_device_capability() == (12, 0)
        ("is_hip()", ROCM, True),
        ("is_cuda()", ROCM, False),
        ("get_device_capability()[0] >= 9", SM90, True),
    ],
)
def test_sglang_helpers_follow_their_definitions(
    sglang: SourceIndex, expr: str, host: GateHost, expected: bool
) -> None:
    assert _evaluate(sglang, "sglang.srt.utils.common", expr, host) is expected


def test_sglang_helper_with_unknown_cuda_version_is_unknown(sglang: SourceIndex) -> None:
    # is_sm90_supported also needs CUDA >= 12.3: not decided when the version is not given.
    value = _evaluate(sglang, "sglang.srt.utils.common", "is_sm90_supported()", SM90)
    assert value not in (True, False)


@pytest.mark.parametrize(
    ("expr", "host", "expected"),
    [
        ("current_platform.has_device_capability(90)", SM90, True),
        ("current_platform.has_device_capability(90)", SM80, False),
        ("current_platform.is_device_capability(100)", SM100, True),
        ("current_platform.is_device_capability(100)", GateHost.sm("103"), False),
        ("current_platform.is_device_capability_family(100)", GateHost.sm("103"), True),
        ("current_platform.is_device_capability_family(100)", SM120, False),
        ("current_platform.is_device_capability((12, 1))", GateHost.sm("12.1"), True),
        ("current_platform.is_rocm()", ROCM, True),
        ("current_platform.is_cuda()", SM90, True),
    ],
)
def test_vllm_platform_helpers_follow_their_definitions(
    vllm: SourceIndex, expr: str, host: GateHost, expected: bool
) -> None:
    assert _evaluate(vllm, "vllm.engine.arg_utils", expr, host) is expected


# ------------------------------------------------------------------ API behaviour


def test_flag_table_matches_the_engine(sglang: SourceIndex) -> None:
    # engines.md: 531 CLI flags in sglang 0.5.23
    assert len({id(f) for f in sglang.table.flags.values()}) == 531
    # argparse allow_abbrev: an unambiguous prefix names the same flag
    assert sglang.table.lookup("--max-running-req") is sglang.table.lookup("--max-running-requests")


def test_unknown_flag_is_unknown(sglang: SourceIndex) -> None:
    f = gate(SGLANG, "--no-such-flag", None, SM90)
    assert f.outcome is Outcome.UNKNOWN
    assert "not a flag" in f.reason


def test_flag_with_no_read_is_unknown_not_noop(sglang: SourceIndex) -> None:
    # triton_attention_reduce_in_fp32 is declared (fields/exec_.py:408) but read nowhere:
    # no evidence that it is a no-op *because of the GPU*.
    f = gate(SGLANG, "--triton-attention-reduce-in-fp32", None, SM120)
    assert f.outcome is Outcome.UNKNOWN


def test_flag_value_in_one_word_and_host_facts(sglang: SourceIndex) -> None:
    facts = HostFacts(
        hostname="h",
        kernel="6.1",
        cpus=64,
        gpus=[
            Gpu(
                name="NVIDIA RTX PRO 6000",
                compute_cap="12.0",
                memory_total="96 GiB",
                driver_version="580",
            )
        ]
        * 4,
    )
    (f,) = analyze_change(*SGLANG, [("--attention-backend=fa3", None)], facts, 4)
    assert f.outcome is Outcome.FAILS
    assert f.host.startswith("SM120")


def test_concurrent_queries_agree_with_sequential(sglang: SourceIndex) -> None:
    cases = [
        ("--enable-flashinfer-allreduce-fusion", None, SM120),
        ("--enable-flashinfer-allreduce-fusion", None, SM90),
        ("--attention-backend", "fa3", SM120),
        ("--max-running-requests", "64", SM100),
    ]
    expected = [gate(SGLANG, flag, value, host).outcome for flag, value, host in cases]

    async def together() -> list[Outcome]:
        found = await asyncio.gather(
            *(asyncio.to_thread(gate, SGLANG, flag, value, host) for flag, value, host in cases)
        )
        return [f.outcome for f in found]

    assert asyncio.run(together()) == expected


def test_installed_package_directory(sglang_seed: SourceIndex) -> None:
    # A host's installed package (here: the wheel's files in place) is read the same way.
    package = engine_source(*SGLANG_SEED) / "sglang"
    (f,) = analyze_change(
        *SGLANG_SEED, [("--enable-flashinfer-allreduce-fusion", None)], SM120, 4, source=package
    )
    assert f.outcome is Outcome.NO_OP
    assert f.cites("sglang/srt/layers/communicator.py:105")


def test_a_loaded_index_is_kept_out_of_the_cycle_collector(sglang: SourceIndex) -> None:
    """A fresh process loading a cached index: its objects are frozen (the collector's passes
    over them cost a query more than its own work), and collection is back on after."""
    probe = (
        "import gc, json; from flagtrial.gates.analyze import source_index; "
        "before = gc.get_freeze_count(); index = source_index('sglang', '0.5.23'); "
        "print(json.dumps([before, gc.get_freeze_count(), gc.isenabled(), len(index.files)]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    before, frozen, enabled, files = json.loads(done.stdout)
    assert enabled and files == len(sglang.files)
    assert frozen - before > 10 * files  # every file's record, its functions and mentions


def test_render_text_shows_outcome_and_chain(sglang: SourceIndex) -> None:
    text = render_text([gate(SGLANG, "--attention-backend", "fa3", SM120)])
    assert text.splitlines()[0] == "--attention-backend fa3: FAILS AT STARTUP"
    assert "attention_registry.py:243" in text


@pytest.mark.parametrize(
    ("text", "cap"),
    [("12.0", (12, 0)), ("SM120", (12, 0)), ("sm_90", (9, 0)), ("100", (10, 0)), ("8.6", (8, 6))],
)
def test_compute_capability_spellings(text: str, cap: tuple[int, int]) -> None:
    assert parse_compute_cap(text) == cap


def test_wheel_cache_holds_only_python_source(sglang_seed: SourceIndex) -> None:
    root = Path(sglang_seed.root)
    assert (root / "sglang" / "srt" / "server_args.py").is_file()
    assert not list(root.rglob("*.so"))


# ------------------------------------------------------------------ the launch's environment

GFX942 = GateHost(platform="rocm", gfx="gfx942", rocm_version=(6, 3), gpu_count=4)
DENSE = json.loads(
    (Path(__file__).parents[1] / "benchmarks/gates/corpus/models/dense-llama.json").read_text()
)


@pytest.mark.parametrize(
    ("env", "outcome"),
    [
        ({"SGLANG_USE_AITER": "0"}, Outcome.NO_OP),
        ({"SGLANG_USE_AITER": "1"}, Outcome.ACTIVE),
        ({}, Outcome.ACTIVE),  # not set by the launch: unknown, so not ruled out
    ],
)
def test_the_launchs_environment_decides_an_aiter_path(
    sglang: SourceIndex, env: dict[str, str], outcome: Outcome
) -> None:
    """AITER's all-reduce fusion on gfx942 runs only with SGLANG_USE_AITER on (sglang 0.5.23
    layers/layernorm.py:54 `_use_aiter = get_bool_env_var("SGLANG_USE_AITER") and _is_hip`).
    The variable the launch sets is read as set; before, it was unknown in the layers and
    unset where a caller's test was followed (layer_boundary/residual/add_norm.py:181), so
    with AITER on that read was ruled out although it runs."""
    flag = "--enable-aiter-allreduce-fusion"
    (finding,) = analyze_change(
        *SGLANG, [(flag, None)], GFX942, 4, command=["--model-path", "m", flag],
        model=DENSE, env=env,
    )  # fmt: skip
    assert finding.outcome == outcome, render_text([finding])
    notes = [e.note for e in finding.evidence if e.role == "note"]
    said = {n for n in notes if "in the launch's environment" in n}
    assert said == {f"{k}={v} in the launch's environment" for k, v in env.items()}
    if env.get("SGLANG_USE_AITER") == "1":  # the read the caller's test had ruled out
        (read,) = [e for e in finding.evidence if e.where.endswith("residual/add_norm.py:163")]
        assert read.note.endswith("acts on this host"), render_text([finding])


DETERMINISTIC = "SGLANG_ENABLE_DETERMINISTIC_INFERENCE"


@pytest.mark.parametrize(
    ("expr", "env", "pick", "expected"),
    [
        ('os.getenv("SGLANG_USE_AITER")', {"SGLANG_USE_AITER": "1"}, False, "1"),
        ('os.getenv("SGLANG_USE_AITER")', {}, False, UNKNOWN),  # not set by the launch
        ('os.getenv("SGLANG_USE_AITER", "x")', {}, True, "x"),  # the platform's pick: unset
        # SGLang's typed fields (srt/environ.py), parsed as `EnvBool.parse` parses
        ("envs.SGLANG_USE_AITER.get()", {"SGLANG_USE_AITER": "yes"}, False, True),
        ("envs.SGLANG_USE_AITER.get()", {"SGLANG_USE_AITER": "maybe"}, False, UNKNOWN),
        ("envs.SGLANG_USE_AITER.get()", {}, True, False),  # unset: `EnvBool(False)`
        ("envs.SGLANG_USE_AITER.get()", {}, False, UNKNOWN),
        # arg_groups/attention_hook.py sets it itself: a read may see either value
        (f"envs.{DETERMINISTIC}.get()", {DETERMINISTIC: "0"}, False, UNKNOWN),
        (f'os.getenv("{DETERMINISTIC}")', {DETERMINISTIC: "0"}, True, UNKNOWN),
    ],
)
def test_environment_variables_are_read_as_the_launch_sets_them(
    sglang: SourceIndex, expr: str, env: dict[str, str], pick: bool, expected: object
) -> None:
    """`pick`: evaluated as the platform's own pick is (the launch's other variables unset)."""
    assert DETERMINISTIC in sglang.env_writes and "SGLANG_USE_AITER" not in sglang.env_writes
    ev = Evaluator(sglang, SourceReader(sglang), GFX942, {}, env=env, defaults={} if pick else None)
    scope = Scope(sglang.modules["sglang.srt.environ"])
    assert ev.expr(ast.parse(expr, mode="eval").body, scope).value == expected


def test_a_secret_named_variables_value_never_reaches_the_evidence(sglang: SourceIndex) -> None:
    env = {"HF_TOKEN": "hf_secret_value_1234"}
    ev = Evaluator(sglang, SourceReader(sglang), GFX942, {}, env=env)
    scope = Scope(sglang.modules["sglang.srt.utils.common"])
    token = ev.expr(ast.parse('os.getenv("HF_TOKEN")', mode="eval").body, scope)
    assert token.value == "hf_secret_value_1234"  # the analysis reads it ...
    shown = " ".join(note for *_, note in token.traces)
    assert "HF_TOKEN (value withheld) in the launch's environment" in shown
    assert "hf_secret" not in shown  # ... and never shows it
