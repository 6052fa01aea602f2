"""Foreign-load sampling on this machine's real /proc, with a real busy process."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flagtrial.hygiene import (
    SAMPLE_SHELL,
    LoadSample,
    disturbed,
    foreign_load,
    parse_sample,
    sample_local,
)
from flagtrial.targets.hostfacts import parse_nvidia_smi
from flagtrial.targets.process import ProcessTarget

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

BUSY = [sys.executable, "-c", "while True: pass"]


@pytest.fixture
def busy() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(BUSY)
    yield proc
    proc.kill()
    proc.wait()


def _spin_until_cpu(pid: int, ticks: int) -> None:
    """Wait until `pid` has burnt `ticks` of CPU (not a time bound: a CPU-time condition)."""
    while sample_local().procs[pid].ticks < ticks:
        time.sleep(0.05)


def test_local_sample_reads_this_machine() -> None:
    s = sample_local()
    assert s.n_cpus == os.cpu_count()
    assert s.busy_ticks > 0 and s.at_s > 0
    me = s.procs[os.getpid()]
    assert me.ppid == os.getppid()
    assert me.name.startswith(("python", "pytest"))


def test_the_shell_command_reads_the_same_machine() -> None:
    """SAMPLE_SHELL is what a remote target runs; here it runs on this machine."""
    out = subprocess.run(["sh", "-c", SAMPLE_SHELL], capture_output=True, text=True, check=True)
    s = parse_sample(out.stdout)
    assert s.n_cpus == os.cpu_count()
    assert os.getpid() in s.procs
    if shutil.which("nvidia-smi") is None:
        assert s.gpu_util_pct == {} and s.gpu_procs == ()


def test_a_busy_process_is_foreign_load(busy: subprocess.Popen[bytes]) -> None:
    before = sample_local()
    start = before.procs[busy.pid].ticks
    _spin_until_cpu(busy.pid, start + 50)  # half a CPU-second
    after = sample_local()
    load = foreign_load(before, after, server_pid=None, flagtrial_pid=os.getpid())
    busy_cores = (after.procs[busy.pid].ticks - start) / 100 / load.seconds
    assert load.cpu_cores >= busy_cores * 0.9
    assert any(pid == busy.pid for _, pid, _ in load.top)
    reason = disturbed(load, max_cpu_cores=busy_cores / 2)
    assert reason is not None and reason.startswith("disturbed: foreign CPU")
    assert reason.endswith(f"(limit {busy_cores / 2:g} cores)")
    assert disturbed(foreign_load(after, after, None), max_cpu_cores=0.5) is None


def test_a_server_filling_every_cpu_is_disturbed_by_little_foreign_load(
    busy: subprocess.Popen[bytes],
) -> None:
    """A 'server' with a busy worker per CPU, and one foreign busy process: far below the
    cores limit, yet the machine had nothing to spare for it."""
    workers = " & ".join([f"{sys.executable} -c 'while True: pass'"] * (os.cpu_count() or 1))
    server = subprocess.Popen(["sh", "-c", f"{workers} & wait"])
    try:
        before = sample_local()
        _spin_until_cpu(busy.pid, before.procs[busy.pid].ticks + 30)
        after = sample_local()
        load = foreign_load(before, after, server_pid=server.pid, flagtrial_pid=os.getpid())
        reason = disturbed(load, max_cpu_cores=float(load.n_cpus))
        assert reason is not None and reason.endswith("CPUs had none to spare")
    finally:
        _kill_tree(server)


def _kill_tree(root: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    for p in sample_local().procs.values():
        if p.ppid == root.pid:
            os.kill(p.pid, 9)
    root.kill()
    root.wait()


def test_the_servers_process_tree_is_not_foreign() -> None:
    """A 'server' whose busy worker is its child: the whole tree is excluded."""
    server = subprocess.Popen(["sh", "-c", f"{sys.executable} -c 'while True: pass' & wait"])
    try:
        while True:
            s = sample_local()
            worker = [p for p in s.procs.values() if p.ppid == server.pid]
            if worker:
                break
            time.sleep(0.05)
        before = sample_local()
        _spin_until_cpu(worker[0].pid, before.procs[worker[0].pid].ticks + 50)
        after = sample_local()
        as_server = foreign_load(before, after, server_pid=server.pid)
        as_stranger = foreign_load(before, after, server_pid=None)
        worker_cores = (
            (after.procs[worker[0].pid].ticks - before.procs[worker[0].pid].ticks)
            / 100
            / as_server.seconds
        )
        assert all(pid != worker[0].pid for _, pid, _ in as_server.top)
        assert any(pid == worker[0].pid for _, pid, _ in as_stranger.top)
        assert as_stranger.cpu_cores - as_server.cpu_cores >= worker_cores * 0.9
    finally:
        _kill_tree(server)


def test_a_worker_outside_the_servers_tree_but_in_its_group_is_not_foreign() -> None:
    """A 'server' in a session of its own (as the process target starts it) whose busy
    worker left its tree by a double fork: the worker's parent is gone, its process group
    is still the server's."""
    busy = f"{sys.executable} -c 'while True: pass'"
    server = subprocess.Popen(["sh", "-c", f"({busy} &); exec sleep 600"], start_new_session=True)
    try:
        while True:
            s = sample_local()
            worker = [p for p in s.procs.values() if p.pgid == server.pid and p.name != "sleep"]
            if worker and worker[0].ppid != server.pid and worker[0].name.startswith("python"):
                break
            time.sleep(0.05)
        pid = worker[0].pid
        before = sample_local()
        _spin_until_cpu(pid, before.procs[pid].ticks + 50)
        after = sample_local()
        load = foreign_load(before, after, server_pid=server.pid)
        assert not any(p.ppid == server.pid for p in after.procs.values())  # no tree
        assert all(p != pid for _, p, _ in load.top)
        worker_ticks = after.procs[pid].ticks - before.procs[pid].ticks
        # cores x seconds back into ticks: 53 ticks read back as 52.99999999999 once
        assert round(load.own_cores * 100 * load.seconds, 6) >= worker_ticks
    finally:
        os.killpg(server.pid, 9)
        server.wait()


UNIT_SAMPLE = """100.0 100.0
@@flagtrial-hygiene@@
cpu  400 0 0 1000 0 0 0 0 0 0
cpu0 200 0 0 500 0 0 0 0 0 0
cpu1 200 0 0 500 0 0 0 0 0 0
@@flagtrial-hygiene@@
700 (python3) S 1 700 700 0 -1 4194560 1 0 0 0 {main} 0 0 0 20 0 4 0 100 1 1
710 (VLLM::EngineCor) S 1 710 710 0 -1 4194560 1 0 0 0 {core} 0 0 0 20 0 4 0 100 1 1
711 (pt_worker) S 710 710 710 0 -1 4194560 1 0 0 0 {core} 0 0 0 20 0 4 0 100 1 1
800 (stress) R 1 800 800 0 -1 4194560 1 0 0 0 {other} 0 0 0 20 0 1 0 100 1 1
@@flagtrial-hygiene@@
@@flagtrial-hygiene@@
@@flagtrial-hygiene@@
700
710
"""


def test_the_units_cgroup_is_the_servers_own_load() -> None:
    """A systemd unit's processes (SAMPLE_SHELL's last section: its cgroup), here an engine
    core systemd sees in the unit although it is nobody's child in the server's tree, and
    that core's own child: all the server's; only the stranger is foreign."""
    before = parse_sample(UNIT_SAMPLE.format(main=0, core=0, other=0))
    after = parse_sample(
        UNIT_SAMPLE.format(main=10, core=30, other=50).replace("100.0 100.0", "101.0 100.0")
    )
    assert after.unit_pids == {700, 710}
    load = foreign_load(before, after, server_pid=700)
    assert [pid for _, pid, _ in load.top] == [800]
    assert load.own_cores == pytest.approx(0.7)  # 10 + 30 + 30 ticks in one second

    # Without the cgroup section (a sample that named no unit) the core is a stranger.
    def plain(sample: LoadSample) -> LoadSample:
        return dataclasses.replace(sample, unit_pids=frozenset())

    stranger = foreign_load(plain(before), plain(after), server_pid=700)
    assert sorted(pid for _, pid, _ in stranger.top) == [710, 711, 800]


NVIDIA_SMI_SAMPLE = """123.45 100.00
@@flagtrial-hygiene@@
cpu  100 0 50 1000 0 0 0 5 0 0
cpu0 50 0 25 500 0 0 0 3 0 0
cpu1 50 0 25 500 0 0 0 2 0 0
@@flagtrial-hygiene@@
4242 (llama-server) S 1 4242 4242 0 -1 4194560 1 0 0 0 70 10 0 0 20 0 4 0 100 1 1
4343 (python3) S 1 4343 4343 0 -1 4194560 1 0 0 0 5 1 0 0 20 0 1 0 100 1 1
@@flagtrial-hygiene@@
0, 97
1, [N/A]
@@flagtrial-hygiene@@
4242, /usr/bin/llama-server, 20480
4343, python3, 8192
"""


def test_gpu_processes_from_nvidia_smi_output() -> None:
    """nvidia-smi's CSV as SAMPLE_SHELL collects it: the server's GPU process is its own,
    any other compute process on the GPU disturbs the run."""
    s = parse_sample(NVIDIA_SMI_SAMPLE)
    assert s.n_cpus == 2 and s.busy_ticks == 155 and s.steal_ticks == 5
    assert s.gpu_util_pct == {0: 97.0}
    assert [p.pid for p in s.gpu_procs] == [4242, 4343]
    load = foreign_load(s, s, server_pid=4242)
    assert [p.name for p in load.gpu_procs] == ["python3"]
    reason = disturbed(load, max_cpu_cores=0.5)
    assert reason is not None and "foreign GPU process python3 (pid 4343, 8192 MiB)" in reason


def test_a_failed_sample_is_an_error_not_zero_load() -> None:
    with pytest.raises(ValueError, match="not a load sample"):
        parse_sample("sh: 1: cat: Permission denied")


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no nvidia-smi on this machine")
def test_real_nvidia_smi_sample() -> None:
    s = sample_local()
    assert s.gpu_util_pct, "nvidia-smi present but no GPU utilisation read"


def test_host_facts_read_the_same_nvidia_smi_csv() -> None:
    """The host facts' query of the one nvidia-smi probe: a row per GPU, a driver's error
    line is no GPU."""
    csv = "NVIDIA H200, 9.0, 143771 MiB, 570.86.15\nNVIDIA H200, 9.0, 143771 MiB, 570.86.15\n"
    gpus = parse_nvidia_smi(csv + "Unable to determine the device handle for GPU 2: Unknown\n")
    assert [(g.name, g.compute_cap, g.memory_total) for g in gpus] == [
        ("NVIDIA H200", "9.0", "143771 MiB")
    ] * 2


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no nvidia-smi on this machine")
def test_real_nvidia_smi_host_facts_and_sample_see_the_same_gpus(tmp_path: Path) -> None:
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
    n_gpus = listed.stdout.count("GPU ")
    host = asyncio.run(ProcessTarget(tmp_path / "u.service", tmp_path / "state").host_facts())
    assert len(host.gpus) == n_gpus > 0
    assert all(g.compute_cap and g.driver_version for g in host.gpus)
    assert sorted(sample_local().gpu_util_pct) == list(range(n_gpus))
