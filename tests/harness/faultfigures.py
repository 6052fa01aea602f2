"""Figures the fault-injection suite prints at the end: faults tried, recovered, records lost."""

from __future__ import annotations

from collections import Counter

FIGURES: Counter[str] = Counter()


def record(kind: str, recovered: bool, lost: int) -> None:
    FIGURES[f"{kind} tried"] += 1
    FIGURES[f"{kind} recovered"] += int(recovered)
    FIGURES["records lost"] += lost


def lines() -> list[str]:
    if not FIGURES:
        return []
    order = ["kill points", "network faults", "signals", "ledger faults"]
    out = [
        f"{kind}: {FIGURES[kind + ' tried']} tried, {FIGURES[kind + ' recovered']} recovered"
        for kind in order
        if FIGURES[kind + " tried"]
    ]
    return [*out, f"records lost: {FIGURES['records lost']}"]
