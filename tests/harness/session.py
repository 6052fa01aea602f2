"""A library `Session` from a project file, as a test drives a trial without the CLI: the
project's target (or one given), its engine, its ledger, and `notify` told of every step."""

from __future__ import annotations

from pathlib import Path

from flagtrial.engines import make_engine
from flagtrial.engines.base import ProgressFn
from flagtrial.launch.change import Change
from flagtrial.ledger import Ledger
from flagtrial.settings import load_project
from flagtrial.targets import make_target
from flagtrial.targets.base import Target
from flagtrial.trial import Notify, Session, Trial, TrialOutcome


def ignore(state: str, detail: str) -> None:
    """A `notify` for tests that do not look at the steps."""


def session_for(
    project_file: Path,
    notify: Notify = ignore,
    *,
    target: Target | None = None,
    progress: ProgressFn | None = None,
) -> Session:
    project = load_project(project_file)
    return Session(
        project,
        target if target is not None else make_target(project),
        make_engine(project.engine),
        Ledger(project.ledger_path),
        notify,
        progress,
    )


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
