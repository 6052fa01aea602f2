"""One machine, two pytest workers: a module that measures has the machine to itself.

`make test` runs the suite on pytest-xdist workers, each module whole on one worker
(`--dist loadfile`). A module whose tests measure a server (a trial, a load run, a server's
start under a deadline) would read another worker's CPU as foreign load and set its runs
aside, so it holds the machine exclusively from its first test's set-up to its last test's
tear-down: its module-scoped servers and containers live that long. A module marked
`shares_machine` (nothing in it is measured) holds the machine shared, so two such modules
run side by side. Unmarked is exclusive: a new module is safe before it is fast.

A readers-writer lock from two flocks: a module that wants the machine to itself takes the
turnstile first and keeps it until it has the machine, so shared holders queue behind it
instead of starving it. Without xdist there is one worker and nothing is locked.
"""

from __future__ import annotations

import fcntl
import tempfile
from pathlib import Path
from typing import IO

import pytest

MARK = "shares_machine"


def module_of(item: pytest.Item) -> str:
    """The test file an item belongs to: the unit a worker runs whole (--dist loadfile)."""
    return item.nodeid.split("::")[0]


class MachineLock:
    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self._turnstile = open(folder / "turnstile.lock", "a")  # noqa: SIM115 - held all run
        self._machine: IO[str] = open(folder / "machine.lock", "a")  # noqa: SIM115
        self._module: str | None = None

    def enter(self, item: pytest.Item) -> None:
        """Hold the machine for the item's module, unless this worker already does."""
        module = module_of(item)
        if module == self._module:
            return
        shared = item.get_closest_marker(MARK) is not None
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._machine, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        finally:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        self._module = module

    def leave(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        """Let the machine go after the module's last item (its tear-down included)."""
        module = module_of(item)
        if nextitem is not None and module_of(nextitem) == module:
            return
        fcntl.flock(self._machine, fcntl.LOCK_UN)
        self._module = None


FOLDER_KEY = "flagtrial_machine_lock"


def lock_folder() -> Path:
    """The folder of one run's lock files, made by the xdist controller for its workers."""
    return Path(tempfile.mkdtemp(prefix="flagtrial-tests-"))


def for_worker(config: pytest.Config) -> MachineLock | None:
    """This worker's side of the run's lock; None outside xdist."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return None
    return MachineLock(Path(workerinput[FOLDER_KEY]))
