"""A real llama-server for the harness: loopback only, restarted on demand, always stopped."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from flagtrial.cache import cache_root, llama_server_path
from flagtrial.demo import free_port
from flagtrial.modelgen import generate_model

# The demo's server: 8 slots of 1024 tokens, one thread (the measured setup).
DEFAULT_ARGS = ("--threads", "1", "--ctx-size", "8192", "--parallel", "8")


def model(size: str = "small") -> Path:
    return generate_model(cache_root() / "bench-models" / f"{size}.gguf", size=size, seed=1)  # type: ignore[arg-type]


class Server:
    """One llama-server on one port; `restart(args)` swaps its flags (a 'restart block')."""

    def __init__(self, model_path: Path, log: Path) -> None:
        self.model = model_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, args: tuple[str, ...] = DEFAULT_ARGS) -> float:
        """Start with `args`; returns seconds until /health answered 200."""
        began = time.monotonic()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(llama_server_path()),
                    "-m",
                    str(self.model),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    *args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = began + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise RuntimeError(f"llama-server exited with {code}: see {self.log}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return time.monotonic() - began
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        raise TimeoutError("llama-server not healthy in 60 s")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self, args: tuple[str, ...] = DEFAULT_ARGS) -> float:
        began = time.monotonic()
        self.stop()
        self.start(args)
        return time.monotonic() - began


@contextmanager
def server(log: Path, size: str = "small") -> Iterator[Server]:
    s = Server(model(size), log)
    try:
        yield s
    finally:
        s.stop()
