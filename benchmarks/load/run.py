"""The load-client suite in one go: ceiling, accuracy and cost of flagtrial's client and its
peers, each client one process pinned to one core (clients.CLIENT_CORE), the server on the
other.

    .venv/bin/python benchmarks/load/run.py [--quick] [--clients flagtrial,guidellm]

- ceiling: streamed tok/s and req/s against nginx serving pre-rendered streams (ceiling.py),
  16-, 256- and 1024-token streams at concurrency 1, 64 and 512;
- accuracy: against a server with a known schedule (scheduled.py), each client's mean TTFT
  and ITL beside the truth read from a tcpdump capture of loopback, at concurrency 1 and 64;
- cost: client CPU seconds (the kernel's count, less the client's start-up) per 1,000 tokens.

Writes results.json, results.md and ceiling.png next to this file.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ceiling
import clients
import scheduled

from flagtrial.demo import free_port

HERE = Path(__file__).parent
SERVER_CORE = "0"
LENGTHS, LEVELS = (16, 256, 1024), (1, 64, 512)
SCHEDULE_MS = (50.0, 10.0)  # first token after 50 ms, then one every 10 ms
ACCURACY_TOKENS, ACCURACY_LEVELS = 64, (1, 64)


def measure(name: str, cell: clients.Cell, startup_cpu: dict[str, float]) -> dict[str, Any]:
    row: dict[str, Any] = {"client": name, **dataclasses.asdict(cell)}
    try:
        got = clients.CLIENTS[name](cell)
    except (clients.Unavailable, subprocess.TimeoutExpired) as e:
        return {**row, "unavailable": str(e)[-300:]}
    tokens = got.tok_s / got.req_s * cell.requests if got.req_s else 0.0
    cost = max(0.0, got.cpu_s - startup_cpu.get(name, 0.0))
    return {
        **row,
        **dataclasses.asdict(got),
        "cpu_per_1k_tokens_s": cost / tokens * 1000 if tokens else None,
    }


def startup_costs(names: list[str], url: str) -> dict[str, float]:
    """Each client's CPU for one 16-token request: its start-up, taken off every cell."""
    found = {}
    for name in names:
        with contextlib.suppress(clients.Unavailable):
            found[name] = clients.CLIENTS[name](clients.Cell(url, 16, 1, 1)).cpu_s
    return found


def run_ceiling(names: list[str], quick: bool) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="ft-ceiling-"))
    server, port = ceiling.start_nginx(root, list(LENGTHS))
    rows = []
    try:
        startup = startup_costs(names, f"http://127.0.0.1:{port}/s16")
        for tokens in LENGTHS:
            for c in LEVELS:
                # Some 200k tokens a cell, at least 4 requests a connection.
                n = max(4 * c, 200_000 // tokens) // (4 if quick else 1)
                for name in names:
                    row = measure(
                        name,
                        clients.Cell(f"http://127.0.0.1:{port}/s{tokens}", tokens, c, n),
                        startup,
                    )
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    finally:
        server.terminate()
        server.wait()
    return rows


def run_accuracy(names: list[str], quick: bool) -> list[dict[str, Any]]:
    rows = []
    for c in ACCURACY_LEVELS:
        for name in names:
            port = free_port()
            schedule = [str(v) for v in SCHEDULE_MS]
            server = subprocess.Popen(
                ["taskset", "-c", SERVER_CORE, sys.executable, str(HERE / "scheduled.py"),
                 str(port), *schedule]
            )  # fmt: skip
            pcap = Path(tempfile.mkdtemp(prefix="ft-wire-")) / "wire.pcap"
            capture = ["-i", "lo", "-w", str(pcap), "-s", "256", "-B", "65536"]
            dump = subprocess.Popen(
                ["tcpdump", *capture, "tcp", "port", str(port)], stderr=subprocess.DEVNULL
            )
            time.sleep(1.5)  # both listening
            n = (8 if c == 1 else 2 * c) if quick else (32 if c == 1 else 8 * c)
            row = measure(name, clients.Cell(f"http://127.0.0.1:{port}", ACCURACY_TOKENS, c, n), {})
            time.sleep(0.5)
            dump.send_signal(signal.SIGINT)
            dump.wait()
            server.terminate()
            server.wait()
            truth = scheduled.wire_truth(pcap, port)
            mean = lambda xs: 1000 * sum(xs) / len(xs) if xs else None  # noqa: E731
            row.update(wire_ttft_ms=mean(truth.ttft_s), wire_itl_ms=mean(truth.itl_s),
                       wire_requests=len(truth.ttft_s))  # fmt: skip
            for metric in ("ttft", "itl"):
                got, wire = row.get(f"{metric}_ms"), row[f"wire_{metric}_ms"]
                row[f"{metric}_error_pct"] = 100 * (got - wire) / wire if got and wire else None
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    lines = ["| " + " | ".join(h for h, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = []
        for _, key, fmt in columns:
            value = r.get(key)
            cells.append(format(value, fmt) if isinstance(value, (int, float)) else (value or "-"))
        if "unavailable" in r:
            cells[-1] = "unavailable: " + r["unavailable"][:80].replace("|", "/").replace("\n", " ")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(LENGTHS), figsize=(13, 4), sharey=False)
    for ax, tokens in zip(axes, LENGTHS, strict=True):
        for name in sorted({r["client"] for r in rows}):
            mine = [r for r in rows if r["client"] == name and r["tokens"] == tokens]
            points = [(r["concurrency"], r["tok_s"]) for r in mine if "tok_s" in r]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=name)
        ax.set(xscale="log", title=f"{tokens}-token streams", xlabel="concurrency", ylabel="tok/s")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "ceiling.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests")
    parser.add_argument("--clients", default=",".join(clients.CLIENTS))
    parser.add_argument("--skip", default="", help="ceiling,accuracy")
    parser.add_argument("--report", action="store_true", help="rewrite results.md and the plot")
    args = parser.parse_args()
    if args.report:
        report(json.loads((HERE / "results.json").read_text()))
        return
    names = args.clients.split(",")
    ceiling_rows = [] if "ceiling" in args.skip else run_ceiling(names, args.quick)
    accuracy_rows = [] if "accuracy" in args.skip else run_accuracy(names, args.quick)
    meta = {"cpus": os.cpu_count(), "quick": args.quick, "schedule_ms": SCHEDULE_MS,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    out = {"meta": meta, "ceiling": ceiling_rows, "accuracy": accuracy_rows}
    (HERE / "results.json").write_text(json.dumps(out, indent=1) + "\n")
    report(out)


def report(out: dict[str, Any]) -> None:
    meta, ceiling_rows, accuracy_rows = out["meta"], out["ceiling"], out["accuracy"]
    ceiling_columns = [
        ("stream", "tokens", "d"), ("c", "concurrency", "d"), ("client", "client", "s"),
        ("tok/s", "tok_s", ",.0f"), ("req/s", "req_s", ",.0f"),
        ("CPU s / 1k tokens", "cpu_per_1k_tokens_s", ".4f"), ("errors", "errors", "d"),
    ]  # fmt: skip
    accuracy_columns = [
        ("c", "concurrency", "d"), ("client", "client", "s"),
        ("TTFT ms", "ttft_ms", ".2f"), ("wire TTFT ms", "wire_ttft_ms", ".2f"),
        ("TTFT error %", "ttft_error_pct", "+.2f"), ("ITL ms", "itl_ms", ".3f"),
        ("wire ITL ms", "wire_itl_ms", ".3f"), ("ITL error %", "itl_error_pct", "+.2f"),
        ("errors", "errors", "d"),
    ]  # fmt: skip
    first, every = SCHEDULE_MS
    md = [
        f"Measured {meta['when']} ({'quick' if meta['quick'] else 'full'}), client on core "
        f"{clients.CLIENT_CORE}, server on core {SERVER_CORE}.",
        "",
        "## Ceiling (nginx, pre-rendered streams)",
        "",
        table(ceiling_rows, ceiling_columns),
        "",
        f"## Accuracy (first token after {first:g} ms, then every {every:g} ms; truth from a "
        "loopback capture)",
        "",
        table(accuracy_rows, accuracy_columns),
    ]
    (HERE / "results.md").write_text("\n".join(md) + "\n")
    if ceiling_rows:
        plot(ceiling_rows)
    print("\n".join(md))


if __name__ == "__main__":
    main()
