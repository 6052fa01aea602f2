"""The commands that act on a target outside a trial, as library calls: rollback, recover,
facts, unlock, and whether open trials run. Each takes the target's lock itself (facts only
when it is free); the CLI parses, calls and renders."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from flagtrial.errors import FlagtrialError, LockHeldError, TargetError, UsageError
from flagtrial.facts import Facts
from flagtrial.records import TrialRow
from flagtrial.session import Restore, Session
from flagtrial.settings import Project
from flagtrial.targets import make_target
from flagtrial.targets.base import HostFacts
from flagtrial.targets.holder import LockHolder, held_message, stop_holder
from flagtrial.targets.process import STOP_GRACE_S

Say = Callable[[str], None]


async def rollback(session: Session, to: int | None = None) -> Restore:
    """Restore the last known-good generation (or `to`, one that was known-good once),
    restart and verify its facts; verified, it is the known-good again. Unfinished trials
    are recovered first."""
    ledger, name = session.ledger, session.target.name
    async with session.target.lock("flagtrial rollback"):
        await session.recover()
        gen = ledger.generation(to) if to is not None else ledger.last_known_good(name)
        if gen is None:
            raise FlagtrialError("the ledger has no known-good generation for this target")
        if gen.target != name:
            raise FlagtrialError(f"generation {gen.id} belongs to {gen.target}")
        if not gen.known_good or gen.facts is None:
            # Its facts were never verified: restoring it would make an untried spec the
            # known-good without a trial.
            raise UsageError(
                f"generation {gen.id} was never known-good ({gen.note or 'no note'}): "
                "try it with `flagtrial trial` instead"
            )
        restore = await session.restore(gen)
        if restore.verified:
            ledger.mark_known_good(gen.id, restore.facts.model_dump())
    return restore


async def recover(session: Session) -> dict[int, str]:
    """Finish what a killed flagtrial left (Session.recover), under the lock: each unfinished
    trial's id -> the state it ended in."""
    async with session.target.lock("flagtrial recover"):
        unfinished = session.ledger.unfinished_trials(session.target.name)
        await session.recover()
        return {t.id: session.ledger.trial(t.id).state for t in unfinished}


@dataclass
class FactsReport:
    """The known-good's facts; with `read_only` (why nothing was restarted), those recorded
    and the live server's, read over HTTP."""

    generation: int | None
    facts: Facts | None
    host: HostFacts
    live: Facts | None = None
    read_only: str | None = None


async def read_facts(session: Session) -> FactsReport:
    """The known-good, running and read: started (holding the lock) only for a first baseline
    or when it is down. While another command holds the lock, or a trial is left unfinished,
    it restarts nothing and reads what it can."""
    target = session.target
    async with contextlib.AsyncExitStack() as stack:
        held: LockHeldError | None = None
        try:
            await stack.enter_async_context(target.lock("flagtrial facts"))
        except LockHeldError as e:
            held = e
        left = [] if held else session.ledger.unfinished_trials(target.name)
        if held or left:
            why = str(held) if held else "; ".join(
                f"trial {t.id} was left unfinished ({t.state}): run `flagtrial recover`"
                for t in left
            )  # fmt: skip
            return await _read_only(session, why, held)
        good, _, known = await session.known_good()
        return FactsReport(generation=good.id, facts=known, host=await target.host_facts())


async def _read_only(session: Session, why: str, held: LockHeldError | None) -> FactsReport:
    """What can be read without restarting anything: the known-good's recorded facts and the
    live server's, over HTTP; neither: the reason is the error."""
    good = session.ledger.last_known_good(session.target.name)
    known = Facts.model_validate(good.facts) if good and good.facts else None
    live = await session.live_facts()
    if live is None and known is None:
        raise held or FlagtrialError(why)
    host = await session.target.host_facts()
    return FactsReport(good.id if good else None, known, host, live, why)


@dataclass
class UnlockReport:
    lock: str  # "free", "broken" (its holder was gone) or "forced"
    holder: str | None  # who held it
    trials: dict[int, str] = field(default_factory=dict)  # trial id -> state


async def unlock(session: Session, say: Say, *, force: bool = False) -> UnlockReport:
    """Free the target's lock when its holder is gone. A holder that still runs is named and
    left alone (LockHeldError) unless `force`: then it is stopped and its trial recovered."""
    target, ledger = session.target, session.ledger
    holder = await target.lock_holder()
    report = UnlockReport("free", holder.info if holder else None)
    if holder is None:
        say("the lock was free")
    elif holder.alive is False:
        report.lock = "broken"
        await target.break_lock(holder)
        say(f"broke the lock held by {holder.info}, which was gone")
    elif not force:
        raise LockHeldError("left alone: " + held_message(target.name, holder))
    else:
        report.lock = "forced"
        running = ledger.unfinished_trials(target.name)
        await _stop_holder(session, holder, say)
        async with target.lock("flagtrial unlock --force"):
            await session.recover()
        for t in running:
            report.trials[t.id] = ledger.trial(t.id).state
            say(f"trial {t.id} ended {report.trials[t.id]}")
    if report.lock != "forced":
        for t in ledger.unfinished_trials(target.name):
            report.trials[t.id] = t.state
            say(f"trial {t.id} is unfinished ({t.state}): run `flagtrial recover`")
    return report


async def _stop_holder(session: Session, holder: LockHolder, say: Say) -> None:
    """Stop a live holder (on this machine: signals; elsewhere only its lock can be broken),
    and free what its lock leaves on the host."""
    target = session.target
    if holder.alive and holder.host == socket.gethostname():
        # long enough for its own rollback: a stop, a start and the wait until ready
        grace = session.project.ready_timeout_s + STOP_GRACE_S
        killed = await stop_holder(holder, grace)
        how = f"killed (still running {grace:g}s after SIGTERM)" if killed else "stopped"
        say(f"{how} {holder.info}")
    else:
        say(f"breaking the lock of {holder.info}, on another machine: stop it there")
    if (left := await target.lock_holder()) is not None:
        await target.break_lock(left)


async def open_trials(project: Project, trials: list[TrialRow]) -> list[str]:
    """Whether each trial with an open journal runs (its holder holds the lock) or was left
    unfinished (its holder is gone): only the target's lock tells."""
    holder, unknown = None, ""
    target = make_target(project)
    try:
        holder = await target.lock_holder()
    except TargetError as e:
        unknown = f"cannot tell whether it runs: {e}"
    finally:
        await target.aclose()
    lines = []
    for t in trials:
        what = f"trial {t.id} ({t.state})"
        if t.target != target.name:
            lines.append(f"{what} is on {t.target}: run history with that target's project")
        elif unknown:
            lines.append(f"{what} has an open journal; {unknown}")
        elif holder is None:
            lines.append(f"{what} is unfinished, its holder is gone: run `flagtrial recover`")
        elif holder.alive is False:
            lines.append(f"{what} is unfinished: {held_message(target.name, holder)}")
        else:
            where = "" if holder.alive else " (on another machine)"
            lines.append(f"{what} is running, held by {holder.info}{where}")
    return lines
