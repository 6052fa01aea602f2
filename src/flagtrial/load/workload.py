"""The load a trial puts on the server: the `[workload]` table of `flagtrial.toml`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt


class Workload(BaseModel):
    """One fixed workload, replayed unchanged before and after a flag change."""

    model_config = ConfigDict(extra="forbid")

    api: Literal["completions", "chat"] = Field(
        default="completions",
        description="OpenAI-compatible endpoint: /v1/completions or /v1/chat/completions.",
    )
    model: str | None = Field(
        default=None,
        description="Sent as the request's `model` when set; vLLM and SGLang check it.",
        examples=["Qwen/Qwen3-8B"],
    )
    concurrency: list[PositiveInt] = Field(
        default_factory=lambda: [1, 4, 8],
        min_length=1,
        description="Closed-loop concurrency levels: requests kept in flight at once.",
    )
    prompt_words: PositiveInt = Field(
        default=64, description="Words per prompt, each prompt unique from its first word."
    )
    max_tokens: PositiveInt = Field(default=64, description="Tokens requested per completion.")
    requests_per_run: PositiveInt = Field(
        default=16, description="Measured requests per concurrency level and run."
    )
    warmup_requests: int = Field(
        default=2,
        ge=0,
        description="Requests per level sent before measuring, at that concurrency; excluded.",
    )
    run_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="Wall bound per run; requests in flight at the bound count as errors.",
    )
    request_timeout_s: float = Field(
        default=60.0, gt=0, description="Wall bound per request; a request past it is an error."
    )
    ignore_eos: bool = Field(
        default=True,
        description="Sent as `ignore_eos` so every completion is max_tokens long.",
    )
    temperature: float = Field(default=0.0, ge=0, description="Sampling temperature.")
