"""The load a trial puts on the server: the `[workload]` table of `flagtrial.toml`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator


class Lengths(BaseModel):
    """Lengths drawn per request, clipped to [1, the workload's cap]."""

    model_config = ConfigDict(extra="forbid")

    distribution: Literal["uniform", "normal", "lognormal"] = Field(
        description="uniform: from `low` to the cap; normal: `mean` and sd `spread`; "
        "lognormal: median `mean` and sigma `spread` (of the log)"
    )
    mean: PositiveFloat | None = Field(default=None, description="normal: mean; lognormal: median")
    spread: float = Field(default=0.0, ge=0, description="normal: sd; lognormal: sigma")
    low: PositiveInt = Field(default=1, description="uniform: the shortest")

    @model_validator(mode="after")
    def _mean_given(self) -> Self:
        if self.distribution != "uniform" and self.mean is None:
            raise ValueError(f"a {self.distribution} distribution needs `mean`")
        return self


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
        description="Concurrency levels: requests kept in flight at once (closed loop), or "
        "the most in flight at each level's request_rate (open loop).",
    )
    request_rate: list[PositiveFloat] | None = Field(
        default=None,
        description="Open loop: requests (with turns, conversations) per second at each "
        "concurrency level, in order, arriving whatever the server does; unset, each worker "
        "sends its next request when its last one ends (closed loop).",
        examples=[[2.0, 8.0, 16.0]],
    )
    arrival: Literal["poisson", "constant"] = Field(
        default="poisson",
        description="Open loop: Poisson arrivals, or evenly spaced ones.",
    )
    prompt_words: PositiveInt = Field(
        default=64, description="Words per prompt, each prompt unique from its first word."
    )
    max_tokens: PositiveInt = Field(
        default=64, description="Tokens requested per completion (the most, with output_lengths)."
    )
    prompt_lengths: Lengths | None = Field(
        default=None,
        description="Words per prompt drawn per request, up to prompt_words.",
        examples=[{"distribution": "lognormal", "mean": 48, "spread": 0.5}],
    )
    output_lengths: Lengths | None = Field(
        default=None,
        description="max_tokens drawn per request, up to max_tokens.",
        examples=[{"distribution": "uniform", "low": 16}],
    )
    shared_prefix_words: int = Field(
        default=0,
        ge=0,
        description="Words every prompt starts with (a prefix cache can serve them), within "
        "prompt_words; the server's cache hits are reported where it reports them.",
    )
    prompts_file: Path | None = Field(
        default=None,
        description="JSONL of your own traffic, replayed in order: `prompt` or `messages`, and "
        "optionally `max_tokens` (capped at max_tokens); relative to the project file.",
        examples=["traffic.jsonl"],
    )
    turns: PositiveInt = Field(
        default=1,
        description="Chat turns per conversation (the chat api only): each turn sends the whole "
        "conversation so far, earlier user turns (prompt_words each) and the server's own "
        "streamed answers, so its prefix cache serves what a real chat's would. A "
        "conversation's turns go one after another; conversations run at the level's "
        "concurrency, or arrive at its request_rate.",
        examples=[3],
    )
    client_processes: PositiveInt = Field(
        default=1,
        description="Load client processes per run, when one core cannot send the load (a run "
        "the client could not keep up with is set aside as client-bound).",
    )
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

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.request_rate is not None and len(self.request_rate) != len(self.concurrency):
            raise ValueError("request_rate needs one rate per concurrency level")
        if self.shared_prefix_words and self.shared_prefix_words >= self.prompt_words:
            raise ValueError("shared_prefix_words must be fewer than prompt_words")
        if self.turns > 1 and self.api != "chat":
            raise ValueError('turns above 1 need api = "chat"')
        if self.turns > 1 and self.prompts_file is not None:
            raise ValueError("turns above 1 cannot replay a prompts_file (its lines are requests)")
        return self

    def rate(self, concurrency: int) -> float | None:
        """The open-loop request rate at this concurrency level; None for a closed loop."""
        if self.request_rate is None:
            return None
        return self.request_rate[self.concurrency.index(concurrency)]
