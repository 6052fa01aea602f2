"""A library `Session` from a project file, as a test drives a trial without the CLI: the
project's target (or one given), its engine, its ledger, and `notify` told of every step."""

from __future__ import annotations

from pathlib import Path

from flagtrial.engines.base import ProgressFn
from flagtrial.launch.change import Change
from flagtrial.session import Notify, Session
from flagtrial.targets.base import Target
from flagtrial.trial import Trial, TrialOutcome


def ignore(state: str, detail: str) -> None:
    """A `notify` for tests that do not look at the steps."""


def session_for(
    project_file: Path,
    notify: Notify = ignore,
    *,
    target: Target | None = None,
    progress: ProgressFn | None = None,
) -> Session:
    return Session.open(project_file, notify, progress, target=target)


def recorder(events: list[tuple[str, str]]) -> Notify:
    """A `notify` that appends each (state, detail) to `events`."""
    return lambda state, detail: events.append((state, detail))


async def locked_trial(session: Session, change: Change) -> TrialOutcome:
    """A whole trial of `change` under the target's lock, as `flagtrial trial` runs one; the
    session closed after."""
    try:
        async with session.target.lock("test"):
            return await Trial(session, change).run()
    finally:
        await session.close()
