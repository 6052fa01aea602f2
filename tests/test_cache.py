"""Cache entries written by several flagtrials at once (two preflights, two test workers):
each writer's own temporary file, so none fails on another's rename and no reader sees a
mix of two writes."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from flagtrial.cache import store

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine


def test_writers_of_one_entry_at_once_leave_one_whole_write(tmp_path: Path) -> None:
    path = tmp_path / "entries" / "schema.json"
    texts = [str(n) * 200_000 for n in range(8)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(texts))

    def write(text: str) -> None:
        start.wait()
        try:
            for _ in range(20):
                store(path, text)
        except BaseException as e:  # reported by the assert below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert path.read_text() in texts
    assert [p.name for p in path.parent.iterdir()] == ["schema.json"]  # no temporaries left
