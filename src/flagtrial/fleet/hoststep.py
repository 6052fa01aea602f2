"""What the promotion play runs on this machine for one host (fleet/promote.yml), as its own
process: `begin` journals the host's promotion before the play installs anything, `verify`
waits for the restarted server, checks its facts against the canary's and sends it a short
health load, `rollback` restores the host's known-good and verifies it. Exit 0 on success;
otherwise one line on stderr and the error's exit code, which fails the task (and so the
host) in Ansible.

    python -m flagtrial.fleet.hoststep --project P --group G --trial T --parent PID:TICKS \
        [--canary C ...] ACTION HOST

Each step first checks that the flagtrial that runs the promotion (PID, started at TICKS) is
still there: when it is gone, the step stops the whole play (its session, led by
ansible-playbook), so nothing more changes on any host before `flagtrial fleet recover`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from flagtrial.errors import FlagtrialError, RollbackError, ServerNotReadyError, UsageError
from flagtrial.fleet.hosts import Fleet
from flagtrial.records import TrialRow
from flagtrial.redact import Redactor
from flagtrial.session import Session, restore_detail, verify_facts
from flagtrial.states import TrialState
from flagtrial.targets.holder import proc_start_ticks
from flagtrial.targets.systemd import SystemdTarget

# After a host's facts match the canary's: this many requests, none may fail.
HEALTH_REQUESTS = 4
HEALTH_SEED = -2  # prompts of their own, apart from the trial's runs and the facts' probe


def host_rows(fleet: Fleet, host: str, trial_id: int) -> list[TrialRow]:
    """The journal rows of `host`'s promotion from canary trial `trial_id`, oldest first."""
    target = fleet.sessions[host].target.name
    return [
        t
        for t in fleet.ledger.trials(target)
        if t.record.get("promotion", {}).get("trial") == trial_id
    ]


def open_row(fleet: Fleet, host: str, trial_id: int) -> TrialRow:
    rows = host_rows(fleet, host, trial_id)
    if not rows or rows[-1].finished_at is not None:
        raise UsageError(f"{host} has no open promotion of trial {trial_id}")
    return rows[-1]


async def begin(fleet: Fleet, host: str, trial_id: int, wave: str) -> None:
    session, ledger = fleet.sessions[host], fleet.ledger
    canary = ledger.trial(trial_id)
    assert canary.candidate_gen is not None
    text = ledger.generation(canary.candidate_gen).spec_text
    name = session.target.name
    good = ledger.last_known_good(name)
    if good is None:
        raise UsageError(f"{host} has no known-good generation to come back to")
    candidate = ledger.record_generation(name, text, note=f"promoted from trial {trial_id}")
    assert isinstance(session.target, SystemdTarget)
    mark = await session.target.log_mark()
    row = ledger.start_trial(name, canary.change, good.id)
    promotion = {"trial": trial_id, "group": fleet.group, "host": host, "wave": wave,
                 "play": play_of_this_step()}  # fmt: skip
    ledger.step(
        row,
        TrialState.INSTALLING,
        f"promotion of trial {trial_id} to {host}, wave {wave}",
        candidate_gen=candidate.id,
        record_json={"promotion": promotion, "mark": mark},
    )


async def verify(fleet: Fleet, host: str, trial_id: int) -> None:
    session, ledger = fleet.sessions[host], fleet.ledger
    row = open_row(fleet, host, trial_id)
    expected = ledger.trial(trial_id).facts_after
    assert expected is not None
    ledger.step(row.id, TrialState.RESTARTING, "restarted by the play")
    facts = await session.read_started(row.record["mark"], time.monotonic())
    mismatches = verify_facts(expected, facts, session.engine.capacity_tolerance_pct)
    if mismatches:
        raise ServerNotReadyError("facts differ from the canary's: " + "; ".join(mismatches))
    ledger.step(row.id, TrialState.FACTS, "facts match the canary's")
    await health_load(session)
    ledger.step(
        row.id,
        TrialState.JUDGED,
        "verified against the canary",
        verdict="KEEP",
        record_json={**row.record, "facts_after": facts.model_dump()},
    )


async def health_load(session: Session) -> None:
    """A short load of the project's workload, one request at a time: every one must succeed."""
    from flagtrial.load.runner import run_level  # httpx and numpy: only where load is sent

    result = await run_level(
        session.project.endpoint,
        session.project.workload,
        1,
        n_requests=HEALTH_REQUESTS,
        warmup=False,
        seed=HEALTH_SEED,
    )
    summary = result.summary
    if summary.n_errors:
        first = next(iter(summary.errors), "")
        raise ServerNotReadyError(
            f"health load: {summary.n_errors} of {summary.n_requests} requests failed ({first})"
        )


async def rollback(session: Session, row: TrialRow, why: str) -> None:
    """Restore the row's baseline, verified, and close its journal (reverted)."""
    ledger = session.ledger
    ledger.step(row.id, TrialState.REVERTING, why, verdict="REVERT")
    baseline = ledger.generation(row.baseline_gen)
    restore = await session.restore(baseline)
    ledger.step(row.id, TrialState.REVERTED, restore_detail(restore), finished_at=time.time())
    if not restore.verified:
        raise RollbackError(f"rolled back, but {restore_detail(restore)}")
    ledger.mark_known_good(baseline.id, restore.facts.model_dump())


def play_of_this_step() -> int:
    """The play this step runs in: its session, whose leader is ansible-playbook."""
    return os.getsid(0)


def stop_play(sid: int) -> bool:
    """Kill the play led by `sid` if it still runs (and is an ansible-playbook)."""
    try:
        leader = Path(f"/proc/{sid}/cmdline").read_bytes()
    except OSError:
        return False
    if b"ansible-playbook" not in leader:
        return False
    os.killpg(sid, signal.SIGKILL)
    return True


def _parent_gone(parent: str) -> bool:
    pid, _, ticks = parent.partition(":")
    return proc_start_ticks(int(pid)) != int(ticks)


async def main(argv: list[str], secrets: Redactor) -> None:
    parser = argparse.ArgumentParser(prog="flagtrial.fleet.hoststep")
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--trial", type=int, required=True)
    parser.add_argument("--parent", required=True, help="PID:TICKS of the promoting flagtrial")
    parser.add_argument("action", choices=("begin", "verify", "rollback"))
    parser.add_argument("host")
    parser.add_argument("--wave", default="")
    parser.add_argument("--why", default="failed")
    parser.add_argument("--canary", action="append", help="the promotion's canaries")
    args = parser.parse_args(argv)
    if _parent_gone(args.parent):
        stop_play(play_of_this_step())
        raise UsageError("the promoting flagtrial is gone: run `flagtrial fleet recover`")
    fleet = Fleet.open(
        args.project, args.group, lambda kind, detail: None, secrets=secrets, canaries=args.canary
    )
    try:
        if args.action == "begin":
            await begin(fleet, args.host, args.trial, args.wave)
        elif args.action == "verify":
            await verify(fleet, args.host, args.trial)
        else:
            row = open_row(fleet, args.host, args.trial)
            await rollback(fleet.sessions[args.host], row, args.why)
    finally:
        await fleet.aclose()


if __name__ == "__main__":
    redactor = Redactor()
    try:
        asyncio.run(main(sys.argv[1:], redactor))
    except FlagtrialError as e:
        print(redactor.text(str(e)), file=sys.stderr)
        sys.exit(e.exit_code)
