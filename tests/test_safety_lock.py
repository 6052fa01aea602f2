"""One writer per target, on a real llama-server under the process target. A live trial
(held at a point by the test hook's SIGSTOP, so every check meets it in the same state) is
left alone by `facts`, `history` and `unlock`, and finishes with its own verdict; `unlock
--force` stops it and its trial is rolled back, never abandoned; only a trial whose holder
is gone counts as unfinished, and `facts` never recovers it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flagtrial.demo import free_port, write_unit
from flagtrial.ledger import Ledger
from flagtrial.targets.holder import proc_start_ticks
from harness.cli import said, start, wait_stopped
from harness.project import update_project_file
from test_faults import REVERT_CHANGE, Project

# What it asserts rests on the server's facts, crashes, bounds and files, never on a
# measured difference: may run beside another module (harness/machine.py).
pytestmark = [pytest.mark.slow, pytest.mark.shares_machine]

# A holder of the lock that ignores SIGTERM: only SIGKILL stops it.
STUBBORN_HOLDER = """
import asyncio, signal, sys
from pathlib import Path
from flagtrial.targets.process import ProcessTarget

async def hold() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    t = ProcessTarget(Path(sys.argv[1]), Path(sys.argv[2]))
    async with t.lock("stubborn holder"):
        print("held", flush=True)
        await asyncio.sleep(600)

asyncio.run(hold())
"""


@pytest.fixture
def project(tmp_path: Path, llama_server_bin: Path, tiny_model: Path) -> Iterator[Project]:
    unit = tmp_path / "template.service"
    write_unit(unit, llama_server_bin, tiny_model, free_port())
    root = tmp_path / "p"
    root.mkdir()
    proj = Project(root, unit.read_text())
    yield proj
    proj.stop()


def start_trial(project: Project, faults: str) -> subprocess.Popen[str]:
    """`flagtrial trial` of a change that REVERTs, as its own process."""
    return start(project.file, "trial", *REVERT_CHANGE, faults=faults)


def server(project: Project) -> tuple[int, int | None]:
    """The serving llama-server's PID and start time: a restart changes them."""
    pid = json.loads((project.ledger_path.parent / "process" / "server.json").read_text())["pid"]
    return pid, proc_start_ticks(pid)


def trial_state(project: Project, trial_id: int = 1) -> str:
    ledger = Ledger(project.ledger_path)
    try:
        return ledger.trial(trial_id).state
    finally:
        ledger.close()


def test_read_only_commands_and_unlock_leave_a_live_trial_alone(project: Project) -> None:
    known_good = project.unit.read_text()
    capacity = project.facts()
    trial = start_trial(project, "candidate-run-1=STOP")
    try:
        wait_stopped(trial)
        candidate = project.unit.read_text()
        serving = server(project)
        assert candidate != known_good and trial_state(project) == "measuring"

        facts = project.cli("facts")
        assert facts.returncode == 0, facts.stdout + facts.stderr
        locked = (
            f"process:{project.unit.resolve()} is locked by flagtrial trial (pid {trial.pid} on"
        )
        assert f"nothing restarted: {locked}" in said(facts)
        shown = project.cli("facts", "--json")
        data = json.loads(shown.stdout[shown.stdout.index("{\n") :])
        assert data["facts"]["capacity"] == capacity  # the known-good's, as recorded
        # the candidate's, read live: half the slots
        live = data["live"]["capacity"]["concurrent_requests"]
        assert live == capacity["concurrent_requests"] / 2

        history = project.cli("history")
        assert history.returncode == 0, history.stdout + history.stderr
        assert f"trial 1 (measuring) is running, held by flagtrial trial (pid {trial.pid}" in said(
            history
        )
        assert "recover" not in history.stdout

        unlock = project.cli("unlock")
        assert unlock.returncode == 6, unlock.stdout + unlock.stderr
        assert f"left alone: {locked}" in said(unlock)
        assert "which is still running" in said(unlock) and "--force" in said(unlock)
        recover = project.cli("recover")
        assert recover.returncode == 6 and "flagtrial trial" in recover.stderr

        # nothing touched the trial: still stopped where it was, on the same server
        assert trial.poll() is None and trial_state(project) == "measuring"
        assert project.unit.read_text() == candidate and server(project) == serving
        trial.send_signal(signal.SIGCONT)
        out = trial.communicate(timeout=300)[0]
    finally:
        trial.kill()
    assert trial.returncode == 10, out  # its own REVERT
    assert trial_state(project) == "reverted"
    assert project.unit.read_text() == known_good
    ledger = Ledger(project.ledger_path)
    try:
        runs = ledger.runs(1)
        events = [e.state for e in ledger.events(1)]
    finally:
        ledger.close()
    assert runs and all(r.summary["n_errors"] == 0 for r in runs)
    assert "recovered" not in events


def test_unlock_force_stops_a_live_trial_which_rolls_itself_back(project: Project) -> None:
    known_good = project.unit.read_text()
    capacity = project.facts()
    trial = start_trial(project, "candidate-run-1=STOP")
    try:
        wait_stopped(trial)
        assert project.unit.read_text() != known_good
        forced = project.cli("unlock", "--force")
        assert forced.returncode == 0, forced.stdout + forced.stderr
        assert f"stopped flagtrial trial (pid {trial.pid} on" in said(forced)
        assert "trial 1 ended reverted" in said(forced)
        out = trial.communicate(timeout=60)[0]
    finally:
        trial.kill()
    assert trial.returncode == 130, out  # SIGTERM: the trial rolled itself back
    assert trial_state(project) == "reverted"
    assert project.unit.read_text() == known_good
    assert project.facts() == capacity
    assert "nothing to recover" in project.cli("recover").stdout


def test_only_a_gone_holder_leaves_an_unfinished_trial(project: Project) -> None:
    """Killed mid-trial: `history` and `facts` say it is unfinished and restart nothing;
    `unlock --force` of a holder that ignores SIGTERM kills it and recovers the trial."""
    # the grace a holder gets for its own rollback follows the readiness timeout
    update_project_file(project.file, ready_timeout_s=15)
    known_good = project.unit.read_text()
    capacity = project.facts()
    killed = project.cli("trial", *REVERT_CHANGE, faults="candidate-run-1=KILL")
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    candidate = project.unit.read_text()
    serving = server(project)

    history = project.cli("history")
    assert "trial 1 (measuring) is unfinished, its holder is gone: run `flagtrial recover`" in said(
        history
    )
    facts = project.cli("facts")
    assert facts.returncode == 0, facts.stdout + facts.stderr
    assert "trial 1 was left unfinished (measuring): run `flagtrial recover`" in said(facts)
    assert project.unit.read_text() == candidate and server(project) == serving
    assert trial_state(project) == "measuring"

    holder = subprocess.Popen(
        [sys.executable, "-c", STUBBORN_HOLDER, str(project.unit),
         str(project.ledger_path.parent / "process")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        forced = project.cli("unlock", "--force")
        assert forced.returncode == 0, forced.stdout + forced.stderr
        assert "killed (still running 25s after SIGTERM) stubborn holder" in said(forced)
        assert "trial 1 ended recovered" in said(forced)
        assert holder.wait(timeout=10) == -signal.SIGKILL
    finally:
        holder.kill()
    assert project.unit.read_text() == known_good
    assert project.facts() == capacity
    assert "the lock was free" in project.cli("unlock").stdout
