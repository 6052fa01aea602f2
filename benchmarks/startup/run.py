"""Measure what starting a command costs: whole-process wall time of `python -m flagtrial ...`.

Targets (issue 14, item 7): `--help`, `history` and `show` under 0.3 s; a cached `gates`
query under 1 s. Each command runs `--repeat` times (after one untimed run that warms the
file cache and builds the gate index); the median and the spread (min, max) are reported.
The machine's load average is recorded beside every number: other work on the same cores
slows a start proportionally. Also records the floor (a bare interpreter, Typer with Rich,
and a bare Typer app's --help) and the heaviest imports of `flagtrial.cli` from
`python -X importtime`. Writes results.json next to this file.

    PYTHONPATH=src .venv/bin/python benchmarks/startup/run.py [--repeat 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flagtrial.ledger import Ledger
from flagtrial.settings import load_project
from flagtrial.states import TrialState as S

HERE = Path(__file__).parent
GATES_QUERY = ["gates", "--attention-backend", "fa3", "--engine", "sglang==0.5.23", "--sm", "90"]
UNIT = "[Service]\nExecStart=/usr/bin/llama-server -m /models/m.gguf --port 8080 -np 4\n"
# Typer's own --help of a two-command app: Rich's help rendering (rich.markdown, pygments)
# is imported by Typer for every --help.
BARE_TYPER_HELP = (
    "import typer; app = typer.Typer(); app.command('a')(lambda: None); "
    "app.command('b')(lambda: None); app()"
)
SUMMARY = {"concurrency": 4, "output_tok_s": 120.0, "ttft_p99": 0.2, "n_errors": 0}


def make_project(root: Path) -> Path:
    """A process-target project whose ledger holds one finished trial with two runs."""
    (root / "llama.service").write_text(UNIT)
    project = root / "flagtrial.toml"
    project.write_text('unit = "llama.service"\nendpoint = "http://127.0.0.1:8080"\n')
    ledger = Ledger(load_project(project).ledger_path)
    base = ledger.record_generation("llama.service", UNIT)
    cand = ledger.record_generation("llama.service", UNIT.replace("-np 4", "-np 8"))
    ledger.mark_known_good(base.id, {})
    change = {"edits": [{"op": "set", "name": "-np", "value": "8"}]}
    trial = ledger.start_trial("llama.service", change, base.id)
    for arm in ("baseline", "candidate"):
        ledger.add_run(trial, arm, 4, 0, SUMMARY)
    for state in (S.PREFLIGHTED, S.MEASURING_BASELINE, S.JUDGED, S.REVERTING):
        ledger.step(trial, state)
    ledger.step(trial, S.REVERTED, "no gain", candidate_gen=cand.id, verdict="REVERT")
    ledger.close()
    return project


def timed(argv: list[str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one run of `argv`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return seconds, cpu


def measure(argv: list[str], cwd: Path, repeat: int) -> dict[str, object]:
    """Wall time is what a user waits; on a loaded machine it grows with the load while
    the CPU time (what the start costs the machine) does not, so both are kept."""
    timed(argv, cwd)  # warm the file cache (and, for gates, the index)
    load = os.getloadavg()[0]
    runs = [timed(argv, cwd) for _ in range(repeat)]
    times, cpu = [w for w, _ in runs], [c for _, c in runs]
    return {
        "median_s": round(statistics.median(times), 4),
        "min_s": round(min(times), 4),
        "max_s": round(max(times), 4),
        "cpu_median_s": round(statistics.median(cpu), 4),
        "repeat": repeat,
        "load_average_before": round(load, 2),
        "load_average_after": round(os.getloadavg()[0], 2),
    }


def heaviest_imports(module: str, top: int = 15) -> list[dict[str, object]]:
    """The modules whose import (with what they import) took longest, from -X importtime."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = line.removeprefix("import time:").split("|")
            rows.append({"module": name.strip(), "cumulative_ms": int(cumulative) / 1000})
    rows.sort(key=lambda r: -float(str(r["cumulative_ms"])))
    return rows[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--out", type=Path, default=HERE / "results.json")
    parser.add_argument("--label", default="", help="what tree was measured, e.g. a commit")
    args = parser.parse_args()
    py = [sys.executable]
    ft = [*py, "-m", "flagtrial"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        project = str(make_project(root))
        commands = {
            "python -c pass": [*py, "-c", "pass"],
            "import typer, rich (floor)": [*py, "-c", "import typer, rich.console, rich.table"],
            "bare Typer app --help (floor)": [*py, "-c", BARE_TYPER_HELP, "--help"],
            "flagtrial --help": [*ft, "--help"],
            "flagtrial history": [*ft, "history", "-p", project],
            "flagtrial show 1": [*ft, "show", "1", "-p", project],
            "flagtrial gates (cached)": [*ft, *GATES_QUERY],
        }
        results = {name: measure(argv, root, args.repeat) for name, argv in commands.items()}
    where = subprocess.run(
        [*py, "-c", "import flagtrial; print(flagtrial.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    out = {
        "label": args.label,
        "flagtrial": where.stdout.strip(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_at_start": round(os.getloadavg()[0], 2),
        },
        "targets_s": {"--help, history, show": 0.3, "gates (cached)": 1.0},
        "commands": results,
        "heaviest_imports_of_flagtrial.cli": heaviest_imports("flagtrial.cli"),
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for name, r in results.items():
        print(
            f"{name:28} median {r['median_s']:.3f} s  [{r['min_s']:.3f}, {r['max_s']:.3f}]"
            f"  CPU {r['cpu_median_s']:.3f} s  load {r['load_average_before']}"
        )


if __name__ == "__main__":
    main()
