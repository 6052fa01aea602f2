"""The gate analysis on each class of case it used to miss, with the whole candidate command,
the model's config.json and the host's platform (CUDA SM, AMD gfx, CPU).

Every expected outcome was traced by hand in the engine's wheel; the comment next to each
case names the lines that decide it. Models are written here as the few config.json keys the
engines read (the architecture, MLA's kv_lora_rank).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from flagtrial.gates.analyze import _reader, analyze_change, render_text, source_index
from flagtrial.gates.capability import Evaluator
from flagtrial.gates.model import GateFinding, GateHost, ModelFacts, Outcome
from flagtrial.gates.modelfiles import other_model
from flagtrial.gates.platforms import foreign_module
from flagtrial.gates.values import UNKNOWN, Scope
from harness.cli import cli

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

SGLANG = ("sglang", "0.5.23")
SGLANG_SEED = ("sglang", "0.5.10")
VLLM = ("vllm", "0.33.0")

DENSE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "head_dim": 128,
}
MLA: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "n_routed_experts": 256,
}


def cuda(cap: tuple[int, int]) -> GateHost:
    return GateHost(compute_cap=cap, cuda_version=(12, 8), gpu_count=8)


SM86, SM90, SM100, SM120 = cuda((8, 6)), cuda((9, 0)), cuda((10, 0)), cuda((12, 0))
GFX942 = GateHost(platform="rocm", gfx="gfx942", rocm_version=(6, 3), gpu_count=8)


def gate(
    engine: tuple[str, str],
    flag: str,
    value: str | None,
    host: GateHost,
    extra: list[str] | None = None,
    model: dict[str, Any] | None = DENSE,
    tp: int = 1,
) -> GateFinding:
    edit = [flag] if value is None else [flag, value]
    command = ["--model-path", "MODEL", *(extra or []), *edit]
    (finding,) = analyze_change(*engine, [(flag, value)], host, tp, command=command, model=model)
    return finding


def expect(f: GateFinding, outcome: Outcome, *places: str) -> None:
    assert f.outcome is outcome, render_text([f])
    for place in places:
        assert f.cites(place), f"{place} not in\n{render_text([f])}"


def test_platform_hook_raise() -> None:
    # kv_cache_hook.py:105: if not get_platform().is_blackwell: raise ValueError(mxfp8 ...)
    f = gate(SGLANG, "--kv-cache-dtype", "mxfp8", SM90)
    expect(f, Outcome.FAILS, "sglang/srt/arg_groups/kv_cache_hook.py:106")
    # an AMD host is not a CUDA host with an unknown capability: it fails the same check
    expect(gate(SGLANG, "--kv-cache-dtype", "mxfp8", GFX942), Outcome.FAILS)
    assert gate(SGLANG, "--kv-cache-dtype", "mxfp8", SM100).outcome is Outcome.ACTIVE


def test_kv4_needs_blackwell_on_every_platform() -> None:
    # kv_cache_hook.py:125: nvfp4 on CUDA but neither SM100 nor SM120 -> RuntimeError;
    # kv_cache_hook.py:318: else (not CUDA) -> RuntimeError("KV4 is not tested on non-CUDA")
    expect(
        gate(SGLANG, "--kv-cache-dtype", "nvfp4", SM90),
        Outcome.FAILS,
        "sglang/srt/arg_groups/kv_cache_hook.py:128",
    )


def test_hook_sets_another_setting_whose_check_fails() -> None:
    # The seed's flag: serving_hook.py:286 turns the deprecated switch into
    # flashinfer_allreduce_fusion_backend="auto", whose resolution raises off SM90/SM100
    # (flashinfer_comm_fusion.py:48-49); 0.5.10 has no such check and the fusion only
    # switches itself off there.
    f = gate(SGLANG, "--enable-flashinfer-allreduce-fusion", None, SM120, ["--tp-size", "4"], tp=4)
    expect(
        f,
        Outcome.FAILS,
        "sglang/srt/arg_groups/serving_hook.py:286",
        "sglang/srt/layers/flashinfer_comm_fusion.py:49",
    )
    seed = gate(SGLANG_SEED, "--enable-flashinfer-allreduce-fusion", None, SM120, tp=4)
    assert seed.outcome is Outcome.NO_OP, render_text([seed])
    for engine in (SGLANG, SGLANG_SEED):
        f = gate(engine, "--enable-flashinfer-allreduce-fusion", None, SM90, tp=4)
        assert f.outcome is Outcome.ACTIVE, render_text([f])


def test_read_in_another_platforms_backend_does_not_count() -> None:
    # aiter_backend.py imports AITER (AMD only) and reads kv_cache_dtype: not on CUDA.
    index = source_index(*SGLANG)
    fi = index.modules["sglang.srt.layers.attention.aiter_backend"]
    why = foreign_module(index, _reader(index), fi, SM90)
    assert why is not None and "never runs on cuda" in why
    assert foreign_module(index, _reader(index), fi, GFX942) is None
    # so the fp8 KV cache's ACTIVE on SM90 rests on reads outside AITER
    f = gate(SGLANG, "--kv-cache-dtype", "fp8_e4m3", SM90)
    assert f.outcome is Outcome.ACTIVE, render_text([f])
    assert not any("aiter" in (e.file or "") and e.role == "read" for e in f.evidence)


def test_a_read_in_another_models_file_does_not_count() -> None:
    # models/beam.py:977 (in _flashinfer_ar_band) reads the enforce-disable switch. SGLang's
    # registry imports every model module for its EntryClass, but a Llama is built from
    # llama.py's LlamaForCausalLM, and nothing it or the server's own code loads imports
    # beam.py: that function never runs for it.
    index = source_index(*SGLANG)
    reader = _reader(index)
    beam = index.modules["sglang.srt.models.beam"]
    llama = ModelFacts.of(DENSE)
    why = other_model(index, reader, beam, 977, llama)
    assert why is not None and "another model's code" in why and "models/llama.py" in why
    # beam's own architecture builds it, and module-level code runs at the registry's import
    beams = ModelFacts.of({"architectures": ["BeamForCausalLM"]})
    assert other_model(index, reader, beam, 977, beams) is None
    assert other_model(index, reader, beam, 1, llama) is None
    # what the model's module imports runs too: qwen3_moe.py loads qwen2_moe.py (:63)
    qwen2 = index.modules["sglang.srt.models.qwen2_moe"]
    qwen3 = ModelFacts.of({"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 128})
    assert other_model(index, reader, qwen2, 126, qwen3) is None
    # vLLM: the registry's entry names the module ("InternLM3ForCausalLM": ("llama", ...)),
    # no class of that name exists; mixtral.py is not loaded for it
    vllm = source_index(*VLLM)
    mixtral = vllm.modules["vllm.model_executor.models.mixtral"]
    fn = vllm.files[mixtral].funcs[0]
    intern = ModelFacts.of({"architectures": ["InternLM3ForCausalLM"]})
    assert other_model(vllm, _reader(vllm), mixtral, fn.start + 1, intern) is not None
    # in a finding the read is ruled out; with a draft model (other classes built) it is not
    edit = "--enforce-disable-flashinfer-allreduce-fusion"
    f = gate(SGLANG, edit, None, SM90, ["--tp-size", "4"], tp=4)
    notes = [e.note or "" for e in f.evidence]
    assert any("models/beam.py is another model's code" in n for n in notes), render_text([f])
    draft = ["--tp-size", "4", "--speculative-algorithm", "EAGLE"]
    f = gate(SGLANG, edit, None, SM90, draft, tp=4)
    assert not any("another model's code" in (e.note or "") for e in f.evidence)


def test_a_read_in_vllms_per_model_packages_counts_only_for_that_model() -> None:
    # vLLM keeps a package per model with its own kernels under vllm/models/, named in the
    # registry by full path (model_executor/models/registry.py:127 "Glm5NextForCausalLM":
    # ("vllm.models.glm5next", ...)). models/glm5next/common/kda.py:171 (a method) reads the
    # KDA prefill backend; no code outside vllm/models/ imports glm5next.
    index = source_index(*VLLM)
    reader = _reader(index)
    kda = index.modules["vllm.models.glm5next.common.kda"]
    why = other_model(index, reader, kda, 171, ModelFacts.of(DENSE))
    assert why is not None and "models/glm5next/common/kda.py is another model's code" in why
    glm = ModelFacts.of({"architectures": ["Glm5NextForCausalLM"]})
    assert other_model(index, reader, kda, 171, glm) is None
    # A module the attention-backend registry names by path (v1/attention/backends/
    # registry.py:101) is imported when the selector picks it, whatever the model's module.
    sparse = index.modules["vllm.models.deepseek_v4.sparse_mla"]
    assert other_model(index, reader, sparse, 61, ModelFacts.of(DENSE)) is None


def test_a_method_of_a_class_a_table_gives_other_architectures_does_not_count() -> None:
    # vLLM's models/config.py:1211 MODELS_CONFIG_MAP, looked up by architecture
    # (config/model.py:1518), gives UnlimitedOCRForCausalLMConfig (:160), which reads
    # flash_attn_version (:225), to that architecture alone; Gemma4Config (:301, read at
    # :336) to the Gemma 4 ones and, as a base class, to EmbeddingGemma2Model's (:371).
    index = source_index(*VLLM)
    reader = _reader(index)
    fi = index.modules["vllm.model_executor.models.config"]
    why = other_model(index, reader, fi, 225, ModelFacts.of(DENSE))
    assert why is not None and "UnlimitedOCRForCausalLMConfig serves" in why
    ocr = ModelFacts.of({"architectures": ["UnlimitedOCRForCausalLM"]})
    assert other_model(index, reader, fi, 225, ocr) is None
    embedding = ModelFacts.of({"architectures": ["EmbeddingGemma2Model"]})
    assert other_model(index, reader, fi, 336, embedding) is None
    assert other_model(index, reader, fi, 336, ModelFacts.of(DENSE)) is not None
    # A module global a function rebinds (`global _current_vllm_config`, config/vllm.py:3570)
    # is not its initial None: fa_utils.py:115 reads the version through it, and on SM89
    # (no FA3) the edit acts, not a no-op.
    sm89 = cuda((8, 9))
    f = gate(VLLM, "--attention-config.flash_attn_version", "3", sm89, model=DENSE)
    expect(f, Outcome.ACTIVE, "vllm/v1/attention/backends/fa_utils.py:115")


def test_a_read_in_a_function_every_call_of_which_is_off_here_does_not_count() -> None:
    # add_norm.py:163 reads the switch in aiter_ar_fusion_enabled_for(), which no other file
    # imports; its one call (:181) comes after `_use_aiter and` in a chain of `and`s, and
    # _use_aiter (:55) needs HIP: on CUDA the call never happens. On AMD it may.
    edit = "--enable-aiter-allreduce-fusion"
    f = gate(SGLANG, edit, None, SM90, ["--tp-size", "4"], tp=4)
    expect(f, Outcome.NO_OP, "sglang/srt/layers/layer_boundary/residual/add_norm.py:181")
    amd = gate(SGLANG, edit, None, GFX942, ["--tp-size", "4"], tp=4)
    assert amd.outcome is Outcome.ACTIVE, render_text([amd])


@pytest.mark.parametrize(
    ("cap", "table"),
    [((9, 0), {2: 64, 4: 2, 8: 0.5}), ((10, 0), {2: 64, 4: 32, 8: 1, 16: 64}), ((12, 0), {})],
)
def test_capability_table_is_evaluated(cap: tuple[int, int], table: dict[int, float]) -> None:
    # compilation.py:209: FI_ALLREDUCE_FUSION_MAX_SIZE_MB.get(capability.to_int(), {}):
    # allreduce_rms_fusion.py:104 has rows for 90, 100, 103, 107 and none for SM120.
    index = source_index(*VLLM)
    fi = index.modules["vllm.config.compilation"]
    ev = Evaluator(index, _reader(index), cuda(cap), {})
    call = ast.parse("PassConfig.default_fi_allreduce_fusion_max_size_mb()", mode="eval").body
    val = ev.expr(call, Scope(fi))
    assert val.value == table and val.hw
    # compilation.py:204: not current_platform.is_cuda() -> {} on ROCm
    ev = Evaluator(index, _reader(index), GFX942, {})
    assert ev.expr(call, Scope(fi)).value == {}


def test_value_the_platform_picks_anyway_is_a_noop() -> None:
    # overrides.py:1132: attention_backend None -> get_default_attn_backend(); for an MLA
    # model on SM120 that is triton (model_override_base.py, the MLA branch's last else).
    f = gate(SGLANG, "--attention-backend", "triton", SM120, model=MLA)
    expect(f, Outcome.NO_OP, "sglang/srt/arg_groups/overrides.py:1132")
    assert "triton" in f.reason
    # a dense model on SM90 with CUDA 12.8 gets fa3 by default: triton is a change there
    assert gate(SGLANG, "--attention-backend", "triton", SM90).outcome is Outcome.ACTIVE


def test_a_local_the_platform_sets_to_the_edited_value_anyway_is_a_noop() -> None:
    # fp8_utils.py:1211 copies the backend into a local; :1212 turns "auto" into cutlass on
    # SM120, so with or without `--fp8-gemm-backend cutlass` the local is cutlass there.
    fp8 = {**DENSE, "quantization_config": {"quant_method": "fp8"}}
    flag = "--fp8-gemm-backend"
    f = gate(SGLANG, flag, "cutlass", SM120, model=fp8)
    expect(f, Outcome.NO_OP, "sglang/srt/layers/quantization/fp8_utils.py:1212")
    # on SM90 "auto" stays auto: cutlass is a change there
    assert gate(SGLANG, flag, "cutlass", SM90, model=fp8).outcome is not Outcome.NO_OP
    # 0.5.10 (fp8_utils.py:464) picks triton on SM120, not cutlass
    f = gate(SGLANG_SEED, flag, "triton", SM120, model=fp8)
    expect(f, Outcome.NO_OP, "sglang/srt/layers/quantization/fp8_utils.py:464")
    assert gate(SGLANG_SEED, flag, "cutlass", SM120, model=fp8).outcome is not Outcome.NO_OP


def test_a_read_that_replaces_the_platforms_pick_by_the_same_value_is_a_noop() -> None:
    # fa_utils.py:106 picks FA2 below SM90; :113-117 replace the pick by the configured
    # version when there is one: 2 on SM80 is the pick itself, whether or not the config is
    # current (either branch of :113 leaves 2). On SM90 the pick is FA3 (:100).
    flag = "--attention-config.flash_attn_version"
    f = gate(VLLM, flag, "2", cuda((8, 0)))
    expect(f, Outcome.NO_OP, "vllm/v1/attention/backends/fa_utils.py:113")
    assert gate(VLLM, flag, "2", SM90).outcome is Outcome.ACTIVE


def test_outcome_depends_on_the_model() -> None:
    # attention_registry.py:243: assert (major == 8 and not runner.use_mla_backend) or major == 9
    expect(
        gate(SGLANG, "--attention-backend", "fa3", SM86, model=MLA),
        Outcome.FAILS,
        "sglang/srt/layers/attention/attention_registry.py:243",
    )
    assert gate(SGLANG, "--attention-backend", "fa3", SM86).outcome is Outcome.ACTIVE
    facts = ModelFacts.of(MLA)
    assert facts.mla and facts.moe and not ModelFacts.of(DENSE).mla


def test_outcome_depends_on_another_flag_of_the_command() -> None:
    # mamba_hook.py:44: if cfg.mamba_backend == "triton" and not get_platform().is_sm100: raise
    flag = "--enable-mamba-cache-stochastic-rounding"
    fp16 = ["--mamba-ssm-dtype", "float16"]
    f = gate(SGLANG, flag, None, SM90, [*fp16, "--mamba-backend", "triton"])
    expect(f, Outcome.FAILS, "sglang/srt/arg_groups/mamba_hook.py:45")
    f = gate(SGLANG, flag, None, SM90, [*fp16, "--mamba-backend", "flashinfer"])
    assert f.outcome is Outcome.ACTIVE, render_text([f])
    f = gate(SGLANG, flag, None, SM100, [*fp16, "--mamba-backend", "triton"])
    assert f.outcome is Outcome.ACTIVE, render_text([f])


def test_amd_and_cpu_hosts_are_decided() -> None:
    assert GFX942.capability == (9, 4)  # torch on ROCm reports gfx942 as 9.4
    assert GateHost(platform="rocm", gfx="gfx90a").capability == (9, 0)
    f = gate(SGLANG, "--max-running-requests", "64", GFX942)
    assert f.outcome is Outcome.ACTIVE, render_text([f])
    assert GateHost(platform="cpu", gpu_count=0).describe() == "CPU, no GPU"


def test_cli_takes_the_command_the_model_and_the_gpu(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(MLA))
    argv = ("gates", "--engine", "sglang==0.5.23", "--json")
    run = cli(None, *argv, "--sm", "8.6", "--model-config", str(config), "--command",
              "--model-path M --tp-size 8", "--attention-backend", "fa3")  # fmt: skip
    assert run.returncode == 0, run.stderr
    (finding,) = json.loads(run.stdout)
    assert finding["outcome"] == Outcome.FAILS.value and finding["tp"] == 8
    run = cli(None, *argv, "--gfx", "gfx942", "--sm", "9.0", "--max-running-requests", "8")
    assert run.returncode == 2 and "one of --sm, --gfx, --cpu" in run.stderr


def test_cli_takes_the_launchs_environment(tmp_path: Path) -> None:
    """`--env NAME=VALUE`: a variable the launch sets, read as set (sglang 0.5.23
    layers/layernorm.py:54 `_use_aiter` needs SGLANG_USE_AITER on a HIP build)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(DENSE))
    argv = ("gates", "--engine", "sglang==0.5.23", "--gfx", "gfx942", "--json",
            "--model-config", str(config))  # fmt: skip
    outcomes = []
    for value in ("0", "1"):
        run = cli(None, *argv, "--env", f"SGLANG_USE_AITER={value}",
                  "--enable-aiter-allreduce-fusion")  # fmt: skip
        assert run.returncode == 0, run.stderr
        outcomes.append(json.loads(run.stdout)[0]["outcome"])
    assert outcomes == [Outcome.NO_OP.value, Outcome.ACTIVE.value]
    run = cli(None, *argv, "--env", "hf_not_a_pair_1234", "--enable-aiter-allreduce-fusion")
    assert run.returncode == 2 and "--env takes NAME=VALUE" in run.stderr
    assert "hf_not_a_pair_1234" not in run.stderr + run.stdout


def test_platform_hook_turns_the_setting_off_again() -> None:
    # vLLM 0.33.0 platforms/cpu.py:363-365, in CpuPlatform.check_and_update_config (run at
    # every launch on a CPU host): if parallel_config.enable_dbo: ... enable_dbo = False
    cpu = GateHost(platform="cpu", gpu_count=0)
    f = gate(VLLM, "--enable-dbo", None, cpu)
    expect(f, Outcome.NO_OP, "vllm/platforms/cpu.py:363", "vllm/platforms/cpu.py:365")
    # the CUDA platform's hook does not: there the CPU module never runs
    f = gate(VLLM, "--enable-dbo", None, SM90)
    assert f.outcome is not Outcome.NO_OP, render_text([f])


def test_vllm_selected_attention_backend_is_validated_alone() -> None:
    # vLLM 0.31.0 cutlass_mla.py:66 supports_compute_capability: capability.major == 10;
    # platforms/cuda.py:448-461 validates a selected backend alone and raises ValueError on any
    # reason instead of falling back to the priority list.
    engine = ("vllm", "0.31.0")
    f = gate(engine, "--attention-backend", "CUTLASS_MLA", SM90, model=MLA)
    expect(
        f,
        Outcome.FAILS,
        "vllm/v1/attention/backends/mla/cutlass_mla.py:66",
        "vllm/platforms/cuda.py:461",
    )
    ok = gate(engine, "--attention-backend", "CUTLASS_MLA", SM100, model=MLA)
    assert ok.outcome is not Outcome.FAILS, render_text([ok])


def test_platform_pick_through_a_method_of_the_arguments() -> None:
    # SGLang 0.5.12 server_args.py:2659 `self.attention_backend =
    # self._get_default_attn_backend(use_mla_backend, model_config)`: the method (2579) is
    # followed with `self` the ServerArgs and `use_mla_backend = self.use_mla_backend()`
    # evaluated again for the model: Hopper MHA picks fa3 (2611), SM100 trtllm_mha (2620).
    engine = ("sglang", "0.5.12")
    expect(
        gate(engine, "--attention-backend", "fa3", SM90),
        Outcome.NO_OP,
        "sglang/srt/server_args.py:2658",
    )
    expect(gate(engine, "--attention-backend", "trtllm_mha", SM100), Outcome.NO_OP)
    assert gate(engine, "--attention-backend", "trtllm_mha", SM90).outcome is not Outcome.NO_OP


def test_model_config_methods_read_the_model() -> None:
    # vLLM 0.31.0 config/model.py:1512 `if parallel_config.enable_expert_parallel:
    # self._verify_with_expert_parallelism()`, whose `if not self.is_moe: raise` (1452-1453)
    # reads the model through ModelConfig's `self`: a dense model fails, a MoE model acts.
    engine = ("vllm", "0.31.0")
    moe = {"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 128}
    args = ("--enable-expert-parallel", None, cuda((8, 0)), ["-tp", "2"])
    expect(gate(engine, *args, tp=2), Outcome.FAILS, "vllm/config/model.py:1453")
    assert gate(engine, *args, model=moe, tp=2).outcome is Outcome.ACTIVE


def test_a_setting_no_resolution_statement_assigns_keeps_its_default() -> None:
    # SGLang 0.5.10.post1 server_args.py:2368-2374: prefill_backend is
    # prefill_attention_backend (never assigned in argument resolution, only declared and
    # copied under its own name) or attention_backend; trtllm_mha off SM100 raises there.
    # Before, every word before `=` or `:` counted as a write, so this stayed UNKNOWN.
    engine = ("sglang", "0.5.10.post1")
    expect(
        gate(engine, "--attention-backend", "trtllm_mha", SM90),
        Outcome.FAILS,
        "sglang/srt/server_args.py:2374",
    )


def test_setting_replaced_on_this_platform_at_every_launch() -> None:
    # SGLang 0.5.11: __post_init__ calls self._handle_amd_specifics() at its top level,
    # whose `if is_hip(): self.triton_attention_num_kv_splits = 16` replaces the user's
    # value on AMD; argument resolution reads the setting nowhere else.
    engine = ("sglang", "0.5.11")
    args = ("--triton-attention-num-kv-splits", "4")
    extra = ["--attention-backend", "triton"]
    f = gate(engine, *args, GFX942, extra)
    expect(f, Outcome.NO_OP, "sglang/srt/server_args.py:2824")
    assert gate(engine, *args, SM90, extra).outcome is Outcome.ACTIVE


def test_str_enum_members_and_regex_matches_are_evaluated() -> None:
    # connector/__init__.py:19: class ConnectorType(str, enum.Enum): INSTANCE = "instance";
    # utils/common.py:2554: parse_connector_type matches r"(.+)://(.*)", "" without a match.
    index = source_index(*SGLANG_SEED)
    ev = Evaluator(index, _reader(index), SM100, {})
    scope = Scope(index.modules["sglang.srt.server_args"])

    def value(source: str) -> object:
        return ev.expr(ast.parse(source, mode="eval").body, scope).value

    assert value('ConnectorType.INSTANCE == "instance"') is True
    assert value('ConnectorType.INSTANCE != "filesystem"') is True
    assert value('parse_connector_type("/models/llama") == ConnectorType.INSTANCE') is False
    # a match object is not modelled: the scheme it would return stays unknown
    assert value('parse_connector_type("instance://h") == ConnectorType.INSTANCE') is UNKNOWN


def test_platform_pick_behind_an_early_return_on_the_model_path() -> None:
    # SGLang 0.5.10 server_args.py:1495: `if parse_connector_type(self.model_path) ==
    # ConnectorType.INSTANCE: return` is False for a plain path, so the DeepSeek V3 branch
    # runs: on SM100 with no backend given, server_args.py:1604-1608 picks trtllm_mla.
    extra = ["--tp-size", "8"]
    f = gate(SGLANG_SEED, "--attention-backend", "trtllm_mla", SM100, extra, model=MLA, tp=8)
    expect(f, Outcome.NO_OP, "sglang/srt/server_args.py:1604")
    f = gate(SGLANG_SEED, "--attention-backend", "trtllm_mla", SM90, extra, model=MLA, tp=8)
    assert f.outcome is not Outcome.NO_OP, render_text([f])


def test_unknown_only_for_a_raise_in_argument_resolution_names_the_outcome_behind_it() -> None:
    # sglang 0.5.23 srt/arg_groups/kv_cache_hook.py:313: `assert attention_backend in
    # KV4_ATTENTION_MHA_BACKEND_CHOICES` fails with attention_backend at its default, but
    # argument resolution may assign it first: UNKNOWN, ACTIVE once the engine's own
    # resolution runs through (gates/preflight.py combine); nvfp4 on SM100 acts (:57, :88).
    f = gate(SGLANG, "--kv-cache-dtype", "nvfp4", SM100)
    expect(f, Outcome.UNKNOWN, "sglang/srt/arg_groups/kv_cache_hook.py:313")
    assert f.unless_raised is Outcome.ACTIVE
    # a startup failure that is certain leaves nothing behind it (attention_hook.py:225)
    failed = gate(SGLANG, "--kv-cache-dtype", "nvfp4", cuda((8, 0)))
    assert failed.outcome is Outcome.FAILS and failed.unless_raised is None


def test_unknown_for_a_check_the_platform_pick_also_meets_names_the_raise() -> None:
    # sglang 0.5.23 srt/arg_groups/overrides.py:1214-1215: trtllm_mla with kv-cache-dtype
    # fp8_e5m2 raises ValueError; SM100 picks trtllm_mla for an MLA model by itself (the same
    # value anyway), so only the raise stands between this edit and a NO-OP: UNKNOWN naming
    # the raise, for the engine's own resolution to confirm (combine: FAILS)
    f = gate(SGLANG, "--attention-backend", "trtllm_mla", cuda((10, 0)),
             ["--tp-size", "8", "--kv-cache-dtype", "fp8_e5m2"], MLA, tp=8)  # fmt: skip
    expect(f, Outcome.UNKNOWN, "sglang/srt/arg_groups/overrides.py:1215")
    assert f.unless_raised is Outcome.NO_OP
