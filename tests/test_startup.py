"""A command imports what it uses when it uses it: starting the CLI, `--help`, `history` and
`show` load none of the trial's heavy dependencies (scipy alone took about 1 s of every
start). Timings are in benchmarks/startup; this checks which modules load, not how fast."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flagtrial.ledger import Ledger
from flagtrial.settings import load_project
from flagtrial.states import TrialState as S

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

# Each is imported by the commands that use it (trial, facts, report, gates, ssh targets).
HEAVY = (
    "scipy",
    "numpy",
    "asyncssh",
    "httpx",
    "plotly",
    "jinja2",
    "flagtrial.gates.index",
    "flagtrial.gates.analyze",
    "flagtrial.engines",
    "flagtrial.trial",
    "flagtrial.stats",
)
UNIT = "[Service]\nExecStart=/usr/bin/llama-server -m /m.gguf --port 8080 -np 4\n"


def heavy_loaded(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def imported_by(*args: str) -> set[str]:
    """The modules a run of `python -m flagtrial ARGS` imported (from -X importtime)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "flagtrial", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project whose ledger holds one finished trial."""
    (tmp_path / "llama.service").write_text(UNIT)
    path = tmp_path / "flagtrial.toml"
    path.write_text('unit = "llama.service"\n')
    ledger = Ledger(load_project(path).ledger_path)
    base = ledger.record_generation("llama.service", UNIT)
    trial = ledger.start_trial(
        "llama.service", {"edits": [{"op": "set", "name": "-np", "value": "8"}]}, base.id
    )
    for state in (S.PREFLIGHTED, S.MEASURING_BASELINE, S.JUDGED, S.REVERTING):
        ledger.step(trial, state)
    ledger.step(trial, S.REVERTED, "no gain", verdict="REVERT")
    ledger.close()
    return path


def test_importing_the_cli_loads_nothing_heavy() -> None:
    probe = "import sys, flagtrial.cli; print(' '.join(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert heavy_loaded(set(done.stdout.split())) == []


def test_help_history_and_show_load_nothing_heavy(project: Path) -> None:
    for args in (["--help"], ["history", "-p", str(project)], ["show", "1", "-p", str(project)]):
        modules = imported_by(*args)
        assert "flagtrial.cli" in modules  # the probe saw the command's own imports
        assert heavy_loaded(modules) == [], args
