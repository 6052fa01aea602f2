"""Prometheus text exposition format (what `/metrics` serves), read into samples.

`name{label="value",...} 1.0 [timestamp]`; `# HELP` / `# TYPE` lines are skipped. Label
values unescape `\\\\`, `\\"` and `\\n` as the format defines.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'\s*([A-Za-z_]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True)
class Sample:
    name: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)


def _unescape(text: str) -> str:
    return re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], text)


def parse(text: str) -> list[Sample]:
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(m["labels"] or "")}
        try:
            value = float(m["value"])
        except ValueError:
            value = math.nan
        samples.append(Sample(m["name"], value, labels))
    return samples


def first(samples: list[Sample], name: str) -> Sample | None:
    return next((s for s in samples if s.name == name), None)
