"""Promotion of a change kept on the canary to the rest of its group, in waves, by
ansible-core driven by ansible-runner (the play is promote.yml beside this file; its
flagtrial steps are hoststep.py). `serial` and `max_fail_percentage` are the play's own.

Before: every host's known-good read (and recorded) under its lock, hosts that differ from
the canary named. After the play: a failure budget exceeded in any wave rolls every
promoted host back, the canary too, each verified; otherwise each verified host keeps the
new generation as its known-good. A host the play left unfinished (it became unreachable)
is recovered when it answers, else left for `flagtrial fleet recover`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from flagtrial.errors import FlagtrialError, TargetError
from flagtrial.facts import Facts
from flagtrial.fleet.hosts import Fleet, host_endpoint
from flagtrial.fleet.hoststep import host_rows, rollback, stop_play
from flagtrial.fleet.inventory import FleetHost
from flagtrial.launch.spec import encode_spec
from flagtrial.records import TrialRow
from flagtrial.session import Session, restore_detail
from flagtrial.states import TrialState
from flagtrial.targets.holder import proc_start_ticks

if TYPE_CHECKING:
    from flagtrial.launch.change import Change
    from flagtrial.trial import TrialOutcome

PLAY = Path(__file__).with_name("promote.yml")

Outcome = Literal["promoted", "rolled back", "unfinished", "not reached"]


class HostOutcome(BaseModel):
    name: str
    outcome: Outcome
    wave: int | None = None  # 1, 2, ...: the wave it was in
    trial_id: int | None = None  # the host's promotion journal
    detail: str = ""


class Wave(BaseModel):
    hosts: list[str]
    failed: int
    seconds: float


class Promotion(BaseModel):
    trial_id: int  # the canary's trial
    group: str
    canary: str
    play: str  # ansible-runner's status of the play
    waves: list[Wave]
    hosts: list[HostOutcome]
    budget_exceeded: bool
    canary_rolled_back: bool = False

    def count(self, outcome: Outcome) -> int:
        return sum(h.outcome == outcome for h in self.hosts)


def stop_left_plays(fleet: Fleet) -> list[int]:
    """Kill what a killed promotion's play may still run: the play of every host journal left
    open (its flagtrial is gone: the caller got the hosts' locks)."""
    plays = {
        int(t.record["promotion"]["play"])
        for s in fleet.sessions.values()
        for t in fleet.ledger.unfinished_trials(s.target.name)
        if "play" in t.record.get("promotion", {})
    }
    return [sid for sid in sorted(plays) if stop_play(sid)]


async def recover(fleet: Fleet) -> dict[str, dict[int, str] | FlagtrialError]:
    """`fleet recover`: under every host's lock, a killed promotion's play stopped, then each
    host's unfinished journals finished (Session.recover: a host verified on the new
    generation keeps it, any other goes back to its known-good, verified): per host, each
    journal's id -> the state it ended in."""

    async def one(host: FleetHost, session: Session) -> dict[int, str]:
        left = session.ledger.unfinished_trials(session.target.name)
        await session.recover()
        return {t.id: session.ledger.trial(t.id).state for t in left}

    async with contextlib.AsyncExitStack() as stack:
        for host in fleet.hosts:
            target = fleet.sessions[host.name].target
            await stack.enter_async_context(target.lock("flagtrial fleet recover"))
        stop_left_plays(fleet)
        return await fleet.each(fleet.hosts, one)


async def prepare(fleet: Fleet) -> dict[str, Facts]:
    """Every host's known-good, running and read (a host without one recorded is restarted
    once to read it), its unfinished journals recovered first; a host that cannot be read
    stops everything before any change (TargetError, exit 5). The caller holds the locks."""

    async def read(host: FleetHost, session: Session) -> Facts:
        _, _, facts = await session.known_good()
        return facts

    stop_left_plays(fleet)
    results = await fleet.each(fleet.hosts, read)
    failed = {name: r for name, r in results.items() if isinstance(r, FlagtrialError)}
    if failed:
        raise TargetError(
            f"{len(failed)} of {len(results)} hosts of {fleet.group} cannot be read, nothing "
            "changed: " + "; ".join(f"{name}: {e}" for name, e in failed.items())
        )
    facts = {name: r for name, r in results.items() if isinstance(r, Facts)}
    await name_differences(fleet, facts)
    return facts


async def name_differences(fleet: Fleet, facts: dict[str, Facts]) -> None:
    """A host whose GPUs, driver or engine version differ from the canary's is named before
    any wave reaches it."""

    async def gpus(host: FleetHost, session: Session) -> list[str]:
        found = await session.target.host_facts()
        return [f"{g.name} (SM {g.compute_cap}, driver {g.driver_version})" for g in found.gpus]

    seen = await fleet.each(fleet.hosts, gpus)
    canary_gpus, canary_version = seen[fleet.canary], facts[fleet.canary].version
    for host in fleet.others:
        session = fleet.sessions[host.name]
        if seen[host.name] != canary_gpus:
            session.notify("host differs", f"GPUs {seen[host.name]} vs the canary's {canary_gpus}")
        if facts[host.name].version != canary_version:
            session.notify(
                "host differs",
                f"{facts[host.name].engine} {facts[host.name].version} vs the canary's "
                f"{canary_version}",
            )


def _ssh_args(fleet: Fleet) -> dict[str, str]:
    """The project's [ssh] settings as Ansible's ssh connection takes them (the inventory's
    own host vars still win)."""
    ssh, project = fleet.project.ssh, fleet.project
    args = ["-o", "StrictHostKeyChecking=" + ("accept-new" if ssh.accept_new_host_key else "yes")]
    if ssh.known_hosts:
        args += ["-o", f"UserKnownHostsFile={project.path(ssh.known_hosts)}"]
    if ssh.ssh_config:
        args += ["-F", str(project.path(ssh.ssh_config))]
    if ssh.proxy_jump:
        args += ["-J", ssh.proxy_jump]
    env = {
        "ANSIBLE_SSH_COMMON_ARGS": shlex.join(args),
        "ANSIBLE_TIMEOUT": str(int(ssh.connect_timeout_s)),
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
    }
    if ssh.identity_file:
        env["ANSIBLE_PRIVATE_KEY_FILE"] = str(project.path(ssh.identity_file))
    return env


def _run_play(
    fleet: Fleet, trial_id: int, candidate: str, data_dir: Path, stop: threading.Event
) -> str:
    import ansible_runner

    candidate_file = data_dir / "candidate"
    candidate_file.write_bytes(encode_spec(candidate))
    policy = fleet.project.fleet
    parent = f"{os.getpid()}:{proc_start_ticks(os.getpid())}"
    step = [sys.executable, "-m", "flagtrial.fleet.hoststep", "--project",
            str(fleet.project_file), "--group", fleet.group, "--trial", str(trial_id),
            "--parent", parent]  # fmt: skip
    extravars: dict[str, Any] = {
        "ft_hosts": ",".join(h.name for h in fleet.others),
        "ft_serial": policy.serial,
        "ft_max_fail_percentage": policy.max_fail_percentage,
        "ft_pause_s": policy.pause_s,
        "ft_unit": fleet.unit,
        "ft_spec_path": fleet.project.spec_path or "",
        "ft_candidate_file": str(candidate_file),
        "ft_step": step,
        "ft_endpoints": {
            h.name: host_endpoint(fleet.project.endpoint, h.address) for h in fleet.others
        },
    }
    runner = ansible_runner.run(
        private_data_dir=str(data_dir),
        playbook=str(PLAY),
        inventory=str(fleet.inventory),
        extravars=extravars,
        # ansible-playbook from this interpreter's environment, where ansible-core is
        envvars={**_ssh_args(fleet), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
        forks=policy.forks,
        quiet=True,
        cancel_callback=stop.is_set,
        event_handler=lambda event: _tell(fleet, event),
    )
    return str(runner.status)


_RESULTS = {"runner_on_ok": "done", "runner_on_failed": "failed",
            "runner_on_unreachable": "unreachable"}  # fmt: skip


def _tell(fleet: Fleet, event: dict[str, Any]) -> bool:
    """Each host's task results as the play reports them (ansible-runner's events)."""
    data = event.get("event_data", {})
    result = _RESULTS.get(str(event.get("event")))
    host = data.get("host")
    if result and host in fleet.sessions and not data.get("ignore_errors"):
        fleet.sessions[host].notify("promoting", f"{data.get('task', '')}: {result}")
    return True  # keep the event in the artifacts


async def promote(fleet: Fleet, trial_id: int) -> Promotion:
    """Run the waves for canary trial `trial_id` (judged KEEP and kept), then settle every
    host: kept, or rolled back and verified. The caller holds every host's lock."""
    ledger = fleet.ledger
    canary_trial = ledger.trial(trial_id)
    assert canary_trial.candidate_gen is not None
    candidate = ledger.generation(canary_trial.candidate_gen).spec_text
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="flagtrial-ansible-") as tmp:
        play = asyncio.ensure_future(
            asyncio.to_thread(_run_play, fleet, trial_id, candidate, Path(tmp), stop)
        )
        try:
            status = await asyncio.shield(play)
        except asyncio.CancelledError:
            # Ctrl-C or SIGTERM: the play stops at its next event, every host goes back.
            stop.set()
            await play
            await settle(fleet, trial_id, "canceled", roll_back_all=True)
            raise
    return await settle(fleet, trial_id, status)


def _wave_of(row: TrialRow) -> str:
    return str(row.record.get("promotion", {}).get("wave", ""))


async def settle(
    fleet: Fleet, trial_id: int, status: str, *, roll_back_all: bool = False
) -> Promotion:
    """After the play: the budget judged per wave (as the play's max_fail_percentage does),
    then every host kept or rolled back, each verified."""
    ledger, budget = fleet.ledger, fleet.project.fleet.max_fail_percentage
    rows = {h.name: host_rows(fleet, h.name, trial_id) for h in fleet.others}
    last = {name: r[-1] for name, r in rows.items() if r}
    waves: dict[str, list[TrialRow]] = {}
    for row in sorted(last.values(), key=lambda r: r.id):  # journaled in wave order
        waves.setdefault(_wave_of(row), []).append(row)
    number = {wave: i for i, wave in enumerate(waves, 1)}

    def failed(row: TrialRow) -> bool:
        return row.state != TrialState.JUDGED

    failures = {wave: sum(map(failed, group)) for wave, group in waves.items()}
    exceeded = roll_back_all or any(
        100 * failures[wave] / len(wave.split(",")) > budget for wave in waves
    )
    if status != "successful" and len(last) < len(fleet.others):
        exceeded = True  # the play stopped before it reached every host

    async def finish(host: FleetHost, session: Session) -> HostOutcome:
        row = last.get(host.name)
        if row is None:
            return HostOutcome(name=host.name, outcome="not reached")
        out = HostOutcome(name=host.name, outcome="unfinished", wave=number[_wave_of(row)],
                          trial_id=row.id)  # fmt: skip
        if row.state == TrialState.JUDGED and not exceeded:
            assert row.candidate_gen is not None and row.facts_after is not None
            ledger.step(row.id, TrialState.KEPT, "promoted", finished_at=time.time())
            ledger.mark_known_good(row.candidate_gen, row.record["facts_after"])
            out.outcome, out.detail = "promoted", "verified against the canary"
        elif row.state == TrialState.JUDGED:
            await rollback(session, row, "the promotion went past its failure budget")
            out.outcome, out.detail = "rolled back", "the promotion went past its failure budget"
        elif row.state == TrialState.REVERTED:
            out.outcome = "rolled back"
            why = (e.detail for e in ledger.events(row.id) if e.state == TrialState.REVERTING)
            out.detail = " ".join(next(why, "").split())  # one line: Ansible's may be several
        else:
            # Cut off inside the play (the host stopped answering): recovered when it answers.
            try:
                await session.recover()
            except FlagtrialError as e:
                out.detail = f"{e}: run `flagtrial fleet recover {fleet.group}`"
                return out
            out.outcome, out.detail = "rolled back", ledger.events(row.id)[-1].detail
        return out

    results = await fleet.each(fleet.others, finish)
    outcomes = [
        r
        if isinstance(r, HostOutcome)
        else HostOutcome(name=n, outcome="unfinished", detail=str(r))
        for n, r in results.items()
    ]
    canary_back = False
    if exceeded:
        canary_back = await _roll_back_canary(fleet, trial_id)
    return Promotion(
        trial_id=trial_id,
        group=fleet.group,
        canary=fleet.canary,
        play=status,
        waves=[_timing(fleet, wave, group, failures[wave]) for wave, group in waves.items()],
        hosts=outcomes,
        budget_exceeded=exceeded,
        canary_rolled_back=canary_back,
    )


async def _roll_back_canary(fleet: Fleet, trial_id: int) -> bool:
    session, ledger = fleet.sessions[fleet.canary], fleet.ledger
    baseline = ledger.generation(ledger.trial(trial_id).baseline_gen)
    restore = await session.restore(baseline)
    session.notify("rolled back", restore_detail(restore))
    if restore.verified:
        ledger.mark_known_good(baseline.id, restore.facts.model_dump())
    return restore.verified


def _timing(fleet: Fleet, wave: str, rows: list[TrialRow], failed: int) -> Wave:
    """A wave's hosts, its failures, and its time: from its first host's install journaled
    to its last host verified or rolled back (within the play)."""
    times = [
        e.at
        for row in rows
        for e in fleet.ledger.events(row.id)
        if e.state in (TrialState.PLANNED, TrialState.JUDGED, TrialState.REVERTED)
    ]
    return Wave(hosts=wave.split(","), failed=failed, seconds=max(times) - min(times))


async def fleet_trial(
    fleet: Fleet, change: Change, *, force: bool = False
) -> tuple[TrialOutcome, Promotion | None]:
    """`trial --fleet`: every host locked and its known-good read, the trial on the canary,
    and on KEEP the promotion to the rest (None when the canary's verdict is not KEEP)."""
    from flagtrial.trial import Trial

    async with contextlib.AsyncExitStack() as stack:
        for host in fleet.hosts:
            target = fleet.sessions[host.name].target
            await stack.enter_async_context(target.lock("flagtrial trial --fleet"))
        await prepare(fleet)
        outcome = await Trial(fleet.sessions[fleet.canary], change, force=force).run()
        if outcome.verdict.decision != "KEEP" or outcome.outcome != "kept":
            return outcome, None
        return outcome, await promote(fleet, outcome.trial_id)
