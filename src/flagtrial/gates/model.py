"""What a gate analysis takes (the host) and gives back (findings with their evidence)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from flagtrial.settings import DeclaredGpu
from flagtrial.targets.base import HostFacts

GpuPlatform = Literal["cuda", "rocm", "cpu"]

_CAP = re.compile(r"^(?:sm[_ ]?)?(\d+)(?:\.(\d+))?$", re.IGNORECASE)


def parse_compute_cap(text: str) -> tuple[int, int]:
    """'12.0', 'SM120', 'sm_90', '90' or '100' -> (major, minor)."""
    m = _CAP.match(text.strip())
    if not m:
        raise ValueError(f"not a compute capability: {text!r} (expected e.g. 12.0 or SM120)")
    if m.group(2) is not None:
        return int(m.group(1)), int(m.group(2))
    digits = m.group(1)
    if len(digits) < 2:
        return int(digits), 0
    # SM numbers put the minor in the last digit: SM90 is 9.0, SM120 is 12.0.
    return int(digits[:-1]), int(digits[-1])


class GateHost(BaseModel):
    """The host facts a gate depends on. None means not known: gates on it stay unknown."""

    model_config = ConfigDict(frozen=True)

    compute_cap: tuple[int, int] | None = None
    cuda_version: tuple[int, int] | None = None
    platform: GpuPlatform = "cuda"
    gpu_count: int = 1
    gpu_name: str | None = None
    gfx: str | None = None  # an AMD GPU's architecture, e.g. gfx942 (MI300X)
    rocm_version: tuple[int, int] | None = None

    @property
    def capability(self) -> tuple[int, int] | None:
        """What torch's get_device_capability() reports: on ROCm it is read off the gfx
        architecture (gfx942 -> 9.4, gfx90a -> 9.0, gfx1100 -> 11.0)."""
        if self.platform == "cpu":
            return None
        if self.compute_cap or self.platform != "rocm" or not self.gfx:
            return self.compute_cap
        m = re.match(r"^gfx(\d+?)([0-9a-f])([0-9a-f])$", self.gfx.lower())
        return (int(m.group(1)), int(m.group(2), 16)) if m else None

    @classmethod
    def declared(cls, gpu: DeclaredGpu) -> GateHost | None:
        """The project's `[gpu]` (or a fleet host's flagtrial_gpu); None when it declares none."""
        if gpu.gfx:
            rocm = parse_compute_cap(gpu.rocm) if gpu.rocm else None
            return cls(platform="rocm", gfx=gpu.gfx, rocm_version=rocm, gpu_count=gpu.count)
        if gpu.compute_cap:
            return cls.sm(gpu.compute_cap.replace(".", ""), cuda=gpu.cuda, gpus=gpu.count)
        return None

    @classmethod
    def sm(cls, cap: str, *, cuda: str | None = None, gpus: int = 1) -> GateHost:
        """A CUDA host from a capability string, e.g. `GateHost.sm("120", cuda="12.8")`."""
        version = parse_compute_cap(cuda) if cuda else None
        return cls(compute_cap=parse_compute_cap(cap), cuda_version=version, gpu_count=gpus)

    @classmethod
    def from_host_facts(
        cls, facts: HostFacts, *, cuda_version: str | None = None, platform: GpuPlatform = "cuda"
    ) -> GateHost:
        """From nvidia-smi facts; the first GPU speaks for all (mixed hosts are rare)."""
        if not facts.gpus:
            return cls(platform=platform, gpu_count=0)
        first = facts.gpus[0]
        return cls(
            compute_cap=parse_compute_cap(first.compute_cap),
            cuda_version=parse_compute_cap(cuda_version) if cuda_version else None,
            platform=platform,
            gpu_count=len(facts.gpus),
            gpu_name=first.name,
        )

    def describe(self) -> str:
        if self.platform == "cpu":
            return "CPU, no GPU"
        if self.platform == "rocm":
            rocm = ".".join(map(str, self.rocm_version)) if self.rocm_version else "unknown"
            return f"{self.gfx or 'unknown gfx'}, ROCm {rocm}, {self.gpu_count} GPU(s)"
        cap = "SM{}{}".format(*self.compute_cap) if self.compute_cap else "unknown capability"
        cuda = ".".join(map(str, self.cuda_version)) if self.cuda_version else "unknown"
        return f"{cap}, CUDA {cuda}, {self.gpu_count} GPU(s)"


class Outcome(StrEnum):
    ACTIVE = "ACTIVE"
    NO_OP = "NO-OP ON THIS HARDWARE"
    FAILS = "FAILS AT STARTUP"
    UNKNOWN = "UNKNOWN"


EvidenceRole = Literal[
    "flag", "field", "mapping", "read", "gate", "helper", "dispatch", "call", "raise", "note"
]


class Evidence(BaseModel):
    """One link of the chain: a place in the engine's source and what it shows."""

    role: EvidenceRole
    file: str | None = None
    line: int | None = None
    code: str = ""
    note: str = ""

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file else ""


class GateFinding(BaseModel):
    """The outcome for one edit, with the evidence chain that supports it."""

    engine: str
    version: str
    flag: str
    value: str | None
    host: str
    tp: int
    fields: list[str] = Field(default_factory=list)
    outcome: Outcome
    reason: str
    evidence: list[Evidence] = Field(default_factory=list)
    # UNKNOWN only because a raise in argument resolution is not ruled out (a setting it
    # tests may be assigned there): the outcome the reads show once it is, as when the
    # engine's own resolution of the command runs through (gates/preflight.py `combine`).
    unless_raised: Outcome | None = None
    # ACTIVE only through reads in argument resolution: every read after it is ruled out,
    # no function the value selects runs, none was left unwalked. The engine's own
    # resolution then shows what those reads do (gates/preflight.py `combine`).
    acts_in_resolution_only: bool = False

    def cites(self, where: str) -> bool:
        """Whether a `file:line` (path suffix allowed) is part of the evidence chain."""
        return any(e.where.endswith(where) for e in self.evidence if e.file)


class ModelFacts(BaseModel):
    """What a model's config.json says that gates depend on."""

    model_config = ConfigDict(frozen=True)

    architectures: tuple[str, ...] = ()
    mla: bool = False  # multi-head latent attention (DeepSeek V2/V3, Kimi K2)
    moe: bool = False
    quant_method: str | None = None  # a quantized checkpoint: fp8, modelopt, awq, ...
    sinks: bool = False  # learned attention sinks (gpt-oss, MiMo V2)
    asymmetric_kv: bool = False  # K and V rows of different widths
    config: dict[str, Any] = Field(default_factory=dict)  # the language model's config.json

    @classmethod
    def of(cls, config: dict[str, Any]) -> ModelFacts:
        # Multimodal configs nest the language model's config.
        text = config.get("text_config") or config.get("language_config") or {}
        merged = {**text, **config} if isinstance(text, dict) else config
        experts = (
            merged.get(k)
            for k in ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
        )
        quant = merged.get("quantization_config")
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        return cls(
            architectures=tuple(config.get("architectures") or ()),
            mla=bool(merged.get("kv_lora_rank")),
            moe=any(isinstance(n, int) and n > 1 for n in experts),
            quant_method=str(method).lower() if method else None,
            sinks=any("GptOss" in a or "MiMoV2" in a for a in config.get("architectures") or ())
            or any("sink" in k and bool(v) for k, v in merged.items()),
            asymmetric_kv=not merged.get("kv_lora_rank")
            and merged.get("v_head_dim", merged.get("head_dim")) != merged.get("head_dim"),
            config=merged,
        )

    def describe(self) -> str:
        kind = ", ".join(
            k
            for k, on in (
                ("MLA", self.mla),
                ("MoE", self.moe),
                (self.quant_method, bool(self.quant_method)),
            )
            if on and k
        )
        return f"{'/'.join(self.architectures) or 'unnamed'}{f' ({kind})' if kind else ''}"
