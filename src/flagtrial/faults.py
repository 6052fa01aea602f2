"""Test hook: stop flagtrial at a named point of a trial, so fault tests reach every point
deterministically instead of by timing luck.

FLAGTRIAL_FAULTS="candidate-run-1=KILL,reverting=INT" sends the named signal to this process
when the trial passes that point. Unset (always, outside tests) it does nothing.
"""

from __future__ import annotations

import os
import signal

ENV = "FLAGTRIAL_FAULTS"


def checkpoint(point: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    for item in spec.split(","):
        name, _, action = item.partition("=")
        if name == point:
            os.kill(os.getpid(), getattr(signal, f"SIG{action or 'KILL'}"))
