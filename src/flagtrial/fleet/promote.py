"""Promotion of a change kept on the canaries to the rest of their group, in waves, by
ansible-core driven by ansible-runner (the play is promote.yml beside this file; its
flagtrial steps are hoststep.py). `serial` and `max_fail_percentage` are the play's own.

Before: every host's known-good read (and recorded) under its lock; hosts whose GPUs,
driver or engine version differ from the first canary's named, each with the source gate
analysis run for its own hardware (a host where the change fails at startup is skipped).
Then a trial on each canary in turn: one that does not keep the change stops everything
and every canary that kept it goes back. After the play: a failure budget exceeded in any
wave rolls every promoted host back, the canaries too, each verified; otherwise each
verified host keeps the new generation as its known-good. A host the play left unfinished
(it became unreachable) is recovered when it answers, else left for `flagtrial fleet
recover`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from flagtrial.engines import GATED
from flagtrial.errors import FlagtrialError, TargetError
from flagtrial.facts import Facts
from flagtrial.fleet.hosts import Fleet, host_endpoint
from flagtrial.fleet.hoststep import host_rows, rollback, stop_play
from flagtrial.fleet.inventory import FleetHost
from flagtrial.launch.spec import encode_spec
from flagtrial.preflight import GateReport, gates
from flagtrial.records import TrialRow
from flagtrial.session import Session, restore_detail
from flagtrial.settings import DeclaredGpu
from flagtrial.states import TrialState
from flagtrial.targets.base import HostFacts, Target
from flagtrial.targets.holder import proc_start_ticks

if TYPE_CHECKING:
    from flagtrial.launch.change import Change
    from flagtrial.trial import TrialOutcome

PLAY = Path(__file__).with_name("promote.yml")
# A play stopped here leaves the module it ran on a host running there (it was sent over SSH:
# a copy's rename can land a second later). Each promotion's modules run from a directory of
# their own (Ansible's remote_tmp), so their command lines name it and can be waited for.
MODULES_DIR = "flagtrial-promotion-{trial}"
REMOTE_TMP = "~/.ansible/tmp/" + MODULES_DIR
MODULES_POLL_S = 0.5
MODULES_TIMEOUT_S = 120.0

Outcome = Literal["promoted", "rolled back", "unfinished", "not reached", "skipped"]


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
    trial_id: int  # the first canary's trial: the facts every host is checked against
    group: str
    canaries: list[str]
    play: str  # ansible-runner's status of the play
    waves: list[Wave]
    hosts: list[HostOutcome]
    budget_exceeded: bool
    canary_rolled_back: bool = False  # every canary, each verified

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
        for row in left:
            if "promotion" in row.record:
                await wait_for_modules(session.target, int(row.record["promotion"]["trial"]))
        await session.recover()
        return {t.id: session.ledger.trial(t.id).state for t in left}

    async with contextlib.AsyncExitStack() as stack:
        for host in fleet.hosts:
            target = fleet.sessions[host.name].target
            await stack.enter_async_context(target.lock("flagtrial fleet recover"))
        stop_left_plays(fleet)
        return await fleet.each(fleet.hosts, one)


async def wait_for_modules(target: Target, trial_id: int) -> None:
    """Until no module of promotion `trial_id`'s play runs on the host, read twice a poll
    apart (an exec the play's SSH master had been asked for starts late)."""
    # The bracket keeps this command's own command line (and its shell's) from matching.
    pattern = "[f]" + MODULES_DIR.format(trial=trial_id).removeprefix("f") + "/"
    script = f"grep -l -a -e '{pattern}' /proc/[0-9]*/cmdline 2>/dev/null; true"
    deadline, empty = time.monotonic() + MODULES_TIMEOUT_S, 0
    while True:
        rc, out = await target.run(["sh", "-c", script])
        if rc != 0:
            raise TargetError(f"cannot read the processes on {target.name}: {out}")
        empty = empty + 1 if not out.strip() else 0
        if empty == 2:
            return
        if time.monotonic() > deadline:
            raise TargetError(
                f"the promotion's Ansible module still runs on {target.name} after "
                f"{MODULES_TIMEOUT_S:.0f} s"
            )
        await asyncio.sleep(MODULES_POLL_S)


@dataclass
class HostRead:
    """A host as `trial --fleet` reads it before any change: its known-good's facts and the
    host's own (GPUs, kernel)."""

    facts: Facts
    host: HostFacts


async def prepare(fleet: Fleet) -> dict[str, HostRead]:
    """Every host's known-good, running and read (a host without one recorded is restarted
    once to read it), its unfinished journals recovered first; a host that cannot be read
    stops everything before any change (TargetError, exit 5). The caller holds the locks."""

    async def read(host: FleetHost, session: Session) -> HostRead:
        _, _, facts = await session.known_good()
        return HostRead(facts, await session.target.host_facts())

    stop_left_plays(fleet)
    results = await fleet.each(fleet.hosts, read)
    failed = {name: r for name, r in results.items() if isinstance(r, FlagtrialError)}
    if failed:
        raise TargetError(
            f"{len(failed)} of {len(results)} hosts of {fleet.group} cannot be read, nothing "
            "changed: " + "; ".join(f"{name}: {e}" for name, e in failed.items())
        )
    return {name: r for name, r in results.items() if isinstance(r, HostRead)}


def gpus_of(host: HostFacts, declared: DeclaredGpu) -> list[str]:
    """A host's GPUs as the gate analysis sees them: nvidia-smi's, else the declared ones."""
    if host.gpus:
        return [f"{g.name} (SM {g.compute_cap}, driver {g.driver_version})" for g in host.gpus]
    if declared.compute_cap:
        cuda = f", CUDA {declared.cuda}" if declared.cuda else ""
        return [f"{declared.count} x SM {declared.compute_cap} (declared{cuda})"]
    if declared.gfx:
        rocm = f", ROCm {declared.rocm}" if declared.rocm else ""
        return [f"{declared.count} x {declared.gfx} (declared{rocm})"]
    return []


async def host_gates(session: Session, version: str | None, change: Change) -> GateReport:
    """The gate analysis of `change` on one host as preflight runs it: its installed spec,
    its engine version, its own GPUs (or its declared ones)."""
    spec = await session.target.read_spec()
    checked = await session.check_change(spec, change)
    return await gates(session, version, change, spec, checked, await session.target.host_facts())


def gate_differences(canary: GateReport, host: GateReport) -> list[str]:
    """The host's findings that differ from the canary's, one line each."""
    theirs = {f.flag: f.outcome.value for f in canary.findings}
    lines = [
        f"{f.flag}: {f.outcome.value} here ({f.reason}), {theirs.get(f.flag, 'not analysed')} "
        "on the canary"
        for f in host.findings
        if theirs.get(f.flag) != f.outcome.value
    ]
    if host.skipped and host.skipped != canary.skipped:
        lines.append(host.skipped)
    return lines


@dataclass
class Differences:
    """Hosts that differ from the first canary: what differs, and the gate findings for
    their own hardware that differ from the canary's."""

    named: dict[str, list[str]] = field(default_factory=dict)
    findings: dict[str, list[str]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # the change fails at startup there


async def name_differences(fleet: Fleet, change: Change, read: dict[str, HostRead]) -> Differences:
    """A host whose GPUs, driver or engine version differ from the first canary's is named
    before any trial or wave, with the gate analysis run for its hardware and engine version
    beside the canary's. A host (not a canary: its own trial refuses) where the change fails
    at startup per that analysis, or cannot apply, is skipped: left on its known-good."""
    found = Differences()
    first = fleet.canary

    def seen(name: str) -> list[str]:
        return gpus_of(read[name].host, fleet.sessions[name].project.gpu)

    for host in fleet.hosts:
        name, lines = host.name, []
        if name != first and seen(name) != seen(first):
            lines.append(
                f"GPUs {seen(name) or 'not known'} vs the canary's {seen(first) or 'not known'}"
            )
        mine, theirs = read[name].facts, read[first].facts
        if mine.version != theirs.version:
            lines.append(f"{mine.engine} {mine.version} vs the canary's {theirs.version}")
        if lines:
            found.named[name] = lines
    if not found.named:
        return found
    checked = [h for h in fleet.hosts if h.name == first or h.name in found.named]
    reports = await fleet.each(
        checked, lambda h, s: host_gates(s, read[h.name].facts.version, change)
    )
    reference = reports[first]
    for name, lines in found.named.items():
        session, report = fleet.sessions[name], reports[name]
        refusal: str | None
        session.notify("host differs", "; ".join(lines))
        if isinstance(report, FlagtrialError):
            refusal, found.findings[name] = str(report), [f"the change cannot apply: {report}"]
        elif isinstance(reference, FlagtrialError):  # the canary's own trial will say why
            refusal = report.refusal()
            found.findings[name] = [f"{f.flag}: {f.outcome.value} here" for f in report.findings]
        else:
            refusal = report.refusal()
            found.findings[name] = gate_differences(reference, report) or [
                "the same gate findings as the canary's"
                if fleet.project.engine in GATED
                else f"no source gate analysis for {fleet.project.engine}: the change's flags "
                "checked against this host's server"
            ]
        for line in found.findings[name]:
            session.notify("gates", line)
        if refusal is not None and name not in fleet.canaries:
            found.skipped[name] = refusal
            session.notify("skipped", f"left on its known-good: {refusal}")
    return found


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
    fleet: Fleet,
    trial_id: int,
    targets: list[FleetHost],
    candidate: str,
    data_dir: Path,
    stop: threading.Event,
) -> str:
    import ansible_runner

    candidate_file = data_dir / "candidate"
    candidate_file.write_bytes(encode_spec(candidate))
    policy = fleet.project.fleet
    parent = f"{os.getpid()}:{proc_start_ticks(os.getpid())}"
    step = [sys.executable, "-m", "flagtrial.fleet.hoststep", "--project",
            str(fleet.project_file), "--group", fleet.group, "--trial", str(trial_id),
            "--parent", parent]  # fmt: skip
    step += [word for name in fleet.canaries for word in ("--canary", name)]
    extravars: dict[str, Any] = {
        "ft_hosts": ",".join(h.name for h in targets),
        "ft_serial": policy.serial,
        "ft_max_fail_percentage": policy.max_fail_percentage,
        "ft_pause_s": policy.pause_s,
        "ft_unit": fleet.unit,
        "ft_spec_path": fleet.project.spec_path or "",
        "ft_candidate_file": str(candidate_file),
        "ft_step": step,
        "ft_endpoints": {h.name: host_endpoint(fleet.project.endpoint, h.address) for h in targets},
    }
    runner = ansible_runner.run(
        private_data_dir=str(data_dir),
        playbook=str(PLAY),
        inventory=str(fleet.inventory),
        extravars=extravars,
        # ansible-playbook from this interpreter's environment, where ansible-core is
        envvars={
            **_ssh_args(fleet),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            # each module a file under it, so a stopped play's last module can be waited for
            "ANSIBLE_REMOTE_TMP": REMOTE_TMP.format(trial=trial_id),
            "ANSIBLE_PIPELINING": "False",
        },
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


async def promote(fleet: Fleet, trials: dict[str, int], skipped: dict[str, str]) -> Promotion:
    """Run the waves for the canaries' `trials` (each judged KEEP and kept), to every other
    host but the `skipped` ones, then settle every host: kept, or rolled back and verified.
    The caller holds every host's lock."""
    ledger, trial_id = fleet.ledger, trials[fleet.canary]
    canary_trial = ledger.trial(trial_id)
    assert canary_trial.candidate_gen is not None
    candidate = ledger.generation(canary_trial.candidate_gen).spec_text
    targets = [h for h in fleet.others if h.name not in skipped]
    if not targets:
        return await settle(fleet, trials, skipped, "successful")
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="flagtrial-ansible-") as tmp:
        play = asyncio.ensure_future(
            asyncio.to_thread(_run_play, fleet, trial_id, targets, candidate, Path(tmp), stop)
        )
        try:
            status = await asyncio.shield(play)
        except asyncio.CancelledError:
            # Ctrl-C or SIGTERM: the play stops at its next event, every host goes back.
            stop.set()
            await play
            await settle(fleet, trials, skipped, "canceled", roll_back_all=True)
            raise
    return await settle(fleet, trials, skipped, status)


def _wave_of(row: TrialRow) -> str:
    return str(row.record.get("promotion", {}).get("wave", ""))


async def settle(
    fleet: Fleet,
    trials: dict[str, int],
    skipped: dict[str, str],
    status: str,
    *,
    roll_back_all: bool = False,
) -> Promotion:
    """After the play: the budget judged per wave (as the play's max_fail_percentage does),
    then every host kept or rolled back, each verified. A skipped host was in no wave: it
    is outside the budget."""
    ledger, budget = fleet.ledger, fleet.project.fleet.max_fail_percentage
    trial_id = trials[fleet.canary]
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
    if status != "successful" and len(last) < len(fleet.others) - len(skipped):
        exceeded = True  # the play stopped before it reached every host

    async def finish(host: FleetHost, session: Session) -> HostOutcome:
        row = last.get(host.name)
        if host.name in skipped:
            return HostOutcome(name=host.name, outcome="skipped", detail=skipped[host.name])
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
            # Cut off inside the play (stopped, or the host stopped answering): recovered
            # when it answers, once the module the play left running there has ended.
            try:
                await wait_for_modules(session.target, trial_id)
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
        canary_back = await roll_back_canaries(fleet, trials)
    return Promotion(
        trial_id=trial_id,
        group=fleet.group,
        canaries=fleet.canaries,
        play=status,
        waves=[_timing(fleet, wave, group, failures[wave]) for wave, group in waves.items()],
        hosts=outcomes,
        budget_exceeded=exceeded,
        canary_rolled_back=canary_back,
    )


async def roll_back_canaries(fleet: Fleet, trials: dict[str, int]) -> bool:
    """Each canary of `trials` (name: its kept trial) back on that trial's baseline, one
    after another; True when every restore was verified."""
    ledger, verified = fleet.ledger, True
    for name, trial_id in trials.items():
        session = fleet.sessions[name]
        baseline = ledger.generation(ledger.trial(trial_id).baseline_gen)
        restore = await session.restore(baseline)
        session.notify("rolled back", restore_detail(restore))
        if restore.verified:
            ledger.mark_known_good(baseline.id, restore.facts.model_dump())
        verified = verified and restore.verified
    return verified


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


@dataclass
class FleetTrial:
    """What `trial --fleet` did: each canary's trial in the order they ran (the last is the
    one that stopped it, when one did), the canaries rolled back because a later one did not
    keep the change, the hosts differences named, and the promotion (None: not promoted)."""

    canaries: dict[str, TrialOutcome]
    differences: Differences
    rolled_back: list[str] = field(default_factory=list)
    promotion: Promotion | None = None

    @property
    def stopped_by(self) -> str | None:
        """The canary whose trial did not keep the change, if one did not."""
        name, last = next(reversed(self.canaries.items()))
        return None if _kept(last) else name


def _kept(outcome: TrialOutcome) -> bool:
    return outcome.verdict.decision == "KEEP" and outcome.outcome == "kept"


async def fleet_trial(fleet: Fleet, change: Change, *, force: bool = False) -> FleetTrial:
    """`trial --fleet`: every host locked and its known-good read, differing hosts named
    with their gate findings, the trial on each canary in turn, and when every canary kept
    the change the promotion to the rest. A canary that does not keep it (or whose trial
    fails, or is interrupted) stops it there: the canaries that kept it go back to their
    known-good, verified, so no host is left on a change another canary refused."""
    from flagtrial.trial import Trial

    async with contextlib.AsyncExitStack() as stack:
        for host in fleet.hosts:
            target = fleet.sessions[host.name].target
            await stack.enter_async_context(target.lock("flagtrial trial --fleet"))
        differences = await name_differences(fleet, change, await prepare(fleet))
        done = FleetTrial(canaries={}, differences=differences)
        kept: dict[str, int] = {}
        try:
            for name in fleet.canaries:
                outcome = await Trial(fleet.sessions[name], change, force=force).run()
                done.canaries[name] = outcome
                if not _kept(outcome):
                    break
                kept[name] = outcome.trial_id
        except BaseException:
            await roll_back_canaries(fleet, kept)
            raise
        if done.stopped_by is not None:
            await roll_back_canaries(fleet, kept)
            done.rolled_back = list(kept)
            return done
        done.promotion = await promote(fleet, kept, differences.skipped)
        return done
