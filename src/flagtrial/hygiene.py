"""Foreign load on the server's machine, sampled around each run: was the run disturbed?

A run is evidence about the flags only when the server had its machine to itself. One foreign
busy core slowed a llama-server running `-t` = cores up to 16x, so a disturbed run must be
recognised and set aside, never averaged in.

CPU: the machine's busy time from /proc/stat (steal included: a hypervisor handing our vCPU to
another guest is foreign load too) minus the CPU time, from /proc/<pid>/stat, of the server's
processes (all threads, workers and reaped children) and of flagtrial's own process. The
server's processes are all that its supervisor counts as the server's, with their descendants:
the process group it leads (the process target starts it in a session of its own) and, for a
systemd unit, every process in the unit's cgroup; a multi-process server's workers (vLLM's
engine core, SGLang's scheduler) do its work, and one that left the server's process tree
(reparented by a double fork, or started by systemd beside the main process) is still its
own. What is left is everybody else's, in cores. GPU: utilisation and compute processes from
nvidia-smi where there is one; a compute process not among the server's is foreign.
`disturbed` says whether that load can have slowed the run.

A sample is the text of one shell command (SAMPLE_SHELL), so the same parser serves this
machine (`sample_local`) and a remote one (`Target.run(["sh", "-c", SAMPLE_SHELL, "sh",
UNIT])`).
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flagtrial.targets.base import Target
from flagtrial.targets.hostfacts import nvidia_smi, nvidia_smi_rows
from flagtrial.targets.systemd import SystemdTarget

if TYPE_CHECKING:
    from flagtrial.load.summary import RunSummary

# The Linux user-space tick of /proc/stat and /proc/<pid>/stat: 100 Hz on every mainstream
# architecture (USER_HZ is fixed by the kernel ABI, independent of CONFIG_HZ).
USER_HZ = 100
_SEP = "@@flagtrial-hygiene@@"
_GPU_QUERY = nvidia_smi("gpu", "index,utilization.gpu", units=False)
_APPS_QUERY = nvidia_smi("compute-apps", "pid,process_name,used_memory", units=False)

# The processes of the systemd unit named by $1 (none without one): every cgroup.procs under
# its cgroup, on the unified hierarchy (cgroup v2, or hybrid's) or on v1's systemd one.
_UNIT_PROCS = (
    '[ -n "${1:-}" ] && cg=$(systemctl show -p ControlGroup --value -- "$1" 2>/dev/null) && '
    '[ -n "$cg" ] && for d in /sys/fs/cgroup/unified /sys/fs/cgroup/systemd /sys/fs/cgroup; do '
    'if [ -d "$d$cg" ]; then find "$d$cg" -name cgroup.procs -exec cat {} + 2>/dev/null; '
    "break; fi; done"
)
# One command, so a remote sample costs one round trip. `cat` of many stat files at once:
# a process that exits meanwhile is skipped (2>/dev/null), the others are read. Run as
# `sh -c SAMPLE_SHELL sh [UNIT]`.
SAMPLE_SHELL = (
    f"cat /proc/uptime; echo {_SEP}; cat /proc/stat; echo {_SEP}; "
    f"cat /proc/[0-9]*/stat 2>/dev/null; echo {_SEP}; "
    f"{shlex.join(_GPU_QUERY)} 2>/dev/null; echo {_SEP}; "
    f"{shlex.join(_APPS_QUERY)} 2>/dev/null; echo {_SEP}; "
    f"{_UNIT_PROCS}; exit 0"
)


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    name: str
    ticks: int  # utime + stime of all its threads
    reaped_ticks: int  # cutime + cstime: children it has waited for
    start: int  # start time in ticks since boot: tells a reused pid apart


@dataclass(frozen=True)
class GpuProc:
    pid: int
    name: str
    memory_mib: float


@dataclass(frozen=True)
class LoadSample:
    """The machine at one instant: cumulative CPU ticks, processes, GPU state."""

    at_s: float  # /proc/uptime
    n_cpus: int
    busy_ticks: int  # all CPUs: user, nice, system, irq, softirq, steal
    steal_ticks: int
    procs: dict[int, Proc]
    gpu_util_pct: dict[int, float]  # GPU index -> utilisation; empty without nvidia-smi
    gpu_procs: tuple[GpuProc, ...]
    unit_pids: frozenset[int] = frozenset()  # the systemd unit's cgroup, when one was named


@dataclass(frozen=True)
class ForeignLoad:
    """What others did to the machine between two samples."""

    seconds: float
    cpu_cores: float  # foreign CPU time / wall time
    own_cores: float  # the server's and flagtrial's
    n_cpus: int
    steal_cores: float
    top: list[tuple[str, int, float]]  # (name, pid, cores) of foreign processes, busiest first
    gpu_procs: list[GpuProc]  # foreign compute processes on a GPU
    gpu_util_pct: dict[int, float]  # the higher of the two samples, per GPU

    def describe(self) -> str:
        parts = [f"foreign CPU {self.cpu_cores:.2f} cores over {self.seconds:.1f}s"]
        if self.steal_cores >= 0.01:
            parts.append(f"steal {self.steal_cores:.2f} cores")
        if self.top:
            parts.append(", ".join(f"{name} (pid {pid}) {c:.2f}" for name, pid, c in self.top[:3]))
        parts.extend(
            f"foreign GPU process {p.name} (pid {p.pid}, {p.memory_mib:.0f} MiB)"
            for p in self.gpu_procs
        )
        return "; ".join(parts)


def _parse_proc_stat(text: str) -> tuple[int, int, int]:
    """(busy ticks, steal ticks, number of CPUs) from /proc/stat."""
    busy = steal = n_cpus = 0
    for line in text.splitlines():
        if line.startswith("cpu "):
            # user nice system idle iowait irq softirq steal guest guest_nice; guest time is
            # already inside user and nice, idle and iowait are not busy.
            v = [int(x) for x in line.split()[1:]]
            v += [0] * (8 - len(v))
            busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
            steal = v[7]
        elif line.startswith("cpu"):
            n_cpus += 1
    return busy, steal, n_cpus


def _parse_pid_stats(text: str) -> dict[int, Proc]:
    procs = {}
    for line in text.splitlines():
        # "pid (comm) state ppid ..."; comm may hold spaces and parentheses: split at the last ")".
        head, sep, rest = line.rpartition(")")
        if not sep or " (" not in head:
            continue
        pid_text, name = head.split(" (", 1)
        f = rest.split()
        if len(f) < 20 or not pid_text.strip().isdigit():
            continue
        # after comm (1-based): ppid 2, pgrp 3, utime 12, stime 13, cutime 14, cstime 15,
        # starttime 20
        pid = int(pid_text)
        ticks, reaped = int(f[11]) + int(f[12]), int(f[13]) + int(f[14])
        procs[pid] = Proc(pid, int(f[1]), int(f[2]), name, ticks, reaped, int(f[19]))
    return procs


def _parse_gpu(util_csv: str, apps_csv: str) -> tuple[dict[int, float], tuple[GpuProc, ...]]:
    util: dict[int, float] = {}
    for index, pct in nvidia_smi_rows(util_csv, 2):
        if index.isdigit():
            try:
                util[int(index)] = float(pct)
            except ValueError:  # "[N/A]" on some MIG and vGPU setups
                continue
    apps = []
    for pid, name, used in nvidia_smi_rows(apps_csv, 3):
        if pid.isdigit():
            try:
                memory = float(used)
            except ValueError:
                memory = 0.0
            apps.append(GpuProc(int(pid), name, memory))
    return util, tuple(apps)


def parse_sample(text: str) -> LoadSample:
    """Parse the output of SAMPLE_SHELL (from this machine or a remote one)."""
    sections = [*text.split(_SEP), "", "", "", "", ""]
    uptime, stat, pids, gpu, apps, unit = (s.strip() for s in sections[:6])
    busy, steal, n_cpus = _parse_proc_stat(stat)
    if not uptime or not n_cpus:
        raise ValueError(f"not a load sample (no /proc/uptime or /proc/stat): {text[:200]!r}")
    util, gpu_procs = _parse_gpu(gpu, apps)
    return LoadSample(
        at_s=float(uptime.split()[0]),
        n_cpus=n_cpus,
        busy_ticks=busy,
        steal_ticks=steal,
        procs=_parse_pid_stats(pids),
        gpu_util_pct=util,
        gpu_procs=gpu_procs,
        unit_pids=frozenset(int(w) for w in unit.split() if w.isdigit()),
    )


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # the process exited between listing and reading
        return ""


def _nvidia_smi(argv: list[str]) -> str:
    if shutil.which("nvidia-smi") is None:
        return ""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def sample_local() -> LoadSample:
    """A sample of this machine, read directly (the same text SAMPLE_SHELL prints)."""
    proc = Path("/proc")
    pid_stats = "\n".join(_read(p / "stat") for p in proc.iterdir() if p.name.isdigit())
    parts = [
        _read(proc / "uptime"),
        _read(proc / "stat"),
        pid_stats,
        _nvidia_smi(_GPU_QUERY),
        _nvidia_smi(_APPS_QUERY),
    ]
    return parse_sample(f"\n{_SEP}\n".join(parts))


def _tree(procs: dict[int, Proc], roots: Iterable[int]) -> set[int]:
    """`roots` and all their descendants present in `procs`."""
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    found: set[int] = set()
    todo = [r for r in roots if r in procs]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def server_processes(sample: LoadSample, server_pid: int | None) -> set[int]:
    """The server's processes in a sample: its main process, the process group it leads,
    its unit's cgroup, and all their descendants."""
    group = [p.pid for p in sample.procs.values() if server_pid and p.pgid == server_pid]
    return _tree(sample.procs, [*([server_pid] if server_pid else []), *group, *sample.unit_pids])


def foreign_load(
    before: LoadSample,
    after: LoadSample,
    server_pid: int | None,
    flagtrial_pid: int | None = None,
) -> ForeignLoad:
    """Foreign load between two samples of one machine.

    Not foreign: the server's processes (`server_processes`) and flagtrial's own process
    when it runs on that machine (pass os.getpid()); flagtrial's live children are foreign,
    so a busy helper it started is seen like anybody else's.
    """
    seconds = max(after.at_s - before.at_s, 1e-3)

    def owned(sample: LoadSample) -> set[int]:
        server = server_processes(sample, server_pid)
        return server | ({flagtrial_pid} & set(sample.procs) if flagtrial_pid else set())

    own_before, own_after = owned(before), owned(after)

    def tree_ticks(sample: LoadSample, tree: set[int]) -> int:
        # Reaped children's time moves into the parent's cutime: summing each sample's
        # whole tree keeps a child that exited mid-run counted once.
        return sum(sample.procs[p].ticks + sample.procs[p].reaped_ticks for p in tree)

    own_ticks = tree_ticks(after, own_after) - tree_ticks(before, own_before)
    foreign_ticks = max(after.busy_ticks - before.busy_ticks - own_ticks, 0)
    own = own_before | own_after

    def delta(p: Proc) -> int:
        # A pid missing from `before`, or reused since, started during the run: all its
        # ticks are new. (Not the name: a kernel worker's name changes with its work.)
        old = before.procs.get(p.pid)
        return p.ticks - (old.ticks if old and old.start == p.start else 0)

    others = [
        (p.name, p.pid, delta(p) / USER_HZ / seconds)
        for p in after.procs.values()
        if p.pid not in own and delta(p) > 0
    ]
    others.sort(key=lambda x: -x[2])
    gpu_foreign = {p.pid: p for p in (*before.gpu_procs, *after.gpu_procs) if p.pid not in own}
    util = {
        i: max(before.gpu_util_pct.get(i, 0.0), after.gpu_util_pct.get(i, 0.0))
        for i in {*before.gpu_util_pct, *after.gpu_util_pct}
    }
    return ForeignLoad(
        seconds=seconds,
        cpu_cores=foreign_ticks / USER_HZ / seconds,
        own_cores=max(own_ticks, 0) / USER_HZ / seconds,
        n_cpus=after.n_cpus,
        steal_cores=(after.steal_ticks - before.steal_ticks) / USER_HZ / seconds,
        top=[o for o in others if o[2] >= 0.05],
        gpu_procs=list(gpu_foreign.values()),
        gpu_util_pct=util,
    )


# Foreign load below this never counts: kernel housekeeping and sampling itself.
_NOISE_FLOOR_CORES = 0.1


def disturbed(load: ForeignLoad, max_cpu_cores: float) -> str | None:
    """Why a run with this foreign load must not count, or None when it may.

    Disturbed: a foreign GPU process; foreign CPU above `max_cpu_cores`; or any foreign CPU
    beyond the noise floor when the machine had no CPU to spare for it (our own use plus
    the foreign load above the CPUs there are): a server whose threads fill every core
    is slowed by far less than `max_cpu_cores` of foreign load.
    """
    if load.gpu_procs:
        return f"disturbed: {load.describe()}"
    if load.cpu_cores > max_cpu_cores:
        return f"disturbed: {load.describe()} (limit {max_cpu_cores:g} cores)"
    demand = load.own_cores + load.cpu_cores
    if load.cpu_cores > _NOISE_FLOOR_CORES and demand > load.n_cpus - _NOISE_FLOOR_CORES:
        return (
            f"disturbed: {load.describe()}; with the server and flagtrial at "
            f"{load.own_cores:.2f} cores the {load.n_cpus} CPUs had none to spare"
        )
    return None


# One event loop sends the load: busy (on a CPU or waiting for one) this share of a run, it
# could send and read no faster.
CLIENT_BUSY_MAX_SHARE = 0.9


def client_bound(summary: RunSummary) -> str | None:
    """Why a run measured the load client rather than the server, or None: its event loop
    was busy the whole run, so responses waited inside it and every timestamp came late."""
    if summary.client_busy_share < CLIENT_BUSY_MAX_SHARE:
        return None
    lag = summary.client_lag_p99_s
    return (
        f"client-bound: the load client was busy {summary.client_busy_share:.0%} of the run"
        + (f" and its event loop ran {lag * 1000:.1f} ms late at p99" if lag is not None else "")
        + " (the server may be faster than it could measure)"
    )


async def sample_target(target: Target) -> LoadSample | None:
    """A sample of the machine the target's server runs on; None when it could not be read
    (the run then counts, with its foreign load unknown)."""
    unit = target.unit if isinstance(target, SystemdTarget) else None
    if target.local and unit is None:
        return await asyncio.to_thread(sample_local)
    code, text = await target.run(["sh", "-c", SAMPLE_SHELL, "sh", *([unit] if unit else [])])
    if code != 0:
        return None
    try:
        return parse_sample(text)
    except (ValueError, IndexError):
        return None
