"""Facts: what a running server reports about itself, and the diff against the known-good."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from flagtrial.load.workload import Workload
from flagtrial.redact import Redactor

Scalar = str | int | float | bool | None

# Capacity facts, the names every engine adapter reports where it can.
CAPACITY_LABELS = {
    "concurrent_requests": "concurrent requests",
    "context_per_request": "context per request",
    "kv_tokens": "KV cache tokens",
}


class Limit(BaseModel):
    """One limit the engine applies to the requests it runs at once: its own value (`setting`,
    in its own unit: sequences, tokens) and how many concurrent requests that admits.

    How it admits depends on a request's length (`per`): "request" admits `setting` requests
    whatever their length; "pool" is `setting` tokens every request draws from, in blocks of
    `block` tokens, less `reserved` tokens no request can hold (a KV cache); "context" is the
    most tokens one of `slots` requests may hold (a longer request is never served). `tokens`
    is the request length `admits` is for; None where it is the engine's own figure (vLLM's:
    requests of the full context)."""

    name: str
    setting: float
    admits: float
    source: str
    per: Literal["request", "pool", "context"] = "request"
    block: float = 1.0
    reserved: float = 0.0
    slots: float | None = None
    tokens: float | None = None

    def at(self, tokens: float) -> Limit:
        """This limit for requests of `tokens` tokens (prompt and output)."""
        if self.per == "request":
            return self
        if self.per == "pool":
            blocks = (self.setting - self.reserved) // self.block
            admits = float(blocks // math.ceil(tokens / self.block))
        else:
            admits = float(self.slots or 0) if tokens <= self.setting else 0.0
        return self.model_copy(update={"admits": admits, "tokens": tokens})

    def describe(self) -> str:
        at = f" for {self.tokens:g}-token requests" if self.tokens is not None else ""
        return f"{self.name} = {self.setting:g}{at}"


def binding(limits: list[Limit]) -> Limit | None:
    """The limit that admits the fewest requests: the one that decides concurrency."""
    return min(limits, key=lambda limit: limit.admits) if limits else None


def bind(capacity: dict[str, float], sources: dict[str, str], limits: list[Limit]) -> None:
    """`concurrent_requests` set to what the binding limit admits, named in its source."""
    bound = binding(limits)
    if bound is not None:
        capacity["concurrent_requests"] = bound.admits
        sources["concurrent_requests"] = f"bound by {bound.describe()} ({bound.source})"


class Rewrite(BaseModel):
    """A setting the server resolved to something other than what it was started with."""

    name: str
    asked: Scalar
    got: Scalar
    cause: str | None = None  # the server's own line that says why, where it prints one


class Facts(BaseModel):
    """Facts come from the server (its endpoints and its startup log), never from the flags."""

    engine: str
    version: str | None = None
    capacity: dict[str, float] = Field(default_factory=dict)
    settings: dict[str, Scalar] = Field(default_factory=dict)
    sources: dict[str, str] = Field(default_factory=dict)
    log_lines: list[str] = Field(default_factory=list)
    # Every limit on concurrent requests the engine applies; `concurrent_requests` is the
    # binding one's (engines that report them).
    limits: list[Limit] = Field(default_factory=list)
    # Settings the server rewrote (asked X, got Y), each with its cause line.
    rewrites: list[Rewrite] = Field(default_factory=list)
    # Seconds from the restart to ready, as flagtrial measured it: what a restart costs.
    ready_s: float | None = None
    # Tokens of one workload request (prompt and output), as the server counted the prompt:
    # the limits are evaluated at it; None where no workload was measured.
    request_tokens: float | None = None

    @field_validator("settings", "log_lines")
    @classmethod
    def _no_secrets(cls, v: dict[str, Scalar] | list[str]) -> dict[str, Scalar] | list[str]:
        """Servers echo secrets (SGLang's server_info has api_key, vLLM logs its non-default
        args): redacted as read, so stored, shown and compared alike."""
        redacted: dict[str, Scalar] | list[str] = Redactor().data(v)
        return redacted

    def at_tokens(self, tokens: float | None) -> Facts:
        """These facts for requests of `tokens` tokens: every limit re-evaluated, the binding
        one deciding concurrent requests."""
        if tokens is None:
            return self
        capacity, sources = dict(self.capacity), dict(self.sources)
        limits = [limit.at(tokens) for limit in self.limits]
        bind(capacity, sources, limits)
        return self.model_copy(
            update={"capacity": capacity, "sources": sources, "limits": limits,
                    "request_tokens": tokens}
        )  # fmt: skip


# Prompts of the workload measured per start, the longest one counting; their own seed, so
# that the trial's measured prompts share no prefix with them.
MEASURED_PROMPTS = 4
_MEASURE_SEED = -1


async def request_tokens(base_url: str, workload: Workload) -> float | None:
    """Tokens one request of `workload` holds: its longest prompt as the server counted it
    (usage.prompt_tokens of a one-token completion, so chat templates and special tokens
    count) plus the tokens it asks for. None where the server reports no usage, e.g. it
    refuses the prompt as longer than its context."""
    from flagtrial.load.runner import run_level  # httpx and numpy: only where load is sent

    probe = workload.model_copy(update={"max_tokens": 1, "ignore_eos": False})
    n = max(MEASURED_PROMPTS, workload.turns)  # a chat's first conversation whole
    result = await run_level(base_url, probe, 1, n_requests=n, warmup=False, seed=_MEASURE_SEED)
    counted = [r.prompt_tokens for r in result.records if r.ok and r.prompt_tokens]
    # a chat's last turn is the longest: it re-sends every earlier answer, one token each in
    # the probe, up to max_tokens each in a run
    grown = (workload.turns - 1) * (workload.max_tokens - 1)
    return float(max(counted) + workload.max_tokens + grown) if counted else None


class CapacityChange(BaseModel):
    name: str
    before: float
    after: float
    bound_by: str | None = None  # the candidate's binding limit, for concurrent requests

    @property
    def pct(self) -> float:
        return 0.0 if self.before == 0 else (self.after - self.before) / self.before * 100.0

    def describe(self) -> str:
        label = CAPACITY_LABELS.get(self.name, self.name)
        bound = f", bound by {self.bound_by}" if self.bound_by else ""
        return f"{label} {self.before:g} -> {self.after:g} ({self.pct:+.1f} %){bound}"


class SettingChange(BaseModel):
    name: str
    before: Scalar
    after: Scalar
    named_by_change: bool
    cause: str | None = None  # what the engine recorded as the reason, where it records one
    asked: Scalar = None  # for a setting the server rewrote: what it was started with

    def describe(self) -> str:
        why = f" ({self.cause})" if self.cause else ""
        if self.asked is not None:
            got = f"asked {self.asked!r}, got {self.after!r}"
            return f"{self.name} rewritten by the server: {got}{why}"
        return f"{self.name}: {self.before!r} -> {self.after!r}{why}"


class FactsDiff(BaseModel):
    capacity: list[CapacityChange]
    implicit: list[SettingChange]
    explicit: list[SettingChange]

    def worst_capacity_loss(self) -> CapacityChange | None:
        losses = [c for c in self.capacity if c.pct < 0]
        return min(losses, key=lambda c: c.pct) if losses else None


def diff_facts(before: Facts, after: Facts, named_settings: set[str]) -> FactsDiff:
    """Capacity change for every capacity fact both sides report, both at the same request
    length (the workload's, as whichever side measured it); settings split by whether the
    change named them (explicit) or the server changed them on its own (implicit), a setting
    the server rewrote among the implicit ones with what was asked."""
    tokens = after.request_tokens or before.request_tokens
    before, after = before.at_tokens(tokens), after.at_tokens(tokens)
    bound = binding(after.limits)
    capacity = [
        CapacityChange(
            name=k,
            before=before.capacity[k],
            after=after.capacity[k],
            bound_by=bound.describe() if bound and k == "concurrent_requests" else None,
        )
        for k in before.capacity
        if k in after.capacity
    ]
    implicit: list[SettingChange] = []
    explicit: list[SettingChange] = []
    for key in sorted(set(before.settings) | set(after.settings)):
        old, new = before.settings.get(key), after.settings.get(key)
        if old == new:
            continue
        change = SettingChange(
            name=key,
            before=old,
            after=new,
            named_by_change=key in named_settings,
            cause=after.sources.get(key),
        )
        (explicit if change.named_by_change else implicit).append(change)
    # A cause line may word the same rewrite differently from one start to the next.
    seen = {(r.name, r.asked, r.got) for r in before.rewrites}
    for rewrite in after.rewrites:
        if (rewrite.name, rewrite.asked, rewrite.got) not in seen:
            implicit.append(
                SettingChange(
                    name=rewrite.name,
                    before=next((r.got for r in before.rewrites if r.name == rewrite.name), None),
                    after=rewrite.got,
                    named_by_change=False,
                    cause=rewrite.cause,
                    asked=rewrite.asked,
                )
            )
    return FactsDiff(capacity=capacity, implicit=implicit, explicit=explicit)
