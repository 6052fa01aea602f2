"""Crash safety on a real llama-server under the process target: flagtrial killed at every
step boundary and inside each long step, signals, and a full disk under the ledger. After
each fault, `flagtrial recover` must leave the known-good (or the kept candidate) installed
byte for byte, serving with its known facts, and the ledger must have lost nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from flagtrial.demo import free_port, write_unit
from flagtrial.errors import LedgerError
from flagtrial.launch.change import Change, Edit
from flagtrial.ledger import Ledger
from flagtrial.trial import Trial
from harness.cli import capacity, cli
from harness.faultfigures import record
from harness.project import update_project_file, write_project_file
from harness.session import session_for

pytestmark = pytest.mark.slow

REVERT_CHANGE = ("--set", "--parallel=-1")  # halves the slots: REVERT on capacity
# Every point a REVERT trial passes: step boundaries and points inside long steps. Each is
# killed at its first pass (the interleaved blocks pass "restarting" and "waiting" first for
# the known-good).
REVERT_POINTS = [
    "preflighted",
    "measuring-baseline",
    "baseline-run-1",
    "installing",
    "restarting",
    "waiting",
    "facts",
    "measuring",
    "candidate-run-1",
    "judged",
    "reverting",
    "restore-installed",
]


class Project:
    def __init__(self, root: Path, unit_text: str, ledger: str = ".flagtrial/ledger.db") -> None:
        self.root = root
        self.file = root / "flagtrial.toml"
        self.unit = root / "llama.service"
        self.ledger_path = root / ledger
        self.unit.write_text(unit_text)
        port = int(unit_text.split("--port ")[1].split()[0])
        write_project_file(
            self.file,
            f'unit = "llama.service"\nendpoint = "http://127.0.0.1:{port}"\n'
            f'ready_timeout_s = 30\nledger = "{ledger}"\n'
            "[workload]\nconcurrency = [4]\nprompt_words = 16\nmax_tokens = 16\n"
            "requests_per_run = 4\nwarmup_requests = 1\nrun_timeout_s = 30\n"
            # The fewest runs: the known-good as found, then one candidate block that the
            # trial ends on (so the revert restarts). Every run counts: the kill points must
            # come in the same order on a busy machine too.
            '[policy]\nruns = 2\nmax_runs = 2\nprotocol = "interleaved"\n'
            "set_aside_disturbed = false\n",
        )

    def cli(self, *args: str, faults: str = "") -> subprocess.CompletedProcess[str]:
        return cli(self.file, *args, faults=faults)

    def facts(self) -> dict[str, float]:
        return capacity(self.file)

    def ledger_rows(self) -> tuple[int, int, int]:
        ledger = Ledger(self.ledger_path)
        try:
            data = ledger.export()
            return len(data["trials"]), len(data["events"]), len(data["runs"])
        finally:
            ledger.close()

    def stop(self) -> None:
        self.cli("recover")  # leaves nothing half-done before the server is stopped
        # the process target keeps its state next to the ledger
        pid_file = self.ledger_path.parent / "process" / "server.json"
        if pid_file.exists():
            pid = json.loads(pid_file.read_text())["pid"]
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def make_project(tmp_path: Path, llama_server_bin: Path, tiny_model: Path) -> Iterator[object]:
    made: list[Project] = []

    def make(ledger: str = ".flagtrial/ledger.db") -> Project:
        unit = tmp_path / "template.service"
        write_unit(unit, llama_server_bin, tiny_model, free_port())
        text = unit.read_text()
        root = tmp_path / f"p{len(made)}"
        root.mkdir()
        project = Project(root, text, ledger)
        made.append(project)
        return project

    yield make
    for project in made:
        project.stop()


def check_recovered(
    project: Project,
    expected_text: str,
    expected_capacity: dict[str, float],
    before: tuple[int, int, int],
    kind: str,
) -> None:
    result = project.cli("recover")
    assert result.returncode == 0, result.stdout + result.stderr
    # idempotent: a second run finds nothing left to do
    assert "nothing to recover" in project.cli("recover").stdout
    recovered = project.unit.read_text() == expected_text and project.facts() == expected_capacity
    trials, events, runs = project.ledger_rows()
    lost = max(0, before[0] - trials) + max(0, before[1] - events) + max(0, before[2] - runs)
    record(kind, recovered, lost)
    assert recovered
    assert lost == 0
    history = json.loads(project.cli("history", "--json").stdout)
    assert history["trials"][-1]["state"] in ("recovered", "kept", "reverted")


@pytest.mark.parametrize("point", REVERT_POINTS)
def test_killed_at_every_point_recovers(make_project, point: str) -> None:  # type: ignore[no-untyped-def]
    project = make_project()
    known_good = project.unit.read_text()
    capacity = project.facts()
    result = project.cli("trial", *REVERT_CHANGE, faults=f"{point}=KILL")
    assert result.returncode == -signal.SIGKILL, result.stdout + result.stderr
    before = project.ledger_rows()
    assert before[0] == 1  # the trial was journaled before it was killed
    check_recovered(project, known_good, capacity, before, "kill points")


# Interleaved ends on either arm; before-after ends on the known-good's re-check, so the
# promotion still has to install and restart the candidate when flagtrial is killed.
@pytest.mark.parametrize("protocol", ["interleaved", "before-after"])
def test_killed_after_keep_was_judged_finishes_the_promotion(make_project, protocol: str) -> None:  # type: ignore[no-untyped-def]
    project = make_project()
    # 16-token batches make a 200-word prompt's prefill several times slower than 512:
    # a gain far beyond the noise, so the verdict is KEEP.
    batches = "--threads 1 --batch-size 16 --ubatch-size 16"
    project.unit.write_text(project.unit.read_text().replace("--threads 1", batches))
    update_project_file(
        project.file,
        workload={"prompt_words": 200, "requests_per_run": 8, "max_tokens": 8},
        # enough runs for the interval to decide (5 pairs at the least)
        policy={"max_runs": 20, "protocol": protocol},
    )
    capacity = project.facts()
    result = project.cli("trial", "--set", "-b=512", "--set", "-ub=512", faults="judged=KILL")
    assert result.returncode == -signal.SIGKILL, result.stdout + result.stderr
    assert json.loads(project.cli("history", "--json").stdout)["trials"][0]["verdict"] == "KEEP"
    installed = project.unit.read_text()
    if protocol == "before-after":
        assert "--batch-size 16 --ubatch-size 16" in installed  # killed after the re-check
    candidate = installed.replace(
        "--batch-size 16 --ubatch-size 16", "--batch-size 512 --ubatch-size 512"
    )
    before = project.ledger_rows()
    check_recovered(project, candidate, capacity, before, "kill points")
    assert json.loads(project.cli("history", "--json").stdout)["trials"][0]["state"] == "kept"


@pytest.mark.parametrize("signals", ["candidate-run-1=INT", "candidate-run-1=TERM"])
def test_first_interrupt_reverts_and_exits_130(make_project, signals: str) -> None:  # type: ignore[no-untyped-def]
    project = make_project()
    known_good = project.unit.read_text()
    capacity = project.facts()
    result = project.cli("trial", *REVERT_CHANGE, faults=signals)
    assert result.returncode == 130, result.stdout + result.stderr
    ok = project.unit.read_text() == known_good and project.facts() == capacity
    history = json.loads(project.cli("history", "--json").stdout)
    ok = ok and history["trials"][0]["state"] == "reverted"
    record("signals", ok, 0)
    assert ok


def test_second_interrupt_leaves_a_journal_that_recover_completes(make_project) -> None:  # type: ignore[no-untyped-def]
    project = make_project()
    known_good = project.unit.read_text()
    capacity = project.facts()
    result = project.cli(
        "trial", *REVERT_CHANGE, faults="candidate-run-1=INT,restore-installed=INT"
    )
    assert result.returncode == 130, result.stdout + result.stderr
    history = json.loads(project.cli("history", "--json").stdout)
    assert history["trials"][0]["state"] == "reverting"
    before = project.ledger_rows()
    check_recovered(project, known_good, capacity, before, "signals")


def test_disk_full_under_the_ledger(make_project, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    made_here: list[Project] = []  # stopped before the tmpfs holding their state goes
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        project = make_project(ledger=str(mount / "ledger.db"))
        made_here.append(project)
        known_good = project.unit.read_text()
        capacity = project.facts()
        filler = mount / "filler"

        def fill_disk_when_measuring(state: str, detail: str) -> None:
            if state == "measuring":
                with contextlib.suppress(OSError):
                    filler.write_bytes(b"x" * (4 << 20))

        session = session_for(project.file, fill_disk_when_measuring)
        change = Change(edits=[Edit(op="set", name="--parallel", value="-1")])
        with pytest.raises(LedgerError):
            asyncio.run(Trial(session, change).run())
        # the server was put back although the ledger could not record it
        assert project.unit.read_text() == known_good
        filler.unlink()
        before = project.ledger_rows()
        check_recovered(project, known_good, capacity, before, "ledger faults")
    finally:
        for project in made_here:
            project.stop()
        subprocess.run(["umount", "-l", str(mount)], check=False)
