"""The real vLLM server (tests/harness/vllm_fixtures.py) as a systemd unit in an nspawn container
reached over SSH, and a multi-process server's restarts and load under systemd and under the
process target: every process of the old start (API server, engine core, their helpers) is
gone before the next start is ready, and the whole server is its own load, never foreign.

The container sees vLLM's venv, the interpreter it was made from and the model read-only at
the paths they have here: the venv's shebangs and pyvenv.cfg name absolute paths.

vLLM starts cost about a minute each on two cores: three over SSH (the trial's known-good,
candidate and restore), one under the process target (its restart is stopped mid-start).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from flagtrial.engines.base import wait_ready
from flagtrial.engines.pyengine import _static_table
from flagtrial.engines.vllm import VllmEngine
from flagtrial.hygiene import USER_HZ, LoadSample, foreign_load, sample_local, sample_target
from flagtrial.launch.change import Change, Edit
from flagtrial.launch.execwords import literal_word, quote_word
from flagtrial.load.runner import run_level
from flagtrial.load.workload import Workload
from flagtrial.reasons import Code
from flagtrial.settings import load_project
from flagtrial.sourceread import extract
from flagtrial.targets import make_target
from harness.hosts import (
    SystemdHost,
    container_root,
    missing_libraries,
    require_root,
    ssh_project,
    systemd_host,
)
from harness.procs import state as process_state
from harness.session import locked_trial, session_for
from harness.standin import WORKLOAD
from harness.vllm_fixtures import MODULE, READY_TIMEOUT_S, VLLM_ENV, VllmServer, vllm_args

pytestmark = pytest.mark.slow

N = 21  # this module's container: ft-21 at 10.200.21.2
PORT = 8000
UNIT = "vllm.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
# vLLM 0.32 names its engine process so (comm keeps 15 characters of VLLM::EngineCore).
ENGINE_CORE = "VLLM::EngineCor"


def vllm_unit(python: Path, model: Path, *extra: str) -> str:
    args = vllm_args(model, PORT, *extra)
    args[args.index("--host") + 1] = "0.0.0.0"  # reached from this machine, over the veth
    words = [str(python), "-m", MODULE, *args]
    return (
        "[Unit]\nDescription=vLLM (flagtrial test)\n\n[Service]\n"
        + "".join(f"Environment={k}={v}\n" for k, v in VLLM_ENV.items())
        + "ExecStart="
        + " ".join(quote_word(literal_word(w)) for w in words)
        + "\n"
    )


def base_interpreter(venv: Path) -> Path:
    """The installation the venv was made from (pyvenv.cfg `home` is its bin folder)."""
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return Path(value.strip()).parent
    raise AssertionError(f"{venv}/pyvenv.cfg names no home")


@pytest.fixture(scope="module")
def host(
    tmp_path_factory: pytest.TempPathFactory, vllm_bin: Path, hf_model: Path
) -> Iterator[SystemdHost]:
    require_root()
    venv = vllm_bin.parents[1]
    trees = [venv, base_interpreter(venv)]
    binds = [*trees, hf_model, *missing_libraries(container_root(), *trees)]
    shared = tmp_path_factory.mktemp("shared")
    with systemd_host(N, shared, tmp_path_factory.mktemp("ft-host"), binds) as h:
        try:
            yield h
        finally:
            h.reset_unit(UNIT)  # stop the engine before the rest of the module runs


@pytest.fixture(scope="module")
def known_good(vllm_bin: Path, hf_model: Path) -> str:
    # Eager: torch.compile's CPU kernels need a C++ compiler, which the container lacks
    # (`InvalidCxxCompiler` at the engine core's start).
    return vllm_unit(vllm_bin, hf_model, "--enforce-eager", "--max-num-seqs", "8")


@pytest.fixture(scope="module")
def project(host: SystemdHost, known_good: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ssh_project(
        host,
        tmp_path_factory.mktemp("vllm-ssh") / "flagtrial.toml",
        known_good,
        WORKLOAD + '[policy]\nruns = 2\ncapacity_guard = "revert"\nset_aside_disturbed = false\n',
        unit=UNIT,
        top='engine = "vllm"\n',
        endpoint=f"http://{host.addr}:{PORT}",
        ready_timeout_s=READY_TIMEOUT_S,
    )


def _stat(line: str) -> tuple[int, str, str, int]:
    """(pid, name, state, start ticks) from a /proc/PID/stat line."""
    head, _, rest = line.rpartition(")")
    pid, name = head.split(" (", 1)
    fields = rest.split()
    return int(pid), name, fields[0], int(fields[19])


def unit_processes(host: SystemdHost) -> dict[int, tuple[str, int]]:
    """pid -> (name, start ticks) of every process in the unit's cgroup, inside the container:
    from each process's /proc/PID/cgroup (on any hierarchy), not from flagtrial's sampler."""
    out = host.sh(
        'cg=$(systemctl show -p ControlGroup --value -- "$1"); [ -n "$cg" ] || exit 0; '
        "for f in /proc/[0-9]*/cgroup; do "
        'if grep -qE ":$cg(/.*)?$" "$f" 2>/dev/null; then cat "${f%/cgroup}/stat" 2>/dev/null; '
        "fi; done",
        UNIT,
    ).stdout
    return {pid: (name, start) for pid, name, _, start in map(_stat, out.splitlines())}


def still_running(host: SystemdHost, procs: dict[int, tuple[str, int]]) -> dict[int, str]:
    """Those of `procs` that still run in the container (same pid and start; not a zombie)."""
    if not procs:
        return {}
    out = host.sh(
        'for p in "$@"; do cat "/proc/$p/stat" 2>/dev/null; done; true', *map(str, procs)
    ).stdout
    return {
        pid: name
        for pid, name, state, start in map(_stat, out.splitlines())
        if procs[pid][1] == start and state not in ("Z", "X")
    }


def test_the_static_reader_runs_over_ssh(project: Path, vllm_bin: Path) -> None:
    """The source reader reaches the host whole, as one `python -c` word over SSH, runs there
    under the unit's Python with only the standard library, and reads the table it reads here
    from the same package."""
    target = make_target(load_project(project))

    async def read() -> dict:
        try:
            return await _static_table(target, "vllm", str(vllm_bin))
        finally:
            await target.aclose()

    there = asyncio.run(read())
    assert "error" not in there, there
    here = extract("vllm", Path(there["location"]))
    assert (there["version"], there["flags"]) == ("0.32.0", here["flags"])


def test_fewer_sequences_over_ssh_revert_and_no_old_process_outlives_a_restart(
    host: SystemdHost, project: Path, known_good: str
) -> None:
    """Three real starts in the container: known-good (max_num_seqs 8), candidate (2) and
    the restore. Before each restart the unit's processes are read from its cgroup; once the
    next start is ready, none of them runs (systemd stops the whole cgroup: KillMode)."""
    assert host.sh(f"systemctl show -p KillMode --value {UNIT}").stdout.strip() == "control-group"
    restarts: list[tuple[str, dict[int, tuple[str, int]], dict[int, str]]] = []
    pending: list[tuple[str, dict[int, tuple[str, int]]]] = []
    events: list[tuple[str, str]] = []

    def on_event(state: str, detail: str) -> None:
        events.append((state, detail))
        if state in ("baseline", "restarting", "reverting"):
            pending.append((detail, unit_processes(host)))
        elif state == "ready" and pending:
            what, old = pending.pop()
            restarts.append((what, old, still_running(host, old)))

    change = Change(edits=[Edit(op="set", name="--max-num-seqs", value="2")])
    outcome = asyncio.run(locked_trial(session_for(project, on_event), change))
    assert outcome.verdict.decision == "REVERT", events
    loss = outcome.verdict.reasons[0]
    assert loss.code == Code.CAPACITY
    assert {k: loss.values[k] for k in ("name", "before", "after", "pct", "bound_by", "limit")} == {
        "name": "concurrent_requests",
        "before": 8,
        "after": 2,
        "pct": -75.0,
        "bound_by": "max_num_seqs = 2",
        "limit": 5.0,
    }
    assert outcome.facts_before.version == outcome.facts_after.version == "0.32.0"
    assert outcome.restore is not None and outcome.restore.verified
    assert outcome.restore.facts.capacity["concurrent_requests"] == 8
    assert host.read(UNIT_PATH) == known_good.encode()
    assert host.sh(f"systemctl is-active {UNIT}").stdout.strip() == "active"
    # The candidate's and the restore's restarts each replaced a running multi-process
    # server (the known-good's may have found the unit stopped): none of it survived.
    replaced = [(what, old, left) for what, old, left in restarts if old]
    assert len(replaced) >= 2, restarts
    for what, old, left in replaced:
        assert len(old) >= 2 and ENGINE_CORE in {name for name, _ in old.values()}, (what, old)
        assert left == {}, what


def _own_ticks(before: LoadSample, after: LoadSample, pids: set[int]) -> int:
    """CPU ticks `pids` spent between two samples (reaped children's included)."""
    return sum(
        after.procs[p].ticks
        + after.procs[p].reaped_ticks
        - before.procs[p].ticks
        - before.procs[p].reaped_ticks
        for p in pids
        if p in before.procs and p in after.procs
    )


def _load(model: Path) -> Workload:
    return Workload(
        model=str(model), concurrency=[8], prompt_words=16, max_tokens=32,
        requests_per_run=16, warmup_requests=0,
    )  # fmt: skip


def test_the_units_cgroup_is_its_own_load_over_ssh(
    host: SystemdHost, project: Path, hf_model: Path
) -> None:
    """Load on the unit: every process of its cgroup (the engine core does the work) is the
    server's own load, none is named foreign, and its CPU is what is counted as its own."""
    proj = load_project(project)

    async def measure():  # type: ignore[no-untyped-def]
        target = make_target(proj)
        try:
            if (await target.state()).status != "running":  # run alone: the trial left none
                mark = await target.restart()
                await wait_ready(VllmEngine(), target, proj.endpoint, mark, READY_TIMEOUT_S)
            before = await sample_target(target)
            result = await run_level(proj.endpoint, _load(hf_model), 8, warmup=False)
            state = await target.state()
            after = await sample_target(target)
            return before, after, state, result
        finally:
            await target.aclose()

    before, after, state, result = asyncio.run(measure())
    assert result.summary.n_errors == 0
    assert before is not None and after is not None and state.pid is not None
    procs = unit_processes(host)
    # The sampler read the unit's cgroup as the container's own /proc/PID/cgroup says it.
    assert after.unit_pids == set(procs)
    engine = [pid for pid, (name, _) in procs.items() if name == ENGINE_CORE]
    assert len(engine) == 1 and engine[0] != state.pid
    load = foreign_load(before, after, state.pid)
    assert not {pid for _, pid, _ in load.top} & set(procs)
    server = _own_ticks(before, after, set(procs))
    assert _own_ticks(before, after, set(engine)) > 0
    assert load.own_cores * USER_HZ * load.seconds == pytest.approx(server)
    # The same samples without the unit's cgroup and with no server named: all foreign.
    stranger = foreign_load(*(replace(x, unit_pids=frozenset()) for x in (before, after)), None)
    assert (stranger.cpu_cores - load.cpu_cores) * USER_HZ * load.seconds >= server * 0.9
    host.reset_unit(UNIT)


def _group(server: VllmServer) -> tuple[int, dict[int, tuple[str, int]]]:
    """The server's leader and its process group: pid -> (name, start ticks)."""
    leader = asyncio.run(server.target.state()).pid
    assert leader is not None
    sample = sample_local()
    members = server.target.group_members(leader)
    return leader, {p: (sample.procs[p].name, sample.procs[p].start) for p in members}


def test_the_process_groups_load_is_the_servers_own(
    vllm_server: VllmServer, hf_model: Path
) -> None:
    """Under the process target: the server's whole group, engine core included, is its own
    load; foreign load is what the machine did beyond it."""
    leader, group = _group(vllm_server)
    assert ENGINE_CORE in {name for name, _ in group.values()}
    before = sample_local()
    result = asyncio.run(run_level(vllm_server.url, _load(hf_model), 8, warmup=False))
    after = sample_local()
    assert result.summary.n_errors == 0
    load = foreign_load(before, after, leader, os.getpid())
    assert not {pid for _, pid, _ in load.top} & set(group)
    engine = {p for p, (name, _) in group.items() if name == ENGINE_CORE}
    assert _own_ticks(before, after, engine) > 0
    server = _own_ticks(before, after, set(group))
    assert load.own_cores * USER_HZ * load.seconds >= server
    # Seen as a stranger's, the same processes would be foreign load: the server's CPU is
    # what leaves the foreign count.
    stranger = foreign_load(before, after, None, os.getpid())
    assert (stranger.cpu_cores - load.cpu_cores) * USER_HZ * load.seconds >= server * 0.9


def test_a_process_target_restart_leaves_none_of_the_old_group(vllm_server: VllmServer) -> None:
    """restart() stops the whole group (API server, engine core) and waits for it before the
    next start: none of the old processes runs once the new one is started. The new start is
    stopped at once (it is not needed ready)."""
    leader, old = _group(vllm_server)
    assert len(old) >= 2 and ENGINE_CORE in {name for name, _ in old.values()}
    target = vllm_server.target
    try:
        asyncio.run(target.restart())
        new = asyncio.run(target.state()).pid
        assert new is not None and new != leader
        now = sample_local().procs
        left = {
            p: name
            for p, (name, start) in old.items()
            if p in now and now[p].start == start and process_state(p) not in ("Z", "X", None)
        }
        assert left == {}
    finally:
        asyncio.run(target.stop())
    assert target.group_members(new) == []
