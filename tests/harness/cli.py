"""The `flagtrial` CLI run as a user runs it: its own process, this checkout's interpreter
(`python -m flagtrial`, so PYTHONPATH reaches it), output captured as text."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

FLAGTRIAL = [sys.executable, "-m", "flagtrial"]


def environment(faults: str | None = None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, COLUMNS=250, FLAGTRIAL_FAULTS when given, then `env`."""
    out = {**os.environ, "COLUMNS": "250"}
    if faults is not None:
        out["FLAGTRIAL_FAULTS"] = faults
    return {**out, **(env or {})}


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
    )
