"""What every measurement design shares: runs and restart blocks as the procedure keeps
them, and the protocol one design implements (flagtrial.sequential drives it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from flagtrial import stats
from flagtrial.load.summary import RunSummary
from flagtrial.reasons import Reason

if TYPE_CHECKING:
    from flagtrial.judge import Effect
    from flagtrial.sequential import Continue, Sequential, Stop

Arm = Literal["baseline", "candidate"]
DesignKind = Literal["interleaved", "before-after"]
# "before": the first block, the known-good as found, the same in every design
Phase = Literal["interleaved", "before", "after", "recheck"]


@dataclass
class Run:
    arm: Arm
    block: int
    level: int
    summary: RunSummary
    values: dict[str, float]
    disturbed: str | None  # why the run is set aside; None: it counts
    at_s: float
    flagged: str | None = None  # hygiene's reason, set aside or not (set_aside_disturbed)


@dataclass
class Block:
    arm: Arm
    index: int
    phase: Phase
    passes: int = 0
    pending: set[int] = field(default_factory=set)
    # before-after's re-check block: why the candidate phase ended, and its interval then
    opened_by: Reason | None = None
    interim: stats.Interval | None = None


class Design(Protocol):
    """One measurement design: a value (shared by any number of trials); what one trial has
    measured is the Sequential's, passed in."""

    @property
    def kind(self) -> DesignKind: ...

    @property
    def runs_per_block(self) -> int: ...

    @property
    def why(self) -> str: ...

    def next(self, seq: Sequential, block: Block) -> Continue | Stop:
        """After `block` (every level observed): measure more, or stop (Sequential.stop)."""
        ...

    def interval(self, seq: Sequential, metric: str, level: int) -> stats.Interval | None:
        """The effect's interval on log scale as the verdict reads it."""
        ...

    def interval_now(self, seq: Sequential, metric: str, level: int) -> stats.Interval | None:
        """A guardrail metric's interval while measuring, for the stopping rule (None: this
        design has none before the end)."""
        ...

    def notes(self, seq: Sequential, effects: list[Effect]) -> list[Reason]:
        """Reasons this design adds to a stop."""
        ...
