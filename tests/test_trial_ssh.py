"""Whole trials against a real systemd host over SSH (an nspawn container on 10.200.12.0/24):
the seed story, a crash at start, hostile values, and the SSH link cut mid-trial."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from flagtrial.errors import TargetError
from flagtrial.launch.change import Change, Edit
from flagtrial.ledger import Ledger
from harness.cli import cli
from harness.hosts import SystemdHost, host_fixture, llama_unit, ssh_project
from harness.project import update_project_file
from harness.session import locked_trial, session_for

# What it asserts rests on the server's facts, crashes, bounds and files, never on a
# measured difference: may run beside another module (harness/machine.py).
pytestmark = [pytest.mark.slow, pytest.mark.shares_machine]

N = 12  # this module's container: ft-12 at 10.200.12.2
UNIT_PATH = "/etc/systemd/system/llama.service"
KNOWN_GOOD = llama_unit("-np 8", extra_service="Restart=on-failure\nRestartSec=0.2\n")


host = host_fixture(N)


@pytest.fixture
def project(host: SystemdHost, tmp_path: Path) -> Path:
    return ssh_project(
        host,
        tmp_path / "flagtrial.toml",
        KNOWN_GOOD,
        "[workload]\nconcurrency = [8]\nprompt_words = 32\nmax_tokens = 32\n"
        "requests_per_run = 16\nwarmup_requests = 2\nrun_timeout_s = 60\n"
        # Bounded: these tests are about SSH, not about how the interval converges. The
        # container shares this machine's CPUs with the load generator, whose load it sees
        # as foreign: runs count, foreign load is only shown.
        "[policy]\nruns = 3\nmax_runs = 3\nset_aside_disturbed = false\n",
    )


def test_seed_story_over_ssh(host: SystemdHost, project: Path) -> None:
    result = cli(project, "trial", "--add", "--cont-batching", "--set", "--parallel=-1", "--json")
    assert result.returncode == 10, result.stdout + result.stderr
    outcome = json.loads(result.stdout[result.stdout.index("{\n") :])
    [loss] = [r["values"] for r in outcome["verdict"]["reasons"] if r["code"] == "capacity"]
    assert (loss["name"], loss["before"], loss["after"], loss["pct"]) == (
        "concurrent_requests",
        8,
        4,
        -50.0,
    )
    assert outcome["restore"]["verified"] is True
    # each arm's highest level that meets the SLO, beside the verdict and in the ledger
    stored = Ledger(project.parent / ".flagtrial" / "ledger.db").trial(outcome["trial_id"])
    for reasons in (outcome["verdict"]["reasons"], [r.model_dump() for r in stored.reasons]):
        slo = sorted(r["values"]["arm"] for r in reasons if r["code"].startswith("slo-"))
        assert slo == ["candidate", "known-good"]
    assert host.read(UNIT_PATH) == KNOWN_GOOD.encode()
    assert host.sh("systemctl is-active llama.service").stdout.strip() == "active"


def test_crash_at_start_over_ssh_rolls_back(host: SystemdHost, project: Path) -> None:
    result = cli(project, "trial", "--set", "--model=/opt/shared/missing.gguf")
    assert result.returncode == 10, result.stdout + result.stderr
    # The unit restarts on failure: the crash is caught from systemd and the journal,
    # not by waiting out the readiness timeout.
    assert "server crashed at start" in result.stdout
    assert "not ready" not in result.stdout
    assert host.read(UNIT_PATH) == KNOWN_GOOD.encode()
    assert host.sh("systemctl is-active llama.service").stdout.strip() == "active"


def test_hostile_value_reaches_the_server_literally(host: SystemdHost, project: Path) -> None:
    hostile = "$(touch /tmp/pwned); reboot `id` %n"
    host.sh("rm -f /tmp/pwned")
    s = session_for(project)
    outcome = asyncio.run(
        locked_trial(s, Change(edits=[Edit(op="add", name="--alias", value=hostile)]))
    )
    assert outcome.facts_after is not None
    assert outcome.facts_after.settings["model_alias"] == hostile
    assert host.sh("test -e /tmp/pwned", check=False).returncode == 1
    assert host.read(UNIT_PATH) == KNOWN_GOOD.encode()


@pytest.mark.parametrize("cut_at", ["installing", "restarting"])
def test_ssh_cut_mid_trial_then_next_command_restores(
    host: SystemdHost, project: Path, cut_at: str
) -> None:
    """sshd dies right before the install (or the restart): the unit on the host is the old
    text or the new, never partial, and the next command restores the known-good."""

    def cut(state: str, detail: str) -> None:
        # the candidate's install or restart, not the known-good's restart block before it
        if state == cut_at and "candidate" in detail:
            host.kill_ssh_sessions()
            host.sh("systemctl stop ssh.socket ssh.service 2>/dev/null; true")

    s = session_for(project, cut)
    change = Change(edits=[Edit(op="set", name="--parallel", value="2")])
    with pytest.raises(TargetError):
        asyncio.run(locked_trial(s, change))
    text = host.read(UNIT_PATH).decode()
    assert text == KNOWN_GOOD or text == KNOWN_GOOD.replace("-np 8", "-np 2")
    host.sh("systemctl start ssh.service")
    history = json.loads(cli(project, "history", "--json").stdout)
    assert [t["state"] for t in history["trials"]] != ["reverted"]
    # facts reads only: it names the unfinished trial and restarts nothing
    result = cli(project, "facts")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "left unfinished" in result.stdout and "flagtrial recover" in result.stdout
    assert host.read(UNIT_PATH).decode() == text
    result = cli(project, "recover")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "left unfinished" in result.stdout
    assert host.read(UNIT_PATH) == KNOWN_GOOD.encode()
    history = json.loads(cli(project, "history", "--json").stdout)
    assert [t["state"] for t in history["trials"]] == ["recovered"]


def test_wrong_host_key_and_held_lock_are_refused(
    host: SystemdHost, project: Path, tmp_path: Path
) -> None:
    s = session_for(project)

    async def second_trial_while_locked() -> str:
        try:
            async with s.target.lock("laptop-1"):
                result = await asyncio.to_thread(cli, project, "trial", "--add", "--cont-batching")
                return result.stderr + f"rc={result.returncode}"
        finally:
            await s.close()

    out = asyncio.run(second_trial_while_locked())
    assert "rc=6" in out and "laptop-1" in out

    # A holder that still runs is named and left alone.
    live = session_for(project)

    async def unlock_while_held() -> str:
        try:
            async with live.target.lock("laptop-2"):
                result = await asyncio.to_thread(cli, project, "unlock")
                return result.stderr + f"rc={result.returncode}"
        finally:
            await live.close()

    out = asyncio.run(unlock_while_held())
    assert "rc=6" in out and "left alone" in out and "laptop-2" in out
    assert "the lock was free" in cli(project, "unlock").stdout

    wrong = tmp_path / "known_hosts"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", tmp_path / "k"], check=True
    )
    key = (tmp_path / "k.pub").read_text().split()
    wrong.write_text(f"{host.addr} {key[0]} {key[1]}\n")
    update_project_file(project, ssh={"known_hosts": str(wrong)})
    result = cli(project, "facts")
    assert result.returncode == 5
    assert "changed" in result.stderr and len(result.stderr.strip().splitlines()) == 1
