"""Gate-analysis rules that follow the engine's own defaults and backend selection, each on
a case traced by hand in the real wheel (the comment next to each names the lines)."""

from __future__ import annotations

import ast
from typing import Any

import pytest

from flagtrial.gates.analyze import _reader, analyze_change, render_text, source_index
from flagtrial.gates.capability import Evaluator
from flagtrial.gates.model import GateFinding, GateHost, Outcome
from flagtrial.gates.values import UNKNOWN, Scope

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

VLLM = ("vllm", "0.33.0")
DENSE: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "head_dim": 128,
}
FUSE_AR = "--compilation-config.pass_config.fuse_allreduce_rms"
TP = "--tensor-parallel-size"


def cuda(cap: tuple[int, int], gpus: int = 8) -> GateHost:
    return GateHost(compute_cap=cap, cuda_version=(12, 8), gpu_count=gpus)


def vllm_gate(
    flag: str,
    value: str | None,
    host: GateHost,
    extra: list[str] | None = None,
    model: dict[str, Any] | None = DENSE,
    engine: tuple[str, str] = VLLM,
) -> GateFinding:
    command = ["--model", "MODEL", *(extra or []), flag, *([] if value is None else [value])]
    words = extra or []
    tp = int(words[words.index(TP) + 1]) if TP in words else 1
    (f,) = analyze_change(*engine, [(flag, value)], host, tp, command=command, model=model)
    return f


def test_module_getattr_answers_environment_variables() -> None:
    # vllm/envs.py:2293: def __getattr__(name): return environment_variables[name]() and
    # envs.py:638: "VLLM_BATCH_INVARIANT": lambda: bool(int(os.getenv(..., "0"))); the
    # annotation under `if TYPE_CHECKING:` (envs.py:93) never runs.
    index = source_index(*VLLM)
    scope = Scope(index.modules["vllm.config.vllm"])
    node = ast.parse("envs.VLLM_BATCH_INVARIANT", mode="eval").body
    unset = Evaluator(index, _reader(index), cuda((9, 0)), {}, defaults={})
    assert unset.expr(node, scope).value is False
    # the environment of a running host is not known: no guess
    assert Evaluator(index, _reader(index), cuda((9, 0)), {}).expr(node, scope).value is UNKNOWN


def test_value_the_optimization_level_table_gives_is_a_noop() -> None:
    # vllm/config/vllm.py:1854: OPTIMIZATION_LEVEL_TO_CONFIG[self.optimization_level] (O2 by
    # default, vllm.py:435) fills fuse_allreduce_rms while it is None (vllm.py:1037) with
    # enable_allreduce_rms_fusion(cfg) (vllm.py:179): TP > 1, CUDA, flashinfer, SM90 or
    # SM10x. The reads before it only log (compilation.py:252) or run after it
    # (_set_compile_ranges, vllm.py:2104).
    tp4 = ["--tensor-parallel-size", "4"]
    f = vllm_gate(FUSE_AR, "false", cuda((12, 0), 4), tp4)
    assert f.outcome is Outcome.NO_OP, render_text([f])
    assert f.cites("vllm/config/vllm.py:1854"), render_text([f])
    assert f.cites("vllm/config/vllm.py:179"), render_text([f])
    # on SM90 the table turns the fusion on by itself: false is a change, true is not
    f = vllm_gate(FUSE_AR, "false", cuda((9, 0), 4), tp4)
    assert f.outcome is not Outcome.NO_OP, render_text([f])
    assert vllm_gate(FUSE_AR, "true", cuda((9, 0), 4), tp4).outcome is Outcome.NO_OP
    # a single GPU: the table says False (tp_size > 1 fails)
    assert vllm_gate(FUSE_AR, "false", cuda((10, 0))).outcome is Outcome.NO_OP


def test_reads_before_the_table_that_test_only_truth_see_a_false_edit_as_none() -> None:
    # vllm/config/compilation.py:282 and :973 test `self.fuse_rope_kvcache and ...` before
    # the table is applied: None and False read the same there. The table's entry,
    # enable_rope_kvcache_fusion (vllm.py:206), is rocm_aiter_ops.is_enabled(): False
    # with VLLM_ROCM_USE_AITER unset.
    flag = "--compilation-config.pass_config.fuse_rope_kvcache"
    f = vllm_gate(flag, "false", cuda((9, 0)))
    assert f.outcome is Outcome.NO_OP, render_text([f])
    assert f.cites("vllm/config/vllm.py:206"), render_text([f])


def test_an_if_on_the_bare_setting_that_only_logs_does_not_act() -> None:
    # vllm/config/compilation.py:252: `if self.fuse_allreduce_rms: logger.warning_once(...)`
    # changes nothing that runs; the reads that act are elsewhere (pass_manager.py:167).
    f = vllm_gate(FUSE_AR, "true", cuda((12, 0), 4), ["--tensor-parallel-size", "4"])
    reads = [e.where for e in f.evidence if e.role == "read"]
    assert "vllm/config/compilation.py:252" not in reads, render_text([f])
    assert "vllm/compilation/passes/pass_manager.py:167" in reads, render_text([f])


def test_a_pass_that_disables_itself_in_its_constructor_does_not_act() -> None:
    # pass_manager.py:167-171 adds AllReduceFusionPass(config) when the setting is true; its
    # __init__ (allreduce_rms_fusion.py:987) sets self.disabled = True and returns at :1014
    # when flashinfer_max_size(tp) is None, which it is with no row for SM120 in the
    # capability table (compilation.py:209); __call__ (:1136) returns while disabled.
    # _set_compile_ranges (vllm.py:2669) acts only `if max_size is not None` (:2681), and
    # pass_manager.py:145 only for the Transformers backend (Llama is native here).
    # `--optimization-level 1` keeps the defaults table (False there) out of the way.
    tp4 = ["--tensor-parallel-size", "4", "--optimization-level", "1"]
    f = vllm_gate(FUSE_AR, "true", cuda((12, 0), 4), tp4)
    assert f.outcome is Outcome.NO_OP, render_text([f])
    for place in ("vllm/compilation/passes/pass_manager.py:167", "vllm/config/vllm.py:2669"):
        assert f.cites(place), render_text([f])
    # SM100 has a row (32 MB at 4 GPUs): the pass stays enabled
    assert vllm_gate(FUSE_AR, "true", cuda((10, 0), 4), tp4).outcome is Outcome.ACTIVE
    # on one GPU it disables itself for tp_size <= 1 (allreduce_rms_fusion.py:989)
    f = vllm_gate(FUSE_AR, "true", cuda((10, 0)), ["--optimization-level", "1"])
    assert f.outcome is Outcome.NO_OP, render_text([f])


def test_a_model_the_engine_implements_does_not_use_the_transformers_backend() -> None:
    # registry.py:155 "LlamaForCausalLM": ("llama", ...): with --model-impl auto,
    # inspect_model_cls (registry.py:1389) takes the Transformers backend only when no
    # architecture of the model is registered.
    index = source_index(*VLLM)
    scope = Scope(index.modules["vllm.compilation.passes.pass_manager"])
    node = ast.parse("config.model_config.using_transformers_backend()", mode="eval").body

    def value(model: dict[str, Any]) -> object:
        from flagtrial.gates.model import ModelFacts

        ev = Evaluator(index, _reader(index), cuda((9, 0)), {}, model=ModelFacts.of(model))
        return ev.expr(node, scope).value

    assert value(DENSE) is False
    assert value({**DENSE, "architectures": ["MadeUpForCausalLM"]}) is UNKNOWN


def test_a_field_read_through_its_config_object_is_looked_for_only_where_that_is_named() -> None:
    # --attention-backend lands in AttentionConfig.backend (vllm/config/attention.py:40),
    # read as `attention_config.backend`: the thousands of other `.backend` attributes are
    # not walked, so none is left unwalked.
    cpu = GateHost(platform="cpu", gpu_count=0)
    f = vllm_gate("--attention-backend", "FLASHINFER", cpu, engine=("vllm", "0.32.0"))
    assert not any("not walked" in e.note for e in f.evidence), render_text([f])
