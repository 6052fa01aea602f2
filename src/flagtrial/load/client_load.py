"""What sending a run cost the load client itself: how busy its event loop's thread was and
how late the loop woke, so that a run the client could not keep up with is told apart."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

# How often the client's event loop is woken to see how late it runs.
LAG_PROBE_S = 0.005


def _thread_busy_s() -> float:
    """Seconds the calling thread has been on a CPU or runnable waiting for one (Linux's
    schedstat); its CPU time alone where the kernel keeps no schedstat."""
    try:
        on_cpu, waiting = Path("/proc/thread-self/schedstat").read_text().split()[:2]
    except (OSError, ValueError):
        return time.thread_time()
    return (int(on_cpu) + int(waiting)) / 1e9


@dataclass
class ClientLoad:
    """How busy sending a run kept the client: its event loop's thread (on a CPU or waiting
    for one: either way no response was read meanwhile) and how late the loop woke."""

    busy_s: float = 0.0
    lags_s: list[float] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()

        async def probe() -> None:
            while True:
                due = loop.time() + LAG_PROBE_S
                await asyncio.sleep(LAG_PROBE_S)
                self.lags_s.append(max(0.0, loop.time() - due))

        busy = _thread_busy_s()
        task = asyncio.create_task(probe())
        try:
            yield
        finally:
            task.cancel()
            self.busy_s = _thread_busy_s() - busy
