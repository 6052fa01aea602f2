"""One writer per target over SSH, against a real systemd host (nspawn container on
10.200.16.0/24), where the lock is a flock on the host kept by a process tied to the SSH
session: a live trial is left alone by `facts`, `history` and `unlock`, and `unlock --force`
stops it so that it rolls itself back; a lock that outlives its holder (the host never saw
the connection break) is broken by a plain `unlock`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flagtrial.ledger import Ledger
from flagtrial.settings import load_project
from harness.cli import capacity, cli, said, start, wait_stopped
from harness.hosts import TEST_KEY, SystemdHost, host_fixture, llama_unit, ssh_project

# What it asserts rests on the server's facts, crashes, bounds and files, never on a
# measured difference: may run beside another module (harness/machine.py).
pytestmark = [pytest.mark.slow, pytest.mark.shares_machine]

N = 16
UNIT_PATH = "/etc/systemd/system/llama.service"
HOLDER_FILE = "/run/flagtrial/llama.service.holder"
LOCK_FILE = "/run/flagtrial/llama.service.lock"
KNOWN_GOOD = llama_unit("-np 8")
CHANGE = ("--set", "--parallel=-1")

HOLDER = """
import asyncio, sys
from pathlib import Path
from flagtrial.targets.ssh import SshTarget

async def main() -> None:
    t = SshTarget(sys.argv[1], "llama.service", known_hosts=Path(sys.argv[2]),
                  client_keys=[Path(sys.argv[3])], ssh_config=[])
    async with t.lock("laptop-9"):
        print("held", flush=True)
        await asyncio.sleep(600)

asyncio.run(main())
"""

# Stops the SSH session processes between sshd's listener and the flock that keeps the lock
# ($1: the PID the holder file names): the host then never sees that session's connection
# close. Prints the PIDs it stopped.
FREEZE_SESSION = """
main=$(systemctl show -p MainPID --value ssh.service)
p=$(cut -d' ' -f4 /proc/"$1"/stat)
p=$(cut -d' ' -f4 /proc/"$p"/stat)
while [ "$p" -gt 1 ] && [ "$p" != "$main" ]; do
  kill -STOP "$p"; echo "$p"; p=$(cut -d' ' -f4 /proc/"$p"/stat)
done
"""


host = host_fixture(N)


@pytest.fixture
def project(host: SystemdHost, tmp_path: Path) -> Path:
    return ssh_project(
        host,
        tmp_path / "flagtrial.toml",
        KNOWN_GOOD,
        "[workload]\nconcurrency = [4]\nprompt_words = 16\nmax_tokens = 16\n"
        "requests_per_run = 4\nwarmup_requests = 1\nrun_timeout_s = 30\n"
        # as in test_faults_ssh: the fewest runs, every run counted
        '[policy]\nruns = 2\nmax_runs = 2\nprotocol = "interleaved"\n'
        "set_aside_disturbed = false\n",
    )


def invocation(host: SystemdHost) -> str:
    """systemd's ID of the running instance: a restart changes it."""
    return host.sh("systemctl show -p InvocationID --value llama.service").stdout.strip()


def trial_state(project: Path) -> str:
    ledger = Ledger(load_project(project).ledger_path)
    try:
        return ledger.trial(1).state
    finally:
        ledger.close()


def test_live_trial_over_ssh_is_left_alone_until_forced(host: SystemdHost, project: Path) -> None:
    known = capacity(project)
    trial = start(project, "trial", *CHANGE, faults="candidate-run-1=STOP")
    try:
        wait_stopped(trial)
        candidate, serving = host.read(UNIT_PATH), invocation(host)
        assert candidate != KNOWN_GOOD.encode() and trial_state(project) == "measuring"
        holder = f"locked by flagtrial trial (pid {trial.pid} on"

        facts = cli(project, "facts")
        assert facts.returncode == 0, said(facts)
        assert "nothing restarted" in said(facts) and holder in said(facts)
        history = cli(project, "history")
        assert f"trial 1 (measuring) is running, held by flagtrial trial (pid {trial.pid}" in (
            said(history)
        )
        unlock = cli(project, "unlock")
        assert unlock.returncode == 6 and "left alone" in said(unlock) and holder in said(unlock)
        assert trial.poll() is None and trial_state(project) == "measuring"
        assert host.read(UNIT_PATH) == candidate and invocation(host) == serving

        forced = cli(project, "unlock", "--force")
        assert forced.returncode == 0, said(forced)
        assert f"stopped flagtrial trial (pid {trial.pid} on" in said(forced)
        assert "trial 1 ended reverted" in said(forced)
        out = trial.communicate(timeout=120)[0]
    finally:
        trial.kill()
    assert trial.returncode == 130, out  # SIGTERM: it rolled itself back
    assert trial_state(project) == "reverted"
    assert host.read(UNIT_PATH) == KNOWN_GOOD.encode()
    assert capacity(project) == known


def test_lock_outliving_its_holder_is_broken(host: SystemdHost, project: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, host.url, str(host.known_hosts), str(TEST_KEY)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    frozen: list[str] = []
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        keeper = host.read(HOLDER_FILE).decode().splitlines()[1]
        frozen = host.sh(FREEZE_SESSION, keeper).stdout.split()
        assert frozen
        holder.kill()
        holder.wait()
        # its flagtrial is gone, its lock is still held on the host
        assert host.sh('flock -n "$1" true', LOCK_FILE, check=False).returncode != 0
        unlock = cli(project, "unlock")
        assert unlock.returncode == 0, said(unlock)
        assert "broke the lock held by laptop-9" in said(unlock) and "which was gone" in said(
            unlock
        )
        assert host.sh('kill -0 "$1"', keeper, check=False).returncode != 0
        assert "the lock was free" in cli(project, "unlock").stdout
    finally:
        holder.kill()
        for pid in frozen:
            host.sh('kill -CONT "$1"', pid, check=False)
