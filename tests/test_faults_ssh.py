"""Crash safety against a real systemd host over SSH (nspawn container on 10.200.14.0/24):
flagtrial killed at step boundaries, and the SSH link cut at each remote step. Afterwards
`flagtrial recover` must leave the known-good unit byte for byte, serving its known facts,
with nothing lost from the ledger."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

from flagtrial.errors import TargetError
from flagtrial.launch.change import Change, Edit
from flagtrial.ledger import Ledger
from flagtrial.settings import load_project
from flagtrial.trial import Trial
from harness.cli import capacity, cli
from harness.faultfigures import record
from harness.hosts import SystemdHost, host_fixture, llama_unit, ssh_project
from harness.session import session_for

# What it asserts rests on the server's facts, crashes, bounds and files, never on a
# measured difference: may run beside another module (harness/machine.py).
pytestmark = [pytest.mark.slow, pytest.mark.shares_machine]

N = 14
UNIT_PATH = "/etc/systemd/system/llama.service"
KNOWN_GOOD = llama_unit("-np 8")
CHANGE = ("--set", "--parallel=-1")


host = host_fixture(N)


@pytest.fixture
def project(host: SystemdHost, tmp_path: Path) -> Path:
    host.sh("systemctl start ssh.service")
    return ssh_project(
        host,
        tmp_path / "flagtrial.toml",
        KNOWN_GOOD,
        "[workload]\nconcurrency = [4]\nprompt_words = 16\nmax_tokens = 16\n"
        "requests_per_run = 4\nwarmup_requests = 1\nrun_timeout_s = 30\n"
        # As in test_faults; and the container shares this machine's CPUs with the load
        # generator, whose load it sees as foreign: runs count, foreign load is only shown.
        '[policy]\nruns = 2\nmax_runs = 2\nprotocol = "interleaved"\n'
        "set_aside_disturbed = false\n",
    )


def rows(project: Path) -> int:
    ledger = Ledger(load_project(project).ledger_path)
    try:
        data = ledger.export()
        return sum(len(data[t]) for t in ("trials", "events", "runs"))
    finally:
        ledger.close()


def recover_and_check(host: SystemdHost, project: Path, known: dict[str, float], kind: str) -> None:
    before = rows(project)
    result = cli(project, "recover")
    assert result.returncode == 0, result.stdout + result.stderr
    ok = host.read(UNIT_PATH) == KNOWN_GOOD.encode() and capacity(project) == known
    lost = max(0, before - rows(project))
    record(kind, ok, lost)
    assert ok and lost == 0
    assert json.loads(cli(project, "history", "--json").stdout)["trials"][-1]["state"] in (
        "recovered",
        "reverted",
    )


@pytest.mark.parametrize("point", ["installing", "restarting", "waiting", "candidate-run-1",
                                   "reverting", "restore-installed"])  # fmt: skip
def test_killed_over_ssh_recovers(host: SystemdHost, project: Path, point: str) -> None:
    known = capacity(project)
    result = cli(project, "trial", *CHANGE, faults=f"{point}=KILL")
    assert result.returncode == -signal.SIGKILL, result.stdout + result.stderr
    recover_and_check(host, project, known, "kill points")


@pytest.mark.parametrize("cut_at", ["installing", "restarting", "ready", "facts", "measuring",
                                    "reverting"])  # fmt: skip
def test_ssh_cut_at_each_remote_step(host: SystemdHost, project: Path, cut_at: str) -> None:
    known = capacity(project)
    seen: list[str] = []

    def cut(state: str, detail: str) -> None:
        seen.append(state)
        # "ready" comes first from the candidate's restart: cut once there, not at the
        # baseline, and only once per trial.
        if (
            state == cut_at
            and "cut" not in seen
            and ("installing" in seen or cut_at == "installing")
        ):
            seen.append("cut")
            host.kill_ssh_sessions()
            host.sh("systemctl stop ssh.socket ssh.service 2>/dev/null; true")

    session = session_for(project, cut)

    async def trial() -> None:
        try:
            async with session.target.lock("test"):
                await Trial(
                    session, Change(edits=[Edit(op="set", name="--parallel", value="-1")])
                ).run()
        finally:
            await session.close()

    with pytest.raises(TargetError):
        asyncio.run(trial())
    assert "cut" in seen
    # never partial: the unit is the known-good or the candidate, whole
    text = host.read(UNIT_PATH).decode()
    assert text in (KNOWN_GOOD, KNOWN_GOOD.replace("-np 8", "-np -1"))
    host.sh("systemctl start ssh.service")
    recover_and_check(host, project, known, "network faults")
