"""The model as the engine's code reads it: `model_config`, `hf_config`, `use_mla_backend()`
for a known config.json (what the file says and what the engine derives from it: MLA, MoE,
the checkpoint's quantization); anything the file does not give is unknown."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flagtrial.gates import definitions
from flagtrial.gates.model import ModelFacts
from flagtrial.gates.values import (
    UNKNOWN,
    Builtin,
    EnumMember,
    FuncRef,
    Instance,
    Val,
    derived,
    plain,
)

if TYPE_CHECKING:
    from flagtrial.gates.capability import Evaluator


@dataclass(frozen=True, eq=False)
class ModelView:
    """The engine's model config object (`model_config`, `hf_config`) for a known config.json:
    what the file says, and what the engine derives from it (MLA, MoE, the checkpoint's
    quantization). Attributes the file does not give are unknown."""

    facts: ModelFacts
    hf: bool  # the raw HF config rather than the engine's ModelConfig

    def attr(self, name: str) -> Any:
        f = self.facts
        if name in ("hf_config", "hf_text_config"):
            return ModelView(f, True)
        if name == "architectures":
            return f.architectures
        if not self.hf:
            derived = {
                "attention_arch": EnumMember("AttentionArch", "MLA" if f.mla else "MHA"),
                "use_mla": f.mla,
                "use_mla_backend": f.mla,
                "is_deepseek_mla": f.mla,
                "is_moe": f.moe,
                "quantization": f.quant_method,
                "has_attention_sinks": f.sinks,
                "has_asymmetric_kv": f.asymmetric_kv,
            }
            if name in derived:
                return derived[name]
        value = f.config.get(name, UNKNOWN)
        return value if plain(value) else UNKNOWN


# helper name -> what it tells of the model (the engine reads the model's config through it)
MODEL_PROBES = {"use_mla_backend": "mla", "model_config_of": "view", "get_model_config": "view"}
# the class both engines build from the model's config.json (vllm/config/model.py,
# sglang/srt/configs/model_config.py)
MODEL_CONFIG_CLASS = "ModelConfig"
# attributes that name the model config object whatever holds it (`runner.model_config`)
MODEL_ATTRS = {"model_config", "hf_config", "hf_text_config", "use_mla_backend"}


# the module whose tables map each architecture the engine implements itself to its class
# (vllm/model_executor/models/registry.py: `"LlamaForCausalLM": ("llama", "LlamaForCausalLM")`)
NATIVE_REGISTRY = "vllm.model_executor.models.registry"


def model_method(ev: Evaluator, attr: str) -> Val | None:
    """`model_config.using_transformers_backend()`: False for an architecture the engine's
    registry implements, with `--model-impl` at its default "auto" (registry.py
    `inspect_model_cls` falls back to the Transformers backend only when no architecture
    of the model is registered)."""
    if attr != "using_transformers_backend" or ev.model is None:
        return None
    impl = ev.fields.get("model_impl")
    fi = ev.index.modules.get(NATIVE_REGISTRY)
    if (impl is not None and impl.value != "auto") or fi is None:
        return None
    lines = ev.reader.lines(fi)
    for arch in ev.model.architectures:
        entry = re.compile(rf'^\s*"{re.escape(arch)}":\s*\(')
        if any(entry.match(line) for line in lines):
            note = f"model: {arch} is implemented by {NATIVE_REGISTRY}"
            return Val(Builtin("constant", False), True, (("fact", -1, 0, note),))
    return None


def model_self_attr(ev: Evaluator, base: Val, obj: Instance, attr: str) -> Val:
    """`ev.x` in a method of the engine's ModelConfig for a known model: what the
    config.json says or the engine derives from it (`is_moe`), or a method; a setting
    stored on it stays unknown (argument resolution may have written it)."""
    assert ev.model is not None
    fact = ModelView(ev.model, False).attr(attr)
    if fact is not UNKNOWN:
        return derived(fact, base, model_fact(ev, "view"))
    val = definitions.class_attr(ev, obj.cls, attr, obj)
    return derived(val.value if isinstance(val.value, FuncRef) else UNKNOWN, base)


def model_fact(ev: Evaluator, what: str) -> Val:
    assert ev.model is not None
    value = ModelView(ev.model, False) if what == "view" else ev.model.mla
    return Val(value, True, (("fact", -1, 0, f"model: {ev.model.describe()}"),))


def model_attr(ev: Evaluator, attr: str) -> Val:
    """`runner.model_config`, `x.hf_config`, `runner.use_mla_backend` of the model."""
    view = model_fact(ev, "view")
    if attr in ("model_config", "hf_config", "hf_text_config"):
        return view if attr == "model_config" else derived(view.value.attr(attr), view)
    return derived(view.value.attr(attr), view)


def model_builtin(name: str, vals: list[Any]) -> Any:
    """`isinstance(hf_config, dict)` (an object, not a dict) and `getattr(hf_config, "k", d)`:
    a key config.json lacks reads as the default, as a PretrainedConfig without it would."""
    view: ModelView = vals[0]
    if name == "isinstance":
        return False if isinstance(vals[1], Builtin) and vals[1].name == "dict" else UNKNOWN
    if name in ("getattr", "hasattr") and len(vals) >= 2 and isinstance(vals[1], str):
        value = view.attr(vals[1])
        missing = view.hf and vals[1] not in view.facts.config and value is UNKNOWN
        if name == "hasattr":
            return UNKNOWN if value is UNKNOWN and not missing else not missing
        if missing and len(vals) > 2:
            return vals[2]
        return value
    return UNKNOWN
