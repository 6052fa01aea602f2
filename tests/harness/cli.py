"""The `flagtrial` CLI run as a user runs it: its own process, this checkout's interpreter
(`python -m flagtrial`, so PYTHONPATH reaches it), output captured as text."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

FLAGTRIAL = [sys.executable, "-m", "flagtrial"]


def environment(faults: str | None = None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, COLUMNS=250, FLAGTRIAL_FAULTS when given, then `env`."""
    out = {**os.environ, "COLUMNS": "250"}
    if faults is not None:
        out["FLAGTRIAL_FAULTS"] = faults
    return {**out, **(env or {})}


def as_at_a_terminal() -> None:
    """In the child before exec: Ctrl-C as a terminal delivers it. A suite started in the
    background by a shell without job control inherits SIGINT ignored, and so would every
    flagtrial it starts (ignored signals survive exec): the interrupt tests would test
    nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def command(project: Path | None, args: tuple[str, ...]) -> list[str]:
    return [*FLAGTRIAL, *args, *(["--project", str(project)] if project is not None else [])]


def cli(
    project: Path | None,
    *args: str,
    faults: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    input: str | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """`flagtrial ARGS --project PROJECT` (no --project when `project` is None), to its end."""
    return subprocess.run(
        command(project, args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment(faults, env),
        input=input,
        cwd=cwd,
        preexec_fn=as_at_a_terminal,
    )


def start(
    project: Path | None,
    *args: str,
    faults: str | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[str]:
    """The same command left running: stdout and stderr together on `.stdout`."""
    return subprocess.Popen(
        command(project, args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment(faults, env),
        preexec_fn=as_at_a_terminal,
    )


def said(result: subprocess.CompletedProcess[str]) -> str:
    """What a command printed, as one line: the terminal's wrapping undone."""
    return " ".join((result.stdout + result.stderr).split())


def capacity(project: Path) -> dict[str, float]:
    """The serving known-good's capacity facts, as `flagtrial facts --json` reads them."""
    result = cli(project, "facts", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    # Progress lines come first when it starts the server.
    found: dict[str, float] = json.loads(result.stdout[result.stdout.index("{\n") :])["facts"][
        "capacity"
    ]
    return found


def wait_stopped(proc: subprocess.Popen[str]) -> None:
    """Until the test hook has stopped the command (SIGSTOP at its fault point)."""
    deadline = time.monotonic() + 240
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the trial never reached its fault point"
        time.sleep(0.1)
