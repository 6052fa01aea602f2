"""Fleet inventories read with ansible-core's own code: groups, host and group vars, the
connection vars flagtrial reaches a host by, and one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flagtrial.errors import ProjectError, UsageError
from flagtrial.fleet.hosts import host_endpoint
from flagtrial.fleet.inventory import FleetHost, load_group
from flagtrial.fleet.promote import Promotion
from flagtrial.settings import DeclaredGpu, load_project
from flagtrial.states import TrialState
from harness.cli import cli
from harness.project import write_project_file

# What it asserts rests on the server's facts, crashes, bounds and files, never on a
# measured difference: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

INI = """\
[gpus]
a ansible_host=10.0.0.1
b ansible_host=10.0.0.2 ansible_user=deploy ansible_port=2222
c

[gpus:vars]
ansible_user=root

[other]
d
"""

YAML = """\
all:
  children:
    gpus:
      vars: {ansible_user: root}
      hosts:
        a: {ansible_host: 10.0.0.1}
        b: {ansible_host: 10.0.0.2, ansible_user: deploy, ansible_port: 2222}
        c:
"""

EXPECTED = [
    FleetHost("a", "10.0.0.1", "root", None),
    FleetHost("b", "10.0.0.2", "deploy", 2222),
    FleetHost("c", "c", "root", None),
]


@pytest.mark.parametrize(("name", "text"), [("hosts.ini", INI), ("hosts.yml", YAML)])
def test_group_hosts_with_their_vars(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    hosts = load_group(path, "gpus")
    assert hosts == EXPECTED
    assert [h.url for h in hosts] == [
        "ssh://root@10.0.0.1",
        "ssh://deploy@10.0.0.2:2222",
        "ssh://root@c",
    ]


def test_group_vars_folder_counts(tmp_path: Path) -> None:
    (tmp_path / "hosts.ini").write_text("[gpus]\na ansible_host=10.0.0.1\n")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpus.yml").write_text("ansible_port: 2200\nansible_user: ops\n")
    assert load_group(tmp_path / "hosts.ini", "gpus") == [FleetHost("a", "10.0.0.1", "ops", 2200)]


def test_bad_inventories_are_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("gpus:\n  hosts:\n    a: {ansible_host: 10.0.0.1\n")
    with pytest.raises(ProjectError, match=r"^inventory .*bad.yml cannot be parsed: .+") as e:
        load_group(bad, "gpus")
    assert "\n" not in str(e.value)
    with pytest.raises(ProjectError, match="no inventory file at"):
        load_group(tmp_path / "missing.ini", "gpus")
    good = tmp_path / "hosts.ini"
    good.write_text(INI)
    with pytest.raises(
        UsageError, match=r"no group 'gpu' in inventory .*\(its groups: gpus, other\)"
    ):
        load_group(good, "gpu")


def test_endpoint_follows_the_host() -> None:
    assert host_endpoint("http://127.0.0.1:8080", "10.0.0.2") == "http://10.0.0.2:8080"
    assert host_endpoint("http://localhost/v1", "fd00::2") == "http://[fd00::2]/v1"


def test_fleet_status_bad_input_exit_codes(tmp_path: Path) -> None:
    project = write_project_file(tmp_path / "flagtrial.toml", target="ssh://root@10.0.0.1",
                                 unit="llama.service")  # fmt: skip
    r = cli(project, "fleet", "status", "gpus")
    assert (r.returncode, r.stderr.strip()) == (
        2,
        "error: fleet.inventory is not set in the project file: name the inventory",
    )
    (tmp_path / "hosts.ini").write_text(INI)
    write_project_file(project, target="ssh://root@10.0.0.1", unit="llama.service",
                       fleet={"inventory": "hosts.ini"})  # fmt: skip
    r = cli(project, "fleet", "status", "nosuch")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: no group 'nosuch' in inventory {tmp_path / 'hosts.ini'} (its groups: gpus, other)"
    ]
    (tmp_path / "hosts.ini").write_text("[gpus\na\n")
    r = cli(project, "fleet", "status", "gpus")
    assert r.returncode == 2
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"error: inventory {tmp_path / 'hosts.ini'} cannot be parsed: ")


@pytest.mark.parametrize("wave", [0, "0%", "150%", "half"])
def test_bad_waves_name_the_key(tmp_path: Path, wave: object) -> None:
    path = tmp_path / "flagtrial.toml"
    path.write_text(f'unit = "llama.service"\n[fleet]\nserial = [1, {json.dumps(wave)}]\n')
    with pytest.raises(ProjectError, match=r"fleet\.serial: Value error, a wave is a host count"):
        load_project(path)


def test_host_declares_its_gpu(tmp_path: Path) -> None:
    """A host's flagtrial_gpu var declares its GPU for the gate analysis (as [gpu] does for
    the project); a bad one is a one-line project error naming the host and the key."""
    (tmp_path / "hosts.ini").write_text(INI)
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "b.yml").write_text(
        'flagtrial_gpu: {compute_cap: "12.0", count: 4}\n'
    )
    hosts = load_group(tmp_path / "hosts.ini", "gpus")
    assert [h.gpu for h in hosts] == [None, DeclaredGpu(compute_cap="12.0", count=4), None]
    assert hosts == EXPECTED  # the declared GPU is not part of how a host is reached
    (tmp_path / "host_vars" / "b.yml").write_text("flagtrial_gpu: {compute_cap: 12.0, count: 0}\n")
    with pytest.raises(ProjectError) as e:
        load_group(tmp_path / "hosts.ini", "gpus")
    assert str(e.value) == (
        f"inventory {tmp_path / 'hosts.ini'}: b: flagtrial_gpu.compute_cap: Input should be a "
        "valid string"
    )
    # an AMD host by its gfx architecture; never both kinds at once
    (tmp_path / "host_vars" / "b.yml").write_text('flagtrial_gpu: {gfx: gfx942, rocm: "6.3"}\n')
    assert load_group(tmp_path / "hosts.ini", "gpus")[1].gpu == DeclaredGpu(
        gfx="gfx942", rocm="6.3"
    )
    (tmp_path / "host_vars" / "b.yml").write_text(
        'flagtrial_gpu: {gfx: gfx942, compute_cap: "9.0"}\n'
    )
    with pytest.raises(ProjectError) as e:
        load_group(tmp_path / "hosts.ini", "gpus")
    assert str(e.value) == (
        f"inventory {tmp_path / 'hosts.ini'}: b: flagtrial_gpu: Value error, declare "
        "compute_cap (NVIDIA) or gfx (AMD), not both"
    )


def fleet_project(root: Path) -> Path:
    """A project whose fleet is INI's group gpus (hosts a, b, c; never reached here)."""
    (root / "hosts.ini").write_text(INI)
    return write_project_file(root / "flagtrial.toml", target="ssh://root@10.0.0.1",
                              unit="llama.service", fleet={"inventory": "hosts.ini"})  # fmt: skip


def test_canaries_named_or_counted(tmp_path: Path) -> None:
    """--canary names hosts of the group, --canaries counts them (no more than it has),
    fleet.canary and fleet.canary_count are the project's own, one of them: each bad use
    is one line, exit 2, before any host is reached."""
    project = fleet_project(tmp_path)
    trial = ("trial", "--set", "-b=512", "--fleet", "gpus")
    for extra, error in [
        (("--canary", "a", "--canary", "x"), "canary: 'x' is not a host of group 'gpus'"),
        (("--canary", "a", "--canary", "a"), "canary: name distinct hosts of group 'gpus'"),
        (("--canaries", "4"), "4 canaries: group 'gpus' has 3 hosts"),
        (("--canaries", "2", "--canary", "a"), "--canary or --canaries: with --fleet, one of them"),
    ]:
        r = cli(project, *trial, *extra)
        assert (r.returncode, r.stderr.strip()) == (2, f"error: {error}"), extra
    r = cli(project, "trial", "--set", "-b=512", "--canary", "a")
    assert (r.returncode, r.stderr.strip()) == (
        2,
        "error: --canary or --canaries: with --fleet, one of them",
    )
    path = tmp_path / "bad.toml"
    path.write_text('unit = "llama.service"\n[fleet]\ncanary = ["a"]\ncanary_count = 2\n')
    with pytest.raises(ProjectError, match=r"name the canaries \(canary\) or count them"):
        load_project(path)


def test_skipped_hosts_are_in_no_wave(tmp_path: Path) -> None:
    """Every other host skipped (the change fails at startup on its GPU): no play runs, no
    host is reached, each is named with why, nothing counts against the budget, and the
    canaries stay as they are."""
    import asyncio

    from flagtrial.fleet.hosts import Fleet
    from flagtrial.fleet.promote import promote

    fleet = Fleet.open(fleet_project(tmp_path), "gpus", lambda kind, detail: None, canaries=["a"])
    ledger = fleet.ledger
    target = fleet.sessions["a"].target.name
    good = ledger.record_generation(target, "[Service]\nExecStart=/bin/true\n", note="installed")
    candidate = ledger.record_generation(target, "[Service]\nExecStart=/bin/false\n", note="c")
    trial = ledger.start_trial(target, {"edits": []}, good.id)
    ledger.step(trial, TrialState.PREFLIGHTED, "test", candidate_gen=candidate.id)
    why = "--flag fails at startup on this GPU per sglang 0.5.23's source: ..."

    async def run() -> Promotion:
        try:
            return await promote(fleet, {"a": trial}, {"b": why, "c": why})
        finally:
            await fleet.aclose()

    done = asyncio.run(run())
    assert [(h.name, h.outcome, h.detail) for h in done.hosts] == [
        ("b", "skipped", why),
        ("c", "skipped", why),
    ]
    assert (done.waves, done.budget_exceeded, done.canary_rolled_back) == ([], False, False)
