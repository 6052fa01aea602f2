"""Fleets on three real systemd hosts (nspawn containers ft-41, ft-42, ft-43, each in its
own network namespace), read and promoted by real Ansible over SSH. The hosts see this
machine's Python read-only at its own path: Ansible's modules run under it there."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flagtrial.fleet.hosts import Fleet
from flagtrial.fleet.promote import REMOTE_TMP, wait_for_modules
from flagtrial.ledger import Ledger
from harness.cli import cli, command, environment
from harness.hosts import (
    TEST_KEY,
    SystemdHost,
    container_root,
    llama_host,
    llama_unit,
    missing_libraries,
    require_root,
)
from harness.project import update_project_file, write_project_file

pytestmark = pytest.mark.slow

NS = (41, 42, 43)  # this module's containers: ft-41 .. ft-43 at 10.200.N.2
UNIT = "llama.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
# 16-token batches: 200-word prompts prefill several times faster with 512-token ones, a
# gain far beyond any noise, so the canary's trial keeps the change.
KNOWN_GOOD = llama_unit("-np 2 -b 16 -ub 16")
CHANGE = ("--set", "-b=512", "--set", "-ub=512")
CANDIDATE = KNOWN_GOOD.replace("-b 16 -ub 16", "-b 512 -ub 512")
# A host that cannot run the candidate (as one with less memory could not): its unit's
# drop-in refuses to start with 512-token batches, the known-good starts as before.
REFUSES_CANDIDATE = f"[Service]\nExecStartPre=/bin/sh -c '! grep -q -- \"-b 512\" {UNIT_PATH}'\n"


def refuse_candidate(host: SystemdHost) -> None:
    host.install_unit(f"{UNIT}.d/refuse.conf", REFUSES_CANDIDATE)


@pytest.fixture(scope="module")
def python_tree() -> Path:
    """The installation this venv was made from (its own folder, as pyenv's are), bound into
    every host for Ansible's modules."""
    tree = Path(sys.base_prefix)
    assert tree not in (Path("/usr"), Path("/")), f"{tree} cannot be bound over the host's"
    return tree


@pytest.fixture(scope="module")
def hosts(
    tmp_path_factory: pytest.TempPathFactory,
    llama_server_bin: Path,
    tiny_model: Path,
    python_tree: Path,
) -> Iterator[list[SystemdHost]]:
    require_root()
    binds = [python_tree, *missing_libraries(container_root(), python_tree)]
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(
                llama_host(n, tmp_path_factory, llama_server_bin, tiny_model, binds)
            )
            for n in NS
        ]


def write_inventory(path: Path, hosts: list[SystemdHost], python: Path) -> Path:
    lines = ["[gpus]"]
    lines += [f"{h.name} ansible_host={h.addr}" for h in hosts]
    lines += ["", "[gpus:vars]", "ansible_user=root", f"ansible_python_interpreter={python}"]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def project(hosts: list[SystemdHost], tmp_path: Path, python_tree: Path) -> Path:
    """Every host on the known-good unit, stopped; a project whose fleet is group gpus."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("".join(h.known_hosts.read_text() for h in hosts))
    for h in hosts:
        h.reset_unit(UNIT)
        h.install_unit(UNIT, KNOWN_GOOD)
        h.sh(f"rm -rf -- {UNIT_PATH}.flagtrial-prev {UNIT_PATH}.d && systemctl daemon-reload")
    write_inventory(tmp_path / "hosts.ini", hosts, python_tree / "bin" / "python3")
    return write_project_file(
        tmp_path / "flagtrial.toml",
        "[workload]\nconcurrency = [2]\nprompt_words = 200\nmax_tokens = 8\n"
        "requests_per_run = 8\nwarmup_requests = 1\nrun_timeout_s = 60\n"
        "[policy]\nruns = 2\nmax_runs = 24\nset_aside_disturbed = false\n",
        target=hosts[0].url,
        unit=UNIT,
        endpoint=hosts[0].endpoint,
        ready_timeout_s=30,
        ssh={
            "known_hosts": str(known_hosts),
            "identity_file": str(TEST_KEY),
            "ssh_config": "/dev/null",
            "connect_timeout_s": 5,
        },
        fleet={"inventory": "hosts.ini", "serial": [1, "100%"]},
    )


def status(project: Path) -> tuple[int, dict[str, dict[str, object]], str]:
    r = cli(project, "fleet", "status", "gpus", "--json")
    return r.returncode, {h["name"]: h for h in json.loads(r.stdout)["hosts"]}, r.stderr


def test_fleet_status(hosts: list[SystemdHost], project: Path) -> None:
    """Before anything is known: every host read, none known-good; one host without sshd
    cannot be read (exit 5, one line naming it); once the canary's known-good is recorded,
    a host whose unit text differs is named, and one running the same text has no facts."""
    code, rows, _ = status(project)
    assert code == 0
    assert [(r["reachable"], r["spec"], r["generation"]) for r in rows.values()] == [
        (True, "unknown", None)
    ] * 3
    assert rows["ft-41"]["canary"] is True

    last = hosts[2]
    last.sh("systemctl stop ssh.socket ssh.service")
    try:
        code, rows, err = status(project)
    finally:
        last.sh("systemctl start ssh.service")
    assert code == 5
    assert err.strip().splitlines() == [
        f"error: 1 of 3 hosts of gpus cannot be read: ft-43: ssh root@{last.addr}: cannot "
        "connect: Connection refused"
    ]
    assert rows["ft-43"]["reachable"] is False and rows["ft-42"]["reachable"] is True

    r = cli(project, "facts")  # the canary's known-good, as the project's own target
    assert r.returncode == 0, r.stderr
    hosts[1].install_unit(UNIT, KNOWN_GOOD + "# edited by hand\n")
    code, rows, _ = status(project)
    assert code == 0
    assert (rows["ft-41"]["spec"], rows["ft-41"]["facts"], rows["ft-41"]["serving"]) == (
        "known-good",
        [],
        True,
    )
    assert (rows["ft-42"]["spec"], rows["ft-43"]["spec"]) == ("differs", "known-good")
    assert rows["ft-43"]["facts"] is None  # never verified on that host


def promote(project: Path) -> tuple[int, dict[str, Any], str]:
    r = cli(project, "trial", *CHANGE, "--fleet", "gpus", "--json")
    out = r.stdout[r.stdout.index("{\n") :] if "{\n" in r.stdout else "null"
    return r.returncode, json.loads(out), r.stdout + r.stderr


def test_kept_change_promoted_in_waves(hosts: list[SystemdHost], project: Path) -> None:
    """KEEP on the canary, then ft-42 in wave 1 and ft-43 in wave 2, each verified against
    the canary's facts; every host's known-good is the new generation, the old text kept
    beside the unit."""
    code, out, log = promote(project)
    assert code == 0, log
    assert out["canary"]["verdict"]["decision"] == "KEEP"
    promotion = out["promotion"]
    assert [w["hosts"] for w in promotion["waves"]] == [["ft-42"], ["ft-43"]]
    assert {h["name"]: h["outcome"] for h in promotion["hosts"]} == {
        "ft-42": "promoted",
        "ft-43": "promoted",
    }
    for h in hosts:
        assert h.read(UNIT_PATH) == CANDIDATE.encode(), h.name
        assert h.sh("systemctl is-active llama.service").stdout.strip() == "active"
    # Real Ansible ran this promotion's modules from its own folder there (what a rollback
    # after a stopped play waits on): the folder it leaves once each module is done.
    modules = REMOTE_TMP.format(trial=promotion["trial_id"]).replace("~", "/root", 1)
    for h in hosts[1:]:
        assert h.read(UNIT_PATH + ".flagtrial-prev") == KNOWN_GOOD.encode()
        assert h.sh(f"test -d {modules}", check=False).returncode == 0, h.name
    code, rows, _ = status(project)
    assert code == 0
    assert [(r["spec"], r["facts"], r["serving"]) for r in rows.values()] == [
        ("known-good", [], True)
    ] * 3


def outcomes(promotion: dict[str, Any]) -> dict[str, str]:
    return {h["name"]: h["outcome"] for h in promotion["hosts"]}


def test_host_specific_failure_rolled_back_alone(hosts: list[SystemdHost], project: Path) -> None:
    """One wave of both other hosts, a budget of 50 %: ft-43 cannot start the candidate,
    is rolled back at once and verified; ft-42 keeps it (exit 12)."""
    update_project_file(project, fleet={"serial": ["100%"], "max_fail_percentage": 50})
    refuse_candidate(hosts[2])
    code, out, log = promote(project)
    assert code == 12, log
    promotion = out["promotion"]
    assert outcomes(promotion) == {"ft-42": "promoted", "ft-43": "rolled back"}
    assert not promotion["budget_exceeded"]
    [failed] = [h for h in promotion["hosts"] if h["name"] == "ft-43"]
    assert "ExecStartPre" in failed["detail"] or "exit" in failed["detail"], failed
    assert hosts[1].read(UNIT_PATH) == CANDIDATE.encode()
    assert hosts[2].read(UNIT_PATH) == KNOWN_GOOD.encode()
    for h in hosts:
        assert h.sh("systemctl is-active llama.service").stdout.strip() == "active"
    code, rows, _ = status(project)
    assert [rows[n]["spec"] for n in ("ft-41", "ft-42", "ft-43")] == [
        "known-good",
        "known-good",
        "differs",
    ]


def test_failure_beyond_budget_rolls_the_fleet_back(
    hosts: list[SystemdHost], project: Path
) -> None:
    """Waves [1, 100 %] and no failure allowed: ft-42 is promoted in wave 1, ft-43 fails in
    wave 2, so ft-42 and the canary are rolled back too, each verified (exit 13)."""
    update_project_file(project, fleet={"serial": [1, "100%"], "max_fail_percentage": 0})
    refuse_candidate(hosts[2])
    code, out, log = promote(project)
    assert code == 13, log
    promotion = out["promotion"]
    assert promotion["budget_exceeded"] and promotion["canary_rolled_back"]
    assert outcomes(promotion) == {"ft-42": "rolled back", "ft-43": "rolled back"}
    for h in hosts:
        assert h.read(UNIT_PATH) == KNOWN_GOOD.encode(), h.name
        assert h.sh("systemctl is-active llama.service").stdout.strip() == "active"
    code, rows, _ = status(project)
    assert [r["spec"] for r in rows.values()] == ["known-good"] * 3
    history = json.loads(cli(project, "history", "--json").stdout)["trials"]
    assert sorted(t["state"] for t in history) == ["kept", "reverted", "reverted"]


def test_two_canaries_then_a_host_whose_gpu_differs(
    hosts: list[SystemdHost], project: Path
) -> None:
    """canary_count = 2: the trial runs on ft-41, then on ft-42, both KEEP; ft-43 declares
    another GPU (its flagtrial_gpu host var), so it is named before its wave with what its
    gate analysis says (llama.cpp has no source gates: its server's flags only), then
    promoted and verified against the first canary."""
    update_project_file(project, fleet={"canary_count": 2})
    (project.parent / "host_vars").mkdir()
    (project.parent / "host_vars" / "ft-43.yml").write_text(
        'flagtrial_gpu: {compute_cap: "12.0", cuda: "12.8"}\n'
    )
    r = cli(project, "trial", *CHANGE, "--fleet", "gpus", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout[r.stdout.index("{\n") :])
    assert {n: o["verdict"]["decision"] for n, o in out["canaries"].items()} == {
        "ft-41": "KEEP",
        "ft-42": "KEEP",
    }
    assert out["differences"] == {
        "ft-43": {
            "differs": ["GPUs ['1 x SM 12.0 (declared, CUDA 12.8)'] vs the canary's not known"],
            "gates": [
                "no source gate analysis for llamacpp: the change's flags checked against "
                "this host's server"
            ],
        }
    }
    named = r.stderr.index("ft-43: GPUs ['1 x SM 12.0 (declared, CUDA 12.8)']")
    assert named < r.stderr.index("ft-41: candidate is generation")  # before any change
    promotion = out["promotion"]
    assert promotion["canaries"] == ["ft-41", "ft-42"]
    assert [w["hosts"] for w in promotion["waves"]] == [["ft-43"]]
    assert outcomes(promotion) == {"ft-43": "promoted"}
    for h in hosts:
        assert h.read(UNIT_PATH) == CANDIDATE.encode(), h.name
    code, rows, _ = status(project)
    assert code == 0
    assert [(r["canary"], r["spec"]) for r in rows.values()] == [
        (True, "known-good"),
        (True, "known-good"),
        (False, "known-good"),
    ]


def test_a_canary_that_refuses_stops_the_promotion(hosts: list[SystemdHost], project: Path) -> None:
    """--canary ft-41 --canary ft-42: ft-41 keeps the change, ft-42 cannot start it (its
    trial ends REVERT), so ft-41 goes back to its known-good too, verified; nothing is
    promoted, ft-43 is never touched, and the exit code is the REVERT's (10)."""
    refuse_candidate(hosts[1])
    r = cli(project, "trial", *CHANGE, "--fleet", "gpus", "--canary", "ft-41", "--canary",
            "ft-42", "--json")  # fmt: skip
    assert r.returncode == 10, r.stdout + r.stderr
    out = json.loads(r.stdout[r.stdout.index("{\n") :])
    assert {n: (o["verdict"]["decision"], o["outcome"]) for n, o in out["canaries"].items()} == {
        "ft-41": ("KEEP", "kept"),
        "ft-42": ("REVERT", "reverted"),
    }
    assert out["canaries_rolled_back"] == ["ft-41"]
    assert out["promotion"] is None
    for h in hosts:
        assert h.read(UNIT_PATH) == KNOWN_GOOD.encode(), h.name
        assert h.sh("systemctl is-active llama.service").stdout.strip() == "active"
    left = hosts[2].sh(f"test -e {UNIT_PATH}.flagtrial-prev && echo kept || echo untouched")
    assert left.stdout.strip() == "untouched"
    code, rows, _ = status(project)
    assert code == 0
    assert [r["spec"] for r in rows.values()] == ["known-good"] * 3
    history = json.loads(cli(project, "history", "--json").stdout)["trials"]
    assert sorted(t["state"] for t in history) == ["kept", "reverted"]


CUT_SSH = """\
main=$(systemctl show -p MainPID --value ssh.service)
sessions=$(cat /proc/"$main"/task/"$main"/children)
systemctl stop ssh.service
kill -KILL $sessions
"""


def cut_ssh_once_the_play_keeps_the_old_text(host: SystemdHost) -> None:
    """The host stops answering SSH mid-wave: a path unit there stops sshd and kills every
    SSH session (Ansible's kept-open connection too) once the play has kept the old unit
    text beside the unit."""
    host.sh("cat >/run/cut-ssh.sh", input=CUT_SSH)
    host.sh(
        "systemd-run --unit=ft-cut-ssh --property=RemainAfterExit=yes "
        f"--path-property=PathExists={UNIT_PATH}.flagtrial-prev sh /run/cut-ssh.sh"
    )


def test_host_unreachable_mid_wave(hosts: list[SystemdHost], project: Path) -> None:
    """ft-43 stops answering after the play began on it: Ansible counts it failed (50 %,
    within the budget), ft-42 is promoted, ft-43 is left unfinished (exit 12) and named;
    once it answers again `fleet recover` puts its known-good back, verified."""
    update_project_file(project, fleet={"serial": ["100%"], "max_fail_percentage": 50})
    last = hosts[2]
    cut_ssh_once_the_play_keeps_the_old_text(last)
    try:
        code, out, log = promote(project)
    finally:
        last.sh("systemctl stop ft-cut-ssh.path ft-cut-ssh.service; systemctl start ssh.service")
    assert code == 12, log
    promotion = out["promotion"]
    assert outcomes(promotion) == {"ft-42": "promoted", "ft-43": "unfinished"}, json.dumps(
        promotion
    )
    [left] = [h for h in promotion["hosts"] if h["name"] == "ft-43"]
    assert "cannot connect" in left["detail"] and "fleet recover gpus" in left["detail"]
    r = cli(project, "fleet", "recover", "gpus", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    ended = json.loads(r.stdout)["hosts"]
    assert list(ended["ft-43"].values()) == ["recovered"]
    assert last.read(UNIT_PATH) == KNOWN_GOOD.encode()
    assert last.sh("systemctl is-active llama.service").stdout.strip() == "active"
    assert hosts[1].read(UNIT_PATH) == CANDIDATE.encode()


def running_plays() -> list[int]:
    """ansible-playbook processes on this machine (only this module's tests run Ansible)."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and b"ansible-playbook" in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
    return found


def wait_for_journal(
    proc: subprocess.Popen[Any], ledger_path: Path, target: str, states: tuple[str, ...]
) -> None:
    """Until a promotion journal of `target` is in one of `states` (polling the ledger)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if ledger_path.exists():
            ledger = Ledger(ledger_path)
            found = {t.state for t in ledger.trials(target)}
            ledger.close()
            if found & set(states):
                return
        time.sleep(0.1)
    raise AssertionError(f"no journal of {target} reached {states} (exit {proc.poll()})")


def test_killed_mid_wave_then_recover(hosts: list[SystemdHost], project: Path) -> None:
    """flagtrial SIGKILLed once wave 2 began on ft-43 (wave 1, ft-42, verified): the play's
    next step finds its flagtrial gone and stops the play; `fleet recover` then finishes
    every host: ft-42 verified on the new generation, ft-43 back on its known-good."""
    ledger_path = project.parent / ".flagtrial" / "ledger.db"
    last = f"{hosts[2].url}/{UNIT}"
    proc = subprocess.Popen(
        command(project, ("trial", *CHANGE, "--fleet", "gpus")),
        env=environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_journal(proc, ledger_path, last, ("installing", "restarting"))
        proc.kill()
    finally:
        proc.wait()
    r = cli(project, "fleet", "recover", "gpus", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    ended = json.loads(r.stdout)["hosts"]
    assert (list(ended["ft-42"].values()), list(ended["ft-43"].values())) == (
        ["kept"],
        ["recovered"],
    )
    assert running_plays() == []
    assert [h.read(UNIT_PATH) for h in hosts] == [
        CANDIDATE.encode(),
        CANDIDATE.encode(),
        KNOWN_GOOD.encode(),
    ]
    for h in hosts:
        assert h.sh("systemctl is-active llama.service").stdout.strip() == "active"
    code, rows, _ = status(project)
    assert code == 0
    assert [r["spec"] for r in rows.values()] == ["known-good", "known-good", "differs"]


def test_a_module_a_stopped_play_left_running_is_waited_for(
    hosts: list[SystemdHost], project: Path
) -> None:
    """A module the play ran on a host outlives the play stopped here (the SSH master keeps
    it going); the rollback waits for it, named by the promotion's remote_tmp: this
    promotion's, not another's."""
    host = hosts[0]
    module = "/root/.ansible/tmp/flagtrial-promotion-77/ansible-tmp-1/AnsiballZ_copy.py"
    host.sh(
        f"rm -f /tmp/landed; setsid sh -c 'sleep 6; touch /tmp/landed' {module} "
        "</dev/null >/dev/null 2>&1 &"
    )

    async def wait(trial_id: int) -> None:
        fleet = Fleet.open(project, "gpus", lambda kind, detail: None)
        try:
            await wait_for_modules(fleet.sessions[host.name].target, trial_id)
        finally:
            await fleet.aclose()

    asyncio.run(wait(7))
    assert host.sh("test -e /tmp/landed", check=False).returncode != 0
    asyncio.run(wait(77))
    assert host.sh("test -e /tmp/landed", check=False).returncode == 0


def test_sigterm_mid_wave_rolls_every_host_back(hosts: list[SystemdHost], project: Path) -> None:
    """SIGTERM once wave 2 began: the play is stopped, every promoted host and the canary go
    back to their known-good, verified, and flagtrial exits 130."""
    ledger_path = project.parent / ".flagtrial" / "ledger.db"
    last = f"{hosts[2].url}/{UNIT}"
    proc = subprocess.Popen(
        command(project, ("trial", *CHANGE, "--fleet", "gpus")),
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for_journal(proc, ledger_path, last, ("installing", "restarting"))
        proc.terminate()
        out, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, out
    assert running_plays() == []
    for h in hosts:
        assert h.read(UNIT_PATH) == KNOWN_GOOD.encode(), h.name
        assert h.sh("systemctl is-active llama.service").stdout.strip() == "active"
    ledger = Ledger(ledger_path)
    states = {t.target: t.state for t in ledger.trials() if t.record.get("promotion")}
    ledger.close()
    assert set(states.values()) <= {"reverted", "recovered"}, states
    code, rows, _ = status(project)
    assert code == 0
    assert [r["spec"] for r in rows.values()] == ["known-good"] * 3
