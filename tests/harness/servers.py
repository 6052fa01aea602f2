"""Waiting for a server this test started itself; a module's shared real server."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from flagtrial.settings import load_project
from flagtrial.targets import make_target
from flagtrial.targets.process import ProcessTarget
from harness.session import session_for


def wait_healthy(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"llama-server at {url} not healthy after {timeout_s}s")


def serve_known_good(project_file: Path) -> tuple[ProcessTarget, str]:
    """The project's known-good serving and recorded in the ledger, started only when another
    spec (or none) is serving: its target, and where that start's log begins (at its header:
    ProcessTarget.restart writes one per start)."""
    session = session_for(project_file)
    try:
        asyncio.run(session.known_good())
    finally:
        session.ledger.close()
    target = session.target
    assert isinstance(target, ProcessTarget)
    return target, str(target.log_path.read_bytes().rindex(b"=== flagtrial start"))


def stop_served(project_file: Path) -> None:
    """Stop the project's server, whichever spec it runs (the next serve starts it again)."""
    if project_file.exists():
        asyncio.run(make_target(load_project(project_file)).stop())  # type: ignore[attr-defined]
