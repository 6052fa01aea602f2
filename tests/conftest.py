"""Shared fixtures: the real llama-server binary, generated GGUF models, a running server."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flagtrial.cache import llama_server_path
from flagtrial.demo import free_port
from flagtrial.launch.schema import FlagSchema
from flagtrial.modelgen import generate_model
from harness import machine
from harness.servers import wait_healthy

# The real vLLM and SGLang servers' fixtures (vllm_server, sglang_server, ...).
pytest_plugins = ["harness.vllm_fixtures", "harness.sglang_fixtures"]


# The machine lock of this worker (harness/machine.py), None outside xdist; the controller's
# folder of its lock files.
_MACHINE = pytest.StashKey["machine.MachineLock | None"]()
_LOCK_FOLDER = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_MACHINE] = machine.for_worker(config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist's controller, for each worker it starts: the run's one lock folder."""
    config = node.config
    if _LOCK_FOLDER not in config.stash:
        config.stash[_LOCK_FOLDER] = machine.lock_folder()
    node.workerinput[machine.FOLDER_KEY] = str(config.stash[_LOCK_FOLDER])


def pytest_unconfigure(config: pytest.Config) -> None:
    if _LOCK_FOLDER in config.stash:
        shutil.rmtree(config.stash[_LOCK_FOLDER], ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules that share the machine first, the largest first, so the two workers run them
    side by side; the modules that need the machine alone after them (`make test` keeps this
    order with --no-loadscope-reorder)."""
    per_module = Counter(machine.module_of(item) for item in items)
    items.sort(
        key=lambda item: (
            item.get_closest_marker(machine.MARK) is None,
            -per_module[machine.module_of(item)],
        )
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    lock = item.config.stash[_MACHINE]
    if lock is None:
        return (yield)
    lock.enter(item)
    try:
        return (yield)
    finally:
        lock.leave(item, nextitem)


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    path = llama_server_path()
    if not path.exists():
        # make test builds it first; a missing binary is a set-up failure, not a skip.
        pytest.fail(f"llama-server not built at {path}: run scripts/build-llama-server.sh")
    return path


@pytest.fixture(scope="session")
def llama(llama_server_bin: Path) -> FlagSchema:
    """The real llama-server's flag schema, from its own --help."""
    help_text = subprocess.run(
        [str(llama_server_bin), "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return FlagSchema.parse_help(help_text, program=str(llama_server_bin))


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_model(models_dir: Path) -> Path:
    return generate_model(models_dir / "tiny.gguf", size="tiny", seed=1)


@pytest.fixture(scope="session")
def small_model(models_dir: Path) -> Path:
    return generate_model(models_dir / "small.gguf", size="small", seed=1)


@pytest.fixture
def run_llama_server(llama_server_bin: Path, tmp_path: Path) -> Iterator:
    """Factory: start a real llama-server with extra args; every server is stopped afterwards."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(model: Path, *args: str) -> str:
        port = free_port()
        log = open(tmp_path / f"llama-{port}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [
                str(llama_server_bin),
                "-m",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        return url

    yield start
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def have(cmd: str) -> bool:
    return shutil.which(cmd) is not None


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from harness.faultfigures import lines

    if lines():
        terminalreporter.section("fault injection")
        for line in lines():
            terminalreporter.write_line(line)
