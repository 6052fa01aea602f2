"""Bad command-line use and output hygiene: each a one-line error with its exit code, nothing
written that was not asked for, stdout that another tool can read."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from flagtrial.blocks import ServerDiedError
from flagtrial.demo import free_port, write_unit
from flagtrial.judge import decide
from flagtrial.launch.change import Change, Edit
from flagtrial.ledger import Ledger
from flagtrial.reasons import Code
from flagtrial.session import Session
from flagtrial.settings import Policy
from flagtrial.targets.process import ProcessTarget
from flagtrial.trial import Trial
from harness.cli import cli as run_cli
from harness.project import write_project_file
from harness.runsummaries import summary
from harness.session import session_for

# What it asserts rests on the server's facts, crashes, bounds and files, never on a
# measured difference: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`flagtrial ARGS`, no --project added."""
    return run_cli(None, *args, cwd=cwd)


def one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    return lines[0]


class Served:
    """A project with a real llama-server (8 slots) under the process target."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.file = root / "flagtrial.toml"
        self.unit = root / "llama.service"
        self.port = port

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(self.file, *args)

    def target(self) -> ProcessTarget:
        return ProcessTarget(self.unit, self.root / ".flagtrial" / "process")

    def session(self, on_event: object = None) -> Session:
        def notify(state: str, detail: str) -> None:
            if callable(on_event):
                on_event(state, detail)

        return session_for(self.file, notify)


@pytest.fixture
def served(tmp_path: Path, llama_server_bin: Path, tiny_model: Path) -> Iterator[Served]:
    port = free_port()
    proj = Served(tmp_path, port)
    write_unit(proj.unit, llama_server_bin, tiny_model, port)
    write_project_file(
        proj.file,
        f'unit = "llama.service"\nendpoint = "http://127.0.0.1:{port}"\nready_timeout_s = 30\n'
        "[workload]\nconcurrency = [4]\nprompt_words = 16\nmax_tokens = 8\n"
        "requests_per_run = 4\nwarmup_requests = 1\nrun_timeout_s = 60\n"
        "[policy]\nruns = 2\nmax_runs = 3\nset_aside_disturbed = false\n",
    )
    yield proj
    asyncio.run(proj.target().stop())


def test_version_and_shell_completion() -> None:
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("flagtrial 0."), version.stdout
    assert "--install-completion" in cli("--help").stdout


def test_project_path_that_is_a_folder(tmp_path: Path) -> None:
    line = one_line_error(cli("history", "-p", str(tmp_path)), 2)
    assert str(tmp_path / "flagtrial.toml") in line
    # a folder holding a project file names that file
    (tmp_path / "flagtrial.toml").write_text('unit = "u.service"\n')
    assert cli("history", "-p", str(tmp_path)).returncode == 0


def test_init_with_a_bad_engine_writes_nothing(tmp_path: Path) -> None:
    project = tmp_path / "flagtrial.toml"
    line = one_line_error(
        cli("init", "--unit", "u.service", "--engine", "foo", "-p", str(project)), 2
    )
    assert "engine" in line
    assert not project.exists()


def test_model_into_a_missing_folder_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent"
    one_line_error(cli("model", str(missing / "m.gguf"), "--size", "tiny"), 2)
    assert not missing.exists()


def test_missing_trial_and_generation_are_usage_errors(tmp_path: Path) -> None:
    project = tmp_path / "flagtrial.toml"
    project.write_text('unit = "u.service"\n')
    assert "no trial 999" in one_line_error(cli("show", "999", "-p", str(project)), 2)
    assert "no trial 999" in one_line_error(cli("report", "999", "-p", str(project)), 2)
    assert "no generation 999" in one_line_error(
        cli("rollback", "--to", "999", "-p", str(project)), 2
    )


def test_export_refuses_to_overwrite_and_bad_paths_are_one_line(tmp_path: Path) -> None:
    project = tmp_path / "flagtrial.toml"
    project.write_text('unit = "u.service"\n')
    out = tmp_path / "ledger.json"
    out.write_text("precious")
    assert "exists" in one_line_error(cli("ledger", "export", str(out), "-p", str(project)), 2)
    assert out.read_text() == "precious"
    assert cli("ledger", "export", str(out), "--force", "-p", str(project)).returncode == 0
    assert json.loads(out.read_text())["generations"] == []
    bad = tmp_path / "no" / "such" / "dir" / "x.json"
    one_line_error(cli("ledger", "export", str(bad), "-p", str(project)), 2)
    one_line_error(cli("report", "1", "-o", str(tmp_path), "-p", str(project)), 2)


def test_no_interval_reason_counts_the_clean_runs() -> None:
    """Every run clean, too few for an interval: the reason says so, not "no usable runs"."""
    from flagtrial.facts import FactsDiff

    runs = {4: [summary(100.0), summary(101.0)]}
    verdict = decide(Policy(), FactsDiff(capacity=[], explicit=[], implicit=[]), [], runs, runs)
    assert verdict.decision == "INCONCLUSIVE"
    assert verdict.reasons[0].code == Code.NO_INTERVAL
    assert verdict.reasons[0].values == {
        "metric": "output_tok_s",
        "label": "output tok/s",
        "level": 4,
        "baseline_runs": 2,
        "candidate_runs": 2,
    }


@pytest.mark.slow
def test_json_stdout_is_only_json_and_piped_output_is_not_wrapped(served: Served) -> None:
    result = served.cli("trial", "--add", "--alias=a-label-that-makes-the-line-long" * 3, "--json")
    assert result.returncode in (10, 11), result.stdout + result.stderr
    outcome = json.loads(result.stdout)  # nothing but the JSON document
    assert outcome["trial_id"] == 1
    assert "preflighted" in result.stderr  # progress went to stderr
    shown = served.cli("show", "1")
    # the change line is longer than 80 columns and arrives whole
    line = next(x for x in shown.stdout.splitlines() if "a-label-that" in x)
    assert len(line) > 100 and line.count("a-label-that") == 3


@pytest.mark.slow
def test_rollback_to_a_reverted_generation_is_refused(served: Served) -> None:
    result = served.cli("trial", "--add", "--alias=candidate")
    assert result.returncode in (10, 11), result.stdout + result.stderr
    before = served.unit.read_bytes()
    pid = served.target()._live_pid()
    line = one_line_error(served.cli("rollback", "--to", "2"), 2)
    assert "generation 2 was never known-good" in line
    assert served.unit.read_bytes() == before and served.target()._live_pid() == pid
    assert not Ledger(served.root / ".flagtrial" / "ledger.db").generation(2).known_good
    rolled = served.cli("rollback", "--to", "1", "--json")
    assert rolled.returncode == 0, rolled.stderr
    assert json.loads(rolled.stdout)["verified"] is True


@pytest.mark.slow
def test_server_killed_during_the_baseline_is_started_again(served: Served) -> None:
    """Nothing of the candidate was installed: the trial stops, but not with the server down."""
    target = served.target()
    killed: list[int] = []

    def kill_server(state: str, detail: str) -> None:
        if state == "measuring-baseline" and not killed:
            pid = target._live_pid()
            assert pid is not None
            os.killpg(pid, signal.SIGKILL)
            killed.append(pid)

    change = Change(edits=[Edit(op="add", name="--alias", value="candidate")])
    with pytest.raises(ServerDiedError, match="restarted: generation 1 serving, facts match"):
        asyncio.run(Trial(served.session(kill_server), change).run())
    assert killed
    pid = target._live_pid()
    assert pid is not None and pid != killed[0]
    trial = Ledger(served.root / ".flagtrial" / "ledger.db").trial(1)
    assert trial.state == "aborted"


@pytest.mark.slow
def test_a_change_that_changes_nothing_is_refused(served: Served) -> None:
    """`--set` of the value already there would run an A/A trial by accident."""
    assert served.cli("facts").returncode == 0
    before, pid = served.unit.read_bytes(), served.target()._live_pid()
    line = one_line_error(served.cli("trial", "--set", "--parallel=8"), 4)
    assert "leaves the launch spec as it is" in line
    assert served.unit.read_bytes() == before and served.target()._live_pid() == pid
    assert Ledger(served.root / ".flagtrial" / "ledger.db").trials() == []


@pytest.mark.slow
def test_every_reporting_command_has_json_and_nothing_else_on_stdout(served: Served) -> None:
    assert served.cli("facts").returncode == 0
    pre = served.cli("preflight", "--set", "--parallel=4", "--json")
    assert pre.returncode == 0, pre.stderr
    checked = json.loads(pre.stdout)
    assert checked["passed"] is True
    assert "+" in checked["diff"] and "--parallel 4" in checked["diff"]
    assert [e["name"] for e in checked["change"]["edits"]] == ["--parallel"]
    assert json.loads(served.cli("recover", "--json").stdout) == {"recovered": []}
    unlocked = json.loads(served.cli("unlock", "--json").stdout)
    assert unlocked == {"lock": "free", "holder": None, "trials": []}
    for args in (["history", "--json"], ["facts", "--json"], ["show", "1", "--json"]):
        out = served.cli(*args)
        if args[0] == "show":
            assert out.returncode == 2  # no trial yet: an error, and still nothing on stdout
            assert out.stdout == ""
        else:
            json.loads(out.stdout)
