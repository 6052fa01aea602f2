"""Facts: what a running server reports about itself, and the diff against the known-good."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

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
    in its own unit: sequences, tokens) and how many concurrent requests that admits."""

    name: str
    setting: float
    admits: float
    source: str

    def describe(self) -> str:
        return f"{self.name} = {self.setting:g}"


def binding(limits: list[Limit]) -> Limit | None:
    """The limit that admits the fewest requests: the one that decides concurrency."""
    return min(limits, key=lambda limit: limit.admits) if limits else None


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
    # Seconds from the restart to ready, as flagtrial measured it: what a restart costs.
    ready_s: float | None = None

    @field_validator("settings", "log_lines")
    @classmethod
    def _no_secrets(cls, v: dict[str, Scalar] | list[str]) -> dict[str, Scalar] | list[str]:
        """Servers echo secrets (SGLang's server_info has api_key, vLLM logs its non-default
        args): redacted as read, so stored, shown and compared alike."""
        return Redactor().data(v)


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

    def describe(self) -> str:
        why = f" ({self.cause})" if self.cause else ""
        return f"{self.name}: {self.before!r} -> {self.after!r}{why}"


class FactsDiff(BaseModel):
    capacity: list[CapacityChange]
    implicit: list[SettingChange]
    explicit: list[SettingChange]

    def worst_capacity_loss(self) -> CapacityChange | None:
        losses = [c for c in self.capacity if c.pct < 0]
        return min(losses, key=lambda c: c.pct) if losses else None

    def capacity_matches(self) -> bool:
        return all(c.pct == 0 for c in self.capacity)


def diff_facts(before: Facts, after: Facts, named_settings: set[str]) -> FactsDiff:
    """Capacity change for every capacity fact both sides report; settings split by whether the
    change named them (explicit) or the server changed them on its own (implicit)."""
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
    return FactsDiff(capacity=capacity, implicit=implicit, explicit=explicit)
