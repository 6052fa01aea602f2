"""Whole trials on a real llama-server under the process target: verdicts, rollback, faults."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flagtrial.blocks import Blocks
from flagtrial.demo import free_port, write_unit
from flagtrial.launch.change import Change, Edit
from flagtrial.ledger import Ledger
from flagtrial.noise import Noise, bound_pairs
from flagtrial.plan import plan
from flagtrial.reasons import Code
from flagtrial.sequential import Sequential, Stop
from flagtrial.session import Session
from flagtrial.targets.process import ProcessTarget
from flagtrial.trial import Trial, TrialOutcome
from harness.cli import cli
from harness.project import update_project_file, write_project_file
from harness.session import session_for

pytestmark = pytest.mark.slow


class Project:
    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.file = root / "flagtrial.toml"
        self.unit = root / "llama.service"

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return cli(self.file, *args)

    def session(
        self, events: list[tuple[str, str]] | None = None, on_event: object = None
    ) -> Session:
        log = events if events is not None else []

        def notify(state: str, detail: str) -> None:
            log.append((state, detail))
            if callable(on_event):
                on_event(state, detail)

        return session_for(self.file, notify)

    def add_policy(self, *lines: str) -> None:
        """Add settings to [policy]."""
        update_project_file(self.file, "[policy]\n" + "".join(f"{line}\n" for line in lines))

    def server_pid(self) -> int | None:
        target = ProcessTarget(self.unit, self.root / ".flagtrial" / "process")
        return target._live_pid()

    def stop(self) -> None:
        target = ProcessTarget(self.unit, self.root / ".flagtrial" / "process")
        asyncio.run(target.stop())


@pytest.fixture
def project(tmp_path: Path, llama_server_bin: Path, small_model: Path) -> Iterator[Project]:
    port = free_port()
    proj = Project(tmp_path, port)
    write_unit(proj.unit, llama_server_bin, small_model, port)
    write_project_file(
        proj.file,
        f'unit = "llama.service"\nendpoint = "http://127.0.0.1:{port}"\nready_timeout_s = 30\n'
        "[workload]\nconcurrency = [8]\nprompt_words = 32\nmax_tokens = 24\n"
        "requests_per_run = 8\nwarmup_requests = 1\nrun_timeout_s = 60\n"
        "[policy]\nruns = 3\n",
    )
    yield proj
    proj.stop()


def test_seed_story_reverts_with_capacity_loss_and_verified_restore(project: Project) -> None:
    before = project.unit.read_text()
    result = project.cli("trial", "--add", "--cont-batching", "--set", "--parallel=-1", "--json")
    assert result.returncode == 10, result.stderr

    outcome = json.loads(result.stdout[result.stdout.index("{\n") :])
    assert outcome["verdict"]["decision"] == "REVERT"
    assert outcome["facts_before"]["capacity"]["concurrent_requests"] == 8
    assert outcome["facts_after"]["capacity"]["concurrent_requests"] == 4
    reasons = {r["code"]: r["values"] for r in outcome["verdict"]["reasons"]}
    loss = reasons["capacity"]
    assert (loss["name"], loss["before"], loss["after"], loss["pct"]) == (
        "concurrent_requests",
        8,
        4,
        -50.0,
    )
    # kv_unified flipped although the change never named it
    implicit = [r for r in outcome["verdict"]["reasons"] if r["code"] == "implicit-change"]
    assert any(r["values"]["name"] == "kv_unified" for r in implicit)
    assert outcome["restore"]["verified"] is True
    assert project.unit.read_text() == before
    history = project.cli("history", "--json")
    trials = json.loads(history.stdout)["trials"]
    assert [t["verdict"] for t in trials] == ["REVERT"]
    assert trials[0]["state"] == "reverted"
    shown = json.loads(project.cli("show", "1", "--json").stdout)
    assert shown["trial"]["record"]["host"]["cpus"] >= 1
    assert shown["trial"]["record"]["host"]["gpus"] == []  # a CPU-only host, no failure
    page = project.root / "trial.html"
    assert project.cli("report", "1", "--out", str(page)).returncode == 0
    html = page.read_text()
    assert "REVERT" in html and "concurrent requests" in html and "-50.0 %" in html
    assert "plotly" in html.lower() and html.count("baseline") >= 2


def test_real_improvement_is_kept(project: Project, small_model: Path, tiny_model: Path) -> None:
    text = fast_and_slow_batches(project, small_model, tiny_model)
    result = project.cli("trial", "--set", "-b=512", "--set", "-ub=512")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "KEEP" in result.stdout
    assert "--batch-size 512 --ubatch-size 512" in project.unit.read_text()
    ledger = Ledger(project.root / ".flagtrial" / "ledger.db")
    good = ledger.last_known_good(f"process:{project.unit.resolve()}")
    assert good is not None and "--batch-size 512" in good.spec_text
    # rollback --to the first generation puts the small-batch spec back and verifies it
    rolled = project.cli("rollback", "--to", "1")
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert "verified" in rolled.stdout
    assert project.unit.read_text() == text


def fast_and_slow_batches(project: Project, small_model: Path, tiny_model: Path) -> str:
    """A known-good with 16-token batches, whose 200-word prompts' prefill is several times
    slower than with 512-token ones: a gain far beyond any noise on a busy 2-core machine.
    Returns the known-good unit text."""
    text = project.unit.read_text().replace(str(small_model), str(tiny_model))
    text = text.replace("--threads 1", "--threads 1 --batch-size 16 --ubatch-size 16")
    project.unit.write_text(text)
    update_project_file(project.file, workload={"prompt_words": 200, "max_tokens": 8})
    return text


def test_before_after_keep_rechecks_the_known_good_then_installs_the_candidate(
    project: Project, small_model: Path, tiny_model: Path
) -> None:
    """The protocol for expensive restarts: known-good runs, candidate runs, a known-good
    re-check; a KEEP then installs and restarts the candidate and verifies its facts."""
    fast_and_slow_batches(project, small_model, tiny_model)
    project.add_policy('protocol = "before-after"')
    events: list[tuple[str, str]] = []
    change = Change(edits=[Edit(op="set", name="-b", value="512"),
                           Edit(op="set", name="-ub", value="512")])  # fmt: skip
    outcome = asyncio.run(Trial(project.session(events), change).run())
    assert outcome.verdict.decision == "KEEP", outcome.verdict.reasons
    assert outcome.outcome == "kept"
    assert "--batch-size 512 --ubatch-size 512" in project.unit.read_text()
    assert any(s == "design" and d.startswith("before-after (restart") for s, d in events)
    recheck = next(i for i, (_, d) in enumerate(events) if "known-good re-check" in d)
    # the re-check ran on the known-good, installed again after the candidate's runs
    assert ("installing", "generation 1 (known-good)") in events[:recheck]
    assert events[recheck + 1 :].count(("restarting", "candidate, to keep it")) == 1
    assert outcome.verdict.first({Code.DRIFT}) is not None
    assert outcome.facts_after is not None and outcome.facts_after.ready_s is not None


def test_the_first_runs_time_is_its_own(project: Project) -> None:
    """The first block's time picks the design (a run against a restart): what the trial
    awaited before it (the gates, on vLLM the engine's own resolution for tens of seconds)
    is not counted in it."""
    session = project.session()

    async def first_block() -> tuple[float, float]:
        p = await plan(session, Change(edits=[Edit(op="add", name="--alias", value="b")]))
        await p.gate_task
        blocks = Blocks(session, p.journal)
        seq = Sequential(session.project.policy, session.project.workload.concurrency)
        await asyncio.sleep(1.0)  # awaited before the first run, as the trial awaits its gates
        step = seq.decision()
        assert not isinstance(step, Stop)
        started = time.monotonic()
        await blocks.measure(seq, step)
        return seq.clock_s, time.monotonic() - started

    try:
        counted, took = asyncio.run(first_block())
    finally:
        session.ledger.close()
    assert 0 < counted <= took


def test_aa_trial_finds_no_effect(project: Project) -> None:
    """A/A: a label the server only reports back cannot change its speed. A short trial at
    99 % confidence must not claim a gain or a harm; each run's foreign load is recorded."""
    project.add_policy("confidence = 0.99", "max_runs = 6")
    events: list[tuple[str, str]] = []
    session = project.session(events)
    change = Change(edits=[Edit(op="add", name="--alias", value="candidate")])
    outcome = asyncio.run(Trial(session, change).run())
    assert outcome.verdict.decision == "INCONCLUSIVE", outcome.verdict.reasons
    assert outcome.verdict.finding in ("equivalent", "unresolved")
    assert outcome.outcome == "reverted" and outcome.restore and outcome.restore.verified
    assert any(s == "design" and d.startswith("interleaved blocks of") for s, d in events)
    record = Ledger(project.root / ".flagtrial" / "ledger.db").trial(outcome.trial_id).record
    assert record["design"]["kind"] == "interleaved"
    runs = Ledger(project.root / ".flagtrial" / "ledger.db").runs(outcome.trial_id)
    arms = {r.block: r.arm for r in runs}
    assert arms[0] == "baseline" and sorted(set(arms.values())) == ["baseline", "candidate"]
    assert all(r.foreign is not None and r.foreign["n_cpus"] >= 1 for r in runs)
    assert outcome.diff is not None and [c.name for c in outcome.diff.explicit] == ["model_alias"]
    shown = project.cli("show", str(outcome.trial_id)).stdout
    assert "foreign CPU" in shown and shown.count("candidate") >= 2


def test_the_next_trial_says_what_its_bound_resolves_at_the_noise_the_last_measured(
    project: Project,
) -> None:
    """The first trial of a workload cannot know its noise and says so; it keeps the spread
    of its pairs, and the next trial of that workload states, before its load, what its bound
    can resolve at that noise (a margin too narrow to stop early: all 8 runs are paired,
    counted even when other work shares the cores)."""
    project.add_policy(
        "max_runs = 8", "equivalence_margin_pct = 0.1", "max_seconds = 120",
        "set_aside_disturbed = false",
    )  # fmt: skip
    change = Change(edits=[Edit(op="add", name="--alias", value="candidate")])
    first = asyncio.run(Trial(project.session(), change).run())
    assert [r.code for r in first.verdict.reasons].count(Code.RESOLVES_UNKNOWN) == 1
    ledger = Ledger(project.root / ".flagtrial" / "ledger.db")
    kept = ledger.trial(first.trial_id).record["noise"]
    assert kept["pairs"] >= 3 and kept["pair_sd"] > 0 and kept["runs_per_block"] >= 1
    events: list[tuple[str, str]] = []
    second = asyncio.run(Trial(project.session(events), change).run())
    said = next(r for r in second.verdict.reasons if r.code.startswith("resolves"))
    assert said.code != Code.RESOLVES_UNKNOWN, said.message
    assert said.values["trial"] == first.trial_id
    policy = project.session().project.policy
    assert said.values["pairs"] == bound_pairs(policy, Noise.model_validate(kept))
    assert ("resolves", said.message) in events
    assert events.index(("resolves", said.message)) < next(
        i for i, (state, _) in enumerate(events) if state == "run"
    )  # said before the first run


def test_foreign_load_sets_runs_aside_and_measures_again(project: Project) -> None:
    """A busy process during the candidate's first block: its runs are set aside with the
    process named, and the block is measured again after a fresh restart."""
    # one run a block whatever this machine's restart-to-run ratio (on a slow CI machine the
    # default chose two, and max_runs = 3 then left no room to measure the block again)
    project.add_policy(
        "foreign_cpu_max_cores = 0.3", 'protocol = "interleaved"', "restart_overhead_max = 0.9",
        "max_runs = 4",
    )  # fmt: skip
    hogs: list[subprocess.Popen[bytes]] = []

    def hog_during_first_candidate_block(state: str, detail: str) -> None:
        if state == "measuring" and not hogs:
            hogs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        elif state in ("installing", "restarting") and hogs and hogs[0].poll() is None:
            hogs[0].kill()
            hogs[0].wait()

    events: list[tuple[str, str]] = []
    session = project.session(events, on_event=hog_during_first_candidate_block)
    change = Change(edits=[Edit(op="add", name="--alias", value="candidate")])
    try:
        outcome = asyncio.run(Trial(session, change).run())
    finally:
        for hog in hogs:
            hog.kill()
    runs = Ledger(project.root / ".flagtrial" / "ledger.db").runs(outcome.trial_id)
    first = min(r.block for r in runs if r.arm == "candidate")
    hit = [r for r in runs if r.block == first]
    assert hit and all(r.disturbed and "foreign CPU" in r.disturbed for r in hit)
    assert any(f"pid {hogs[0].pid}" in (r.disturbed or "") for r in hit)
    # the same arm again in the next block, restarted
    assert [r.arm for r in runs if r.block == first + 1] == ["candidate"] * len(hit)
    assert any("again: the last was disturbed" in d for _, d in events)
    assert outcome.verdict.first({Code.DISTURBED}) is not None


def test_a_load_client_kept_busy_sets_every_run_aside_and_the_trial_says_so(
    project: Project,
) -> None:
    """From the known-good's first run on, the load client's event loop shares its thread
    with CPU-bound work that yields only every 20 ms (as a tokenizer or a heavy callback in the
    same loop would), so the real server's responses wait in it: every run is set aside as
    client-bound, and the trial ends too busy to measure, the candidate never started.

    Starving the client's thread by priority instead (nice 19 beside a busy thread on its
    core) depends on the kernel: under EEVDF (Linux 6.6+) a thread that mostly waits for the
    network is woken promptly even at nice 19, and its runs rightly count (busy a third of
    the run, measured here)."""
    project.add_policy('protocol = "before-after"', "runs = 12", "max_runs = 12")
    # little work a run: the ten runs "too busy" needs go fast even for a busy client
    update_project_file(
        project.file, "[workload]\nconcurrency = [2]\nrequests_per_run = 4\nmax_tokens = 8\n"
    )
    events: list[tuple[str, str]] = []
    busy_work: list[asyncio.Task[None]] = []

    async def burn() -> None:
        while True:
            until = time.perf_counter() + 0.02
            while time.perf_counter() < until:
                pass
            await asyncio.sleep(0)

    def keep_loop_busy(state: str, detail: str) -> None:
        if state == "measuring-baseline" and not busy_work:  # on the event loop's thread
            busy_work.append(asyncio.get_running_loop().create_task(burn()))

    async def trial() -> TrialOutcome:
        change = Change(edits=[Edit(op="add", name="--alias", value="candidate")])
        try:
            return await Trial(project.session(events, on_event=keep_loop_busy), change).run()
        finally:
            for task in busy_work:
                task.cancel()

    outcome = asyncio.run(trial())
    assert busy_work, "the trial never reached its known-good's runs"
    verdict = outcome.verdict
    busy = verdict.first({Code.BUSY})
    assert verdict.decision == "INCONCLUSIVE" and busy is not None, verdict.reasons
    assert "client-bound: the load client was busy" in str(busy.values["last"])
    runs = Ledger(project.root / ".flagtrial" / "ledger.db").runs(outcome.trial_id)
    aside = [r for r in runs if r.disturbed]
    assert {r.arm for r in runs} == {"baseline"} and len(aside) > len(runs) / 2
    assert all("client-bound: the load client was busy" in (r.disturbed or "") for r in aside)
    assert not any(state == "installing" for state, _ in events)


def test_facts_wait_for_a_log_that_trails_readiness(
    project: Project, llama_server_bin: Path, tmp_path: Path
) -> None:
    """llama.cpp writes its log from a worker thread: on a busy machine /health can answer
    before the startup lines are written. A server whose log reaches its file 3 s late
    (piped through a delay) still has its slots and KV cells read from that log."""
    late = tmp_path / "bin" / "llama-server"
    late.parent.mkdir()
    late.write_text(f'#!/bin/bash\n"{llama_server_bin}" "$@" 2>&1 | {{ sleep 3; exec cat; }}\n')
    late.chmod(0o755)
    project.unit.write_text(project.unit.read_text().replace(str(llama_server_bin), str(late)))
    read = project.cli("facts", "--json")
    assert read.returncode == 0, read.stderr
    facts = json.loads(read.stdout)["facts"]
    assert facts["settings"]["n_slots"] == 8 and facts["settings"]["n_ctx_slot"] == 1024
    assert "kv_tokens" in facts["capacity"], facts["capacity"]


def test_unknown_flag_fails_before_anything_changes(project: Project) -> None:
    before = project.unit.read_text()
    result = project.cli("trial", "--add", "--paralel=4")
    assert result.returncode == 4
    assert "did you mean --parallel" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert project.unit.read_text() == before
    assert project.cli("history", "--json").stdout.count('"verdict"') == 0


def test_crash_at_start_rolls_back(project: Project) -> None:
    before = project.unit.read_text()
    result = project.cli("trial", "--set", "--model=/nonexistent/model.gguf")
    assert result.returncode == 10, result.stdout + result.stderr
    assert "server crashed at start" in result.stdout
    assert "failed to open GGUF file" in result.stdout
    assert project.unit.read_text() == before
    assert project.server_pid() is not None


def test_never_ready_rolls_back(project: Project) -> None:
    # The candidate serves under another path (/elsewhere/health): alive, but never ready
    # where we look. (A change of port is refused before the trial.)
    update_project_file(project.file, ready_timeout_s=3)
    result = project.cli("trial", "--set", "--api-prefix=/elsewhere")
    assert result.returncode == 10, result.stdout + result.stderr
    assert "not ready" in result.stdout
    assert "verified" in result.stdout


def test_server_killed_mid_measurement_rolls_back(project: Project) -> None:
    def kill_candidate(state: str, detail: str) -> None:
        if state == "measuring":
            pid = project.server_pid()
            assert pid is not None
            os.killpg(pid, signal.SIGKILL)

    session = project.session(on_event=kill_candidate)
    change = Change(edits=[Edit(op="add", name="--alias", value="candidate")])
    outcome = asyncio.run(Trial(session, change).run())
    assert outcome.verdict.decision == "REVERT"
    died = outcome.verdict.reasons[0]
    assert died.code == Code.SERVER_DIED
    assert str(died.values["error"]).startswith("server died during the candidate measurement")
    assert outcome.restore is not None and outcome.restore.verified


def test_port_in_use_is_a_clear_error(project: Project) -> None:
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", project.port))
        squatter.listen()
        result = project.cli("facts")
    assert result.returncode == 7
    assert "couldn't bind" in result.stderr


def test_missing_binary_and_missing_unit(project: Project, llama_server_bin: Path) -> None:
    text = project.unit.read_text()
    project.unit.write_text(text.replace(str(llama_server_bin), "/opt/none/llama-server"))
    result = project.cli("trial", "--add", "--cont-batching")
    assert result.returncode == 5
    assert "cannot start /opt/none/llama-server" in result.stderr
    project.unit.unlink()
    result = project.cli("trial", "--add", "--cont-batching")
    assert result.returncode == 3
    assert "does not exist" in result.stderr


def test_malformed_unit_is_a_clear_error(project: Project) -> None:
    project.unit.write_text('[Service]\nExecStart=/bin/true "unterminated\n')
    result = project.cli("facts")
    assert result.returncode == 3
    assert len(result.stderr.strip().splitlines()) == 1


def test_lock_refused_then_forced(project: Project) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import asyncio, sys\n"
            "from pathlib import Path\n"
            "from flagtrial.targets.process import ProcessTarget\n"
            "async def hold():\n"
            "    t = ProcessTarget(Path(sys.argv[1]), Path(sys.argv[2]))\n"
            "    async with t.lock('laptop-1'):\n"
            "        print('held', flush=True)\n"
            "        await asyncio.sleep(300)\n"
            "asyncio.run(hold())\n",
            str(project.unit),
            str(project.root / ".flagtrial" / "process"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        result = project.cli("trial", "--add", "--cont-batching")
        assert result.returncode == 6
        assert "locked by laptop-1" in result.stderr
        # a holder that still runs is named and left alone; --force stops it
        refused = project.cli("unlock")
        assert refused.returncode == 6 and "left alone" in refused.stderr
        assert "laptop-1" in refused.stderr and holder.poll() is None
        assert "stopped laptop-1" in project.cli("unlock", "--force").stdout
        assert holder.wait(timeout=10) == -signal.SIGTERM
        assert "the lock was free" in project.cli("unlock").stdout
    finally:
        holder.kill()


def test_locked_ledger_changes_nothing(project: Project) -> None:
    assert project.cli("facts").returncode == 0
    before = project.unit.read_text()

    holder = sqlite3.connect(project.root / ".flagtrial" / "ledger.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        result = project.cli("trial", "--set", "--parallel=-1")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert result.returncode == 8, result.stdout + result.stderr
    assert "locked" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert project.unit.read_text() == before
    assert project.cli("history", "--json").stdout.count('"verdict"') == 0


def test_ledger_export_import_round_trip(project: Project, tmp_path: Path) -> None:
    result = project.cli("trial", "--set", "--parallel=-1")
    assert result.returncode == 10, result.stdout + result.stderr
    exported = tmp_path / "ledger.json"
    assert project.cli("ledger", "export", str(exported)).returncode == 0
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "flagtrial.toml").write_text(project.file.read_text())
    moved = cli(other / "flagtrial.toml", "ledger", "import", str(exported), timeout=60)
    assert moved.returncode == 0, moved.stderr
    again = cli(other / "flagtrial.toml", "ledger", "import", str(exported), timeout=60)
    assert again.returncode == 8 and "not empty" in again.stderr
    original = json.loads(exported.read_text())
    copy = Ledger(other / ".flagtrial" / "ledger.db").export()
    assert copy == original


def test_demo_reaches_revert_with_verified_restore(tmp_path: Path) -> None:
    result = cli(None, "demo", "--dir", str(tmp_path / "demo"), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "REVERT trial 1" in result.stdout
    assert "concurrent requests 8 -> 4 (-50.0 %)" in result.stdout
    assert "restored generation 1, verified" in result.stdout
    # attributed with no restart: --cont-batching is llama-server's default (its --help)
    assert "attribution of trial 1" in result.stdout
    assert re.search(r"add --cont-batching\s*.\s*useless", result.stdout), result.stdout
    assert re.search(r"set --parallel -1\s*.\s*harmful", result.stdout), result.stdout
    assert "spent 0 restarts and 0 s of load" in result.stdout
    assert "flagtrial trial --from-attribution 1" in result.stdout
    # the demo stops its server: nothing is left running
    pid = json.loads((tmp_path / "demo" / ".flagtrial" / "process" / "server.json").read_text())
    assert not Path(f"/proc/{pid['pid']}").exists()
