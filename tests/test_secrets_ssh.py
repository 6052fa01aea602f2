"""Secrets over SSH (an nspawn container on 10.200.17.0/24): a 0600 unit owned by a non-root
user keeps its mode, owner and group through a revert, a keep and a rollback installed by the
remote script, and its secret values reach no output."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import cli
from harness.hosts import SystemdHost, host_fixture, llama_unit, ssh_project

# What it asserts rests on the server's facts, crashes, bounds and files, never on a
# measured difference: may run beside another module (harness/machine.py).
pytestmark = [pytest.mark.slow, pytest.mark.shares_machine]

N = 17  # this module's container: ft-17 at 10.200.17.2
UNIT_PATH = "/etc/systemd/system/llama.service"
SECRETS = ("hf_ssh_unit_value_1", "sk-ssh two words", "hf_ssh_change_value_3")
UNIT = llama_unit(
    "-np 8",
    extra_service='Environment=HF_TOKEN=hf_ssh_unit_value_1 "OPENAI_API_KEY=sk-ssh two words"\n',
)


host = host_fixture(N)


@pytest.fixture
def project(host: SystemdHost, tmp_path: Path) -> Path:
    path = ssh_project(
        host,
        tmp_path / "flagtrial.toml",
        UNIT,
        "[workload]\nconcurrency = [8]\nprompt_words = 32\nmax_tokens = 32\n"
        "requests_per_run = 8\nwarmup_requests = 1\nrun_timeout_s = 60\n"
        # REVERT on the capacity loss before any load; keep what is unresolved
        '[policy]\nruns = 2\nmax_runs = 2\ncapacity_guard = "revert"\non_inconclusive = "keep"\n'
        "set_aside_disturbed = false\n",
    )
    host.sh('chown nobody:nogroup -- "$1" && chmod 0600 -- "$1"', UNIT_PATH)
    return path


def mode_and_owner(host: SystemdHost) -> str:
    return host.sh('stat -c "%a %U %G" -- "$1"', UNIT_PATH).stdout.strip()


def test_unit_mode_and_owner_survive_every_install_and_secrets_stay(
    host: SystemdHost, project: Path
) -> None:
    before = host.read(UNIT_PATH)
    assert mode_and_owner(host) == "600 nobody nogroup"
    outputs: list[str] = []

    def run(*args: str, code: int = 0) -> None:
        result = cli(project, *args)
        outputs.append(result.stdout + result.stderr)
        assert result.returncode == code, result.stdout + result.stderr

    env = ("--env", f"HF_TOKEN={SECRETS[2]}")
    run("trial", *env, "--set", "--parallel=-1", code=10)  # REVERT: known-good reinstalled
    assert host.read(UNIT_PATH) == before
    assert mode_and_owner(host) == "600 nobody nogroup"

    run("trial", *env, "--add", "--alias=candidate", code=11)  # kept: the candidate installed
    assert SECRETS[2].encode() in host.read(UNIT_PATH)
    assert mode_and_owner(host) == "600 nobody nogroup"

    run("rollback", "--to", "1")
    assert host.read(UNIT_PATH) == before
    assert mode_and_owner(host) == "600 nobody nogroup"
    # the install script leaves no temporary file behind
    assert host.sh('ls -- "$(dirname -- "$1")"', UNIT_PATH).stdout.count("flagtrial-tmp") == 0

    run("history", "--json")
    run("show", "2", "--json")
    for text in outputs:
        assert not [s for s in SECRETS if s in text], text
