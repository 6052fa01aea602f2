"""Reliability figures for the README: what a careful user's first hour tries, counted.

Against a real llama-server under the process target (a unit with secret Environment=
values, mode 0600, CRLF line endings and a Latin-1 comment), this runs:

- bad inputs: every one must be a one-line `error:` on stderr with its documented exit code,
  leave the unit byte-identical (mode too) and the server on the same PID (no restart spent),
  and leave the ledger consistent (integrity check passes, no unfinished trial);
- a whole trial with `--env HF_TOKEN=...`, then every output a person or a tool reads
  (terminal, --json, history, show, report, ledger export, preflight diff, the ledger's
  readable copies): the secret values are counted wherever they appear;
- bytes: the unit after a REVERT, compared with the bytes before;
- read-only and lock commands (facts, history, show, report, unlock) run while a trial is
  live: the trial must end with its own verdict, no failed request and state `reverted`.

Usage: python benchmarks/reliability/run.py [--out benchmarks/reliability/results.json]
Exit 0 when every figure is as the README claims (0 secrets, 0 bytes, 0 disturbed).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from flagtrial.cache import llama_server_path
from flagtrial.demo import free_port
from flagtrial.modelgen import generate_model

HERE = Path(__file__).resolve().parent
FLAGTRIAL = [sys.executable, "-m", "flagtrial"]
SECRETS = {
    "HF_TOKEN": "hf_s3cr3tUNITvalue0001",
    "OPENAI_API_KEY": "sk-s3cr3tUNITvalue0002",
    "CHANGE_TOKEN": "hf_s3cr3tCHANGEvalue0003",
}
# Exit codes the README documents for errors.
DOCUMENTED = {1, 2, 3, 4, 5, 6, 7, 8, 9}


@dataclass
class BadInput:
    args: list[str]
    expect: int  # the exit code it must give
    what: str
    project: str | None = None  # a project file text to use instead of the good one
    unit: bytes | None = None  # unit bytes to use instead of the good ones


@dataclass
class Outcome:
    what: str
    args: list[str]
    exit_code: int
    expected: int
    one_line: bool
    unit_unchanged: bool
    no_restart: bool
    ledger_consistent: bool
    stderr: str

    @property
    def ok(self) -> bool:
        return (
            self.exit_code == self.expected
            and self.one_line
            and self.unit_unchanged
            and self.no_restart
            and self.ledger_consistent
        )


@dataclass
class Results:
    bad_inputs: list[Outcome] = field(default_factory=list)
    secrets_found: dict[str, int] = field(default_factory=dict)
    bytes_changed_outside_edit: int = 0
    live_trials: int = 0
    live_trials_disturbed: int = 0
    notes: list[str] = field(default_factory=list)


BAD_INPUTS = [
    BadInput(["preflight", "--set", "--parallel=abc"], 4, "non-numeric N"),
    BadInput(["preflight", "--set", "--parallel="], 4, "empty N"),
    BadInput(["preflight", "--set", "-c=-5"], 4, "negative context"),
    BadInput(["preflight", "--set", "-t=1.5"], 4, "fractional threads"),
    BadInput(["trial", "--set", "--parallel=abc"], 4, "non-numeric N, trial"),
    BadInput(["preflight", "--add", "-np=8"], 4, "option given twice"),
    BadInput(["preflight", "--add", "--port=9999"], 4, "port moves off the endpoint"),
    BadInput(["preflight", "--set", "--host=10.1.2.3"], 4, "host moves off the endpoint"),
    BadInput(["preflight", "--add", "--paralel=4"], 4, "unknown flag"),
    BadInput(["preflight", "--remove", "--mlock"], 4, "remove an absent flag"),
    BadInput(["trial", "--add", "--alias=x", "--remove", "--alias"], 4, "add then remove"),
    BadInput(["preflight", "--env", "=x"], 4, "empty variable name"),
    BadInput(["preflight", "--add", "--rope-scaling=cubic"], 4, "bad choice"),
    BadInput(["preflight"], 2, "no edit"),
    BadInput(["show", "999"], 2, "no such trial"),
    BadInput(["report", "999"], 2, "no such trial, report"),
    BadInput(["rollback", "--to", "999"], 2, "no such generation"),
    BadInput(["history"], 2, "malformed project file", project="target = [\n"),
    BadInput(["history"], 2, "unknown project key", project='unit = "u"\nbogus = 1\n'),
    BadInput(["facts"], 2, "bad target", project='unit = "u"\ntarget = "ftp://x"\n'),
    BadInput(["preflight", "--add", "--alias=x"], 3, "malformed unit", unit=b"[Service]\n"),
    BadInput(
        ["preflight", "--add", "--alias=x"],
        3,
        "unterminated quote",
        unit=b'[Service]\nExecStart=/bin/llama-server "--port 1\n',
    ),
    BadInput(["init", "--unit", "u.service", "--engine", "foo", "--force"], 2, "bad engine"),
    BadInput(["model", "/nonexistent-flagtrial/m.gguf", "--size", "tiny"], 2, "missing folder"),
    BadInput(["ledger", "export", "/nonexistent-flagtrial/x.json"], 2, "unwritable export"),
    BadInput(["report", "1", "-o", "/"], 2, "report to a folder"),
    BadInput(["preflight", "--env", "A=1", "--unset-env", "A"], 4, "one variable, two edits"),
    BadInput(["preflight", "--add", "--cont-batching", "--add", "--cont-batching"], 4, "twice"),
    BadInput(["preflight", "--set", "-np=4", "--set", "--parallel=5"], 4, "two values, one flag"),
    BadInput(["show", "-1"], 2, "negative trial"),
    BadInput(["init", "--unit", "u", "--target", "ftp://x", "--force"], 2, "bad target"),
    BadInput(
        ["facts"],
        5,
        "unreachable host",
        project='unit = "u.service"\ntarget = "ssh://root@127.0.0.1:1"\n',
    ),
    BadInput(["history"], 2, "project file not UTF-8", project='unit = "caf\udce9"\n'),
]


class Bench:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.file = root / "flagtrial.toml"
        self.unit = root / "llama.service"
        self.ledger = root / ".flagtrial" / "ledger.db"
        self.port = free_port()
        model = generate_model(root / "tiny.gguf", size="tiny", seed=1)
        self.unit_bytes = (
            "# llama-server, edit with care: caf\xe9 du mati\xe9\r\n"
            "[Unit]\r\nDescription=llama-server (reliability)\r\n\r\n[Service]\r\n"
            f"Environment=HF_TOKEN={SECRETS['HF_TOKEN']}\r\n"
            f'Environment="OPENAI_API_KEY={SECRETS["OPENAI_API_KEY"]}" LLAMA_LOG_COLORS=off\r\n'
            f"ExecStart={llama_server_path()} -m {model} --host 127.0.0.1 --port {self.port} "
            "-t 1 -c 2048 -np 4\r\n"
        ).encode("latin-1")
        self.project_text = (
            f'unit = "llama.service"\nendpoint = "http://127.0.0.1:{self.port}"\n'
            "ready_timeout_s = 30\n"
            "[workload]\nconcurrency = [4]\nprompt_words = 16\nmax_tokens = 16\n"
            "requests_per_run = 8\nwarmup_requests = 1\nrun_timeout_s = 60\n"
            "[policy]\nruns = 2\nmax_runs = 4\nset_aside_disturbed = false\n"
        )
        self.reset()

    def reset(self) -> None:
        self.unit.write_bytes(self.unit_bytes)
        os.chmod(self.unit, 0o600)
        self.file.write_text(self.project_text)

    def cli(self, *args: str, project: bool = True) -> subprocess.CompletedProcess[str]:
        extra = ["--project", str(self.file)] if project else []
        env = {**os.environ, "COLUMNS": "100"}
        return subprocess.run(
            [*FLAGTRIAL, *args, *extra],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=self.root,
            errors="replace",
        )

    def server_pid(self) -> int | None:
        path = self.root / ".flagtrial" / "process" / "server.json"
        try:
            return int(json.loads(path.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None

    def ledger_consistent(self) -> bool:
        if not self.ledger.exists():
            return True
        db = sqlite3.connect(self.ledger)
        try:
            ok = db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            open_trials = db.execute(
                "SELECT count(*) FROM trials WHERE finished_at IS NULL"
            ).fetchone()[0]
        finally:
            db.close()
        return ok and open_trials == 0

    def try_bad(self, bad: BadInput) -> Outcome:
        self.reset()
        if bad.project is not None:
            self.file.write_bytes(bad.project.encode("utf-8", "surrogateescape"))
        if bad.unit is not None:
            self.unit.write_bytes(bad.unit)
            os.chmod(self.unit, 0o600)
        before = (self.unit.read_bytes(), os.stat(self.unit).st_mode)
        pid = self.server_pid()
        args = list(bad.args)
        uses_project = args[0] not in ("model",)
        if args[0] == "init":
            args += ["--project", str(self.root / "scratch.toml")]
            uses_project = False
        r = self.cli(*args, project=uses_project)
        lines = r.stderr.strip().splitlines()
        outcome = Outcome(
            what=bad.what,
            args=bad.args,
            exit_code=r.returncode,
            expected=bad.expect,
            one_line=len(lines) == 1
            and lines[0].startswith("error:")
            and "Traceback" not in r.stderr,
            unit_unchanged=(self.unit.read_bytes(), os.stat(self.unit).st_mode) == before,
            no_restart=self.server_pid() == pid,
            ledger_consistent=self.ledger_consistent(),
            stderr=r.stderr.strip()[-300:],
        )
        if args[0] == "init":
            outcome.unit_unchanged &= not (self.root / "scratch.toml").exists()
        self.reset()
        return outcome


def count_secrets(texts: dict[str, str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for where, text in texts.items():
        n = sum(text.count(v) for v in SECRETS.values())
        if n:
            found[where] = n
    return found


def readable_outputs(bench: Bench, trial_out: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """Every output of the trial a person or a tool reads, by where it came from."""
    out: dict[str, str] = {"trial stdout": trial_out.stdout, "trial stderr": trial_out.stderr}
    for args in (
        ["history"],
        ["history", "--json"],
        ["show", "1"],
        ["show", "1", "--json"],
        ["facts"],
        ["facts", "--json"],
        ["preflight", "--env", f"CHANGE_TOKEN={SECRETS['CHANGE_TOKEN']}"],
    ):
        r = bench.cli(*args)
        out[" ".join(args[:2])] = r.stdout + r.stderr
    page = bench.root / "trial.html"
    r = bench.cli("report", "1", "-o", str(page))
    out["report"] = r.stdout + r.stderr + (page.read_text() if page.exists() else "")
    export = bench.root / "export.json"
    r = bench.cli("ledger", "export", str(export), "--force")
    out["ledger export"] = r.stdout + r.stderr + (export.read_text() if export.exists() else "")
    mode = os.stat(bench.ledger).st_mode & 0o777
    if mode & 0o077:
        out["ledger file mode"] = f"{mode:o} " + " ".join(SECRETS.values())
    return out


def live_trial(bench: Bench, results: Results) -> None:
    """Read-only and lock commands while a trial runs must not touch it."""
    bench.reset()
    env = {**os.environ, "COLUMNS": "100"}
    proc = subprocess.Popen(
        [*FLAGTRIAL, "trial", "--add", "--alias=live", "--json", "--project", str(bench.file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "measuring" not in _trial_state(bench):
        time.sleep(0.2)
    for args in (["facts"], ["history"], ["show", "1"], ["unlock"], ["recover"], ["facts"]):
        r = bench.cli(*args)
        if "recover" in r.stdout and args == ["history"]:
            results.notes.append("history told the user to recover a live trial")
    out, err = proc.communicate(timeout=600)
    results.live_trials += 1
    try:
        outcome = json.loads(out)
        disturbed = outcome["outcome"] != "reverted" or _trial_state(bench) != "reverted"
        disturbed |= any(r.get("n_errors") for r in _runs(bench))
    except (ValueError, KeyError):
        disturbed = True
        results.notes.append(f"live trial ended badly: rc {proc.returncode}: {err[-300:]}")
    results.live_trials_disturbed += int(disturbed)


def _trial_state(bench: Bench) -> str:
    if not bench.ledger.exists():
        return ""
    db = sqlite3.connect(bench.ledger)
    try:
        row = db.execute("SELECT state FROM trials ORDER BY id DESC LIMIT 1").fetchone()
    except sqlite3.Error:
        return ""
    finally:
        db.close()
    return row[0] if row else ""


def _runs(bench: Bench) -> list[dict[str, object]]:
    db = sqlite3.connect(bench.ledger)
    try:
        rows = db.execute("SELECT summary_json FROM runs").fetchall()
    finally:
        db.close()
    return [json.loads(r[0]) for r in rows]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=HERE / "results.json")
    opts = ap.parse_args()
    results = Results()
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp))
        try:
            r = bench.cli("facts")  # the known-good, started and read once
            if r.returncode != 0:
                raise SystemExit(f"known-good does not start: {r.stderr}")
            before = bench.unit.read_bytes()
            trial = bench.cli(
                "trial", "--env", f"HF_TOKEN={SECRETS['CHANGE_TOKEN']}", "--add", "--alias=x"
            )
            results.bytes_changed_outside_edit += int(bench.unit.read_bytes() != before)
            results.bytes_changed_outside_edit += int(os.stat(bench.unit).st_mode & 0o777 != 0o600)
            results.secrets_found = count_secrets(readable_outputs(bench, trial))
            for bad in BAD_INPUTS:
                results.bad_inputs.append(bench.try_bad(bad))
            live_trial(bench, results)
        finally:
            bench.cli("rollback")
            subprocess.run(["pkill", "-f", "--", f"--port {bench.port}"], check=False)
    ok = [b for b in results.bad_inputs if b.ok]
    summary = {
        "bad_inputs_tried": len(results.bad_inputs),
        "bad_inputs_handled": len(ok),
        "secrets_found_in_outputs": sum(results.secrets_found.values()),
        "bytes_changed_outside_an_edit": results.bytes_changed_outside_edit,
        "live_trials": results.live_trials,
        "live_trials_disturbed": results.live_trials_disturbed,
    }
    opts.out.write_text(
        json.dumps(
            {
                "summary": summary,
                "secrets_found": results.secrets_found,
                "bad_inputs": [
                    {**asdict(b), "ok": b.ok, "documented": b.exit_code in DOCUMENTED}
                    for b in results.bad_inputs
                ],
                "notes": results.notes,
            },
            indent=1,
        )
    )
    print(json.dumps(summary, indent=1))
    for b in results.bad_inputs:
        if not b.ok:
            print(f"FAILED {b.what}: {b.args} -> {b.exit_code} (want {b.expected}): {b.stderr}")
    for where, n in results.secrets_found.items():
        print(f"SECRET in {where}: {n}")
    clean = (
        len(ok) == len(results.bad_inputs)
        and not results.secrets_found
        and results.bytes_changed_outside_edit == 0
        and results.live_trials_disturbed == 0
    )
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
