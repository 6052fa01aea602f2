"""The hardware and model a stand-in server declares, and its memory model.

There is no GPU here, so the stand-in is told what it runs on, in its unit's environment:
`FLAGTRIAL_STANDIN_GPU=sm120:96` (compute capability and GiB per GPU; the GPU count is the
parallel size the flags ask for) and, optionally, `FLAGTRIAL_STANDIN_MODEL=key=value,...`
overriding fields of `Model`. The memory model is the stand-in's own, a linear budget per GPU
(what each term follows is cited where it is computed):

    budget    = GiB x mem_fraction_static - weights / tp - CUDA graphs - workspaces
    kv_tokens = budget x 1 / (1 + r) / KV bytes per token       (r: mamba_full_memory_ratio)
    state cap = budget x r / (1 + r) / recurrent-state bytes per request
    running   = min(requested, kv_tokens // 2, state cap)

Its constants describe a hybrid (linear + full attention) MoE like the seed's Qwen3.5-122B-A10B
on 4 RTX PRO 6000 Blackwell (SM120, 96 GiB), chosen so that the seed's deployment
(`--tp-size 4 --mem-fraction-static 0.68 --max-running-requests 48`) reads 48 running
requests, and 26 once the FlashInfer all-reduce fusion workspace is charged: the seed's
observation, reproduced by this model, not a measurement of SGLang.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class Gpu:
    sm: int  # compute capability, major*10 + minor (90 Hopper, 100 B200, 120 RTX PRO 6000)
    gib: float

    @property
    def name(self) -> str:
        return f"SM{self.sm} {self.gib:g} GiB"


@dataclass(frozen=True)
class Model:
    path: str = "Qwen3.5-122B-A10B"
    weights_gib: float = 244.0  # BF16, all ranks together
    hidden_size: int = 3072
    context_len: int = 262144
    kv_kib_per_token: float = 96.0  # full-attention layers, all ranks together
    state_mib_per_request: float = 130.0  # linear-attention (mamba) state, all ranks together


def declared_gpu() -> Gpu:
    sm, _, gib = os.environ.get("FLAGTRIAL_STANDIN_GPU", "sm120:96").lower().partition(":")
    return Gpu(sm=int(sm.removeprefix("sm")), gib=float(gib or 96))


def declared_model(path: str | None) -> Model:
    model = Model() if path is None else Model(path=path)
    overrides = os.environ.get("FLAGTRIAL_STANDIN_MODEL", "")
    types = {f.name: f.type for f in fields(Model)}
    for item in filter(None, (part.strip() for part in overrides.split(","))):
        key, _, value = item.partition("=")
        kind = {"str": str, "int": int}.get(str(types[key]), float)
        model = replace(model, **{key: kind(value)})
    return model


def allreduce_fusion_workspace_gib(tp: int, max_token_num: int, hidden: int) -> float:
    """FlashInfer's TRT-LLM all-reduce fusion workspace per rank, after sglang 0.5.23
    layers/flashinfer_comm_fusion.py:253 `_flashinfer_trtllm_workspace_allocation_sizes`:
    a bf16 buffer, a flag block and three Lamport buffers, each rounded up to 2 MiB."""

    def align(n: int) -> int:
        return -(-n // (2 * MIB)) * 2 * MIB

    buffer = tp * max_token_num * hidden * 2
    flags = tp * 256 * 4
    lamport = min(tp * max_token_num * hidden * 2, 2147483647 & ~((1 << 21) - 1)) * 3
    return (align(buffer) + align(flags) + align(lamport)) / GIB


@dataclass(frozen=True)
class Capacity:
    kv_tokens: int  # per rank
    state_cap: int
    running: int


def capacity(
    gpu: Gpu,
    model: Model,
    *,
    tp: int,
    mem_fraction_static: float,
    graph_gib: float,
    workspace_gib: float,
    mamba_full_memory_ratio: float,
    requested_running: int | None,
) -> Capacity:
    budget = gpu.gib * mem_fraction_static - model.weights_gib / tp - graph_gib - workspace_gib
    budget = max(budget, 0.0)
    r = mamba_full_memory_ratio
    kv_tokens = int(budget / (1 + r) * GIB / (model.kv_kib_per_token / tp * 1024))
    state_cap = int(budget * r / (1 + r) * GIB / (model.state_mib_per_request / tp * MIB))
    # sglang mem_cache/kv_cache_configurator.py:3119 resolve_max_num_reqs: the request cap is
    # min(requested or the estimate from the pool, token_capacity // 2), then the state cap.
    estimated = max(min(int(kv_tokens / model.context_len * 512), 4096), 2048)
    running = min(requested_running or estimated, kv_tokens // 2, state_cap)
    return Capacity(kv_tokens, state_cap, running)
