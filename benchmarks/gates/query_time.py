"""Issue 13's speed target: a query under 1 s with the version's index and the engine's
resolution cached, the index under 10 s to build.

    PYTHONPATH=src .venv/bin/python benchmarks/gates/query_time.py [--repeat 5]

For SGLang 0.5.23, vLLM 0.32.0 (the CPU build) and vLLM 0.33.0: the index built from cold
(`load_index` on an empty cache; the wheel's source already extracted), loaded back from its
disk cache (what a fresh process pays), and one query for the first case of that version in
the corpus' development half (never the held half): `analyze_change` with the case's command,
host and model, plus, where the engine is installed here, the engine's own resolution of
known-good and candidate from its cache (`resolve_local(cached=True)`, warmed once first) and
`combine`. "fresh process":
the index loaded from disk inside the timed query; "warm": the median of `--repeat` more with
the index in memory. Wall and CPU seconds with the load average beside them (2 shared cores).
Writes query-time.json next to this file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flagtrial.gates import analyze as analyze_module
from flagtrial.gates import index as index_module
from flagtrial.gates.analyze import analyze_change
from flagtrial.gates.index import load_index
from flagtrial.gates.wheel import engine_source

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import evaluate  # noqa: E402  (the corpus' own adapters: host, tp, known-good)

VERSIONS = (("sglang", "0.5.23"), ("vllm", "0.32.0"), ("vllm", "0.33.0"))


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, wall s, CPU s of this process and its children)."""
    before, start = os.times(), time.perf_counter()
    result = fn()
    wall, after = time.perf_counter() - start, os.times()
    return result, wall, sum(after[:4]) - sum(before[:4])


def forget_indexes() -> None:
    """As in a fresh process: no index or source reader in memory (the disk cache stays)."""
    index_module._LOADED.clear()
    analyze_module._READERS.clear()


def query(case: dict[str, Any], model: dict[str, Any] | None, folder: Path) -> str:
    """One case judged: static analysis, then the cached resolution where installed here."""
    edit = case["edit"]
    finding = analyze_change(
        case["engine"], case["version"], [(edit["flag"], edit["value"])],
        evaluate.gate_host(case["host"], True), evaluate.tp_of(case["command"]),
        command=case["command"], model=model,
    )[0]  # fmt: skip
    if (case["engine"], case["version"]) in evaluate.RESOLVABLE:
        finding = evaluate.resolve_and_combine(case, finding, folder)
    return evaluate.outcome_label(finding.outcome)


def measure(engine: str, version: str, repeat: int, tmp: Path) -> dict[str, Any]:
    root = engine_source(engine, version)
    load = os.getloadavg()[0]
    os.environ["FLAGTRIAL_CACHE"] = str(tmp / f"cold-{engine}-{version}")  # no index yet
    try:
        forget_indexes()
        built, build_s, build_cpu = timed(lambda: load_index(root, engine, version))
        forget_indexes()
        _, load_s, _ = timed(lambda: load_index(root, engine, version))
    finally:
        del os.environ["FLAGTRIAL_CACHE"]
    case = next(
        c for c in evaluate.load_cases("dev") if (c["engine"], c["version"]) == (engine, version)
    )
    model = evaluate.load_models().get(case["model"])
    folder = tmp / case["model"]
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model))
    forget_indexes()
    outcome = query(case, model, folder)  # warms the resolution cache and the index's
    forget_indexes()
    _, fresh_s, fresh_cpu = timed(lambda: query(case, model, folder))
    warm = [timed(lambda: query(case, model, folder))[1:] for _ in range(repeat)]
    return {
        "engine": f"{engine}=={version}",
        "files_indexed": len(built.files),
        "index_build_s": round(build_s, 2),
        "index_build_cpu_s": round(build_cpu, 2),
        "load_average_before_build": round(load, 2),
        "index_load_from_disk_s": round(load_s, 2),
        "case": case["id"],
        "outcome": outcome,
        "expected": case["expected"],
        "with_resolution": (engine, version) in evaluate.RESOLVABLE,
        "query_fresh_process_s": round(fresh_s, 3),
        "query_fresh_process_cpu_s": round(fresh_cpu, 3),
        "query_warm_median_s": round(statistics.median(w for w, _ in warm), 3),
        "query_warm_max_s": round(max(w for w, _ in warm), 3),
        "query_warm_cpu_median_s": round(statistics.median(c for _, c in warm), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ft-query-time-") as tmp:
        rows = [measure(e, v, args.repeat, Path(tmp)) for e, v in VERSIONS]
    results = {
        "machine": {"cpus": os.cpu_count(), "load_average_at_end": round(os.getloadavg()[0], 2)},
        "targets": {"query_s": 1.0, "index_s": 10.0},
        "versions": rows,
    }
    (HERE / "query-time.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
