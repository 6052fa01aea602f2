"""The embedded default: replay the seed story on a local llama-server.

A known-good server (8 slots of 1024 tokens) is "optimized" with two flags that look like
optimizations: `--cont-batching` (already llama.cpp's default: a no-op, like the seed's
all-reduce fusion on SM120) and `--parallel -1` ("let llama.cpp size the slots itself"),
which the server resolves to 4 slots and a unified KV cache: half the serving capacity,
found from the server's own /props, not from reading the flags.

`--engine vllm`: the same story on a real vLLM server (the CPU build scripts/install-vllm.sh
installs, a tiny generated Llama). The known-good admits 8 sequences; the candidate adds
`--gpu-memory-utilization 0.95` ("more memory for the KV cache": on the CPU backend the KV
cache is sized from VLLM_CPU_KVCACHE_SPACE when that is set, so a no-op) and lowers
`--max-num-seqs` to 4 ("smaller batches, lower latency"). At the 4 requests in flight the
workload sends there is nothing to gain, and the scheduler now admits half as many
requests: the capacity the server states at start (its non-default args and KV cache line).
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import flagtrial
from flagtrial.cache import cache_root, llama_server_path, vllm_python
from flagtrial.launch.change import Change, Edit
from flagtrial.launch.execwords import literal_word, quote_word
from flagtrial.modelgen import generate_model

DEMO_CHANGE = Change(
    edits=[
        Edit(op="add", name="--cont-batching", value=None),
        Edit(op="set", name="--parallel", value="-1"),
    ]
)


VLLM_DEMO_CHANGE = Change(
    edits=[
        Edit(op="add", name="--gpu-memory-utilization", value="0.95"),
        Edit(op="set", name="--max-num-seqs", value="4"),
    ]
)
# No hub; a 1 GiB KV cache (the CPU build sizes it from this, not from free memory).
VLLM_DEMO_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
VLLM_MODULE = "vllm.entrypoints.openai.api_server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_unit(path: Path, server: Path, model: Path, port: int) -> None:
    # -t 1: with threads = cores, one foreign busy core slows llama-server up to 16x.
    path.write_text(
        "# llama-server as it runs in production (flagtrial demo)\n"
        "[Unit]\n"
        "Description=llama.cpp server (flagtrial demo)\n"
        "\n"
        "[Service]\n"
        "Environment=LLAMA_LOG_COLORS=off\n"
        f"ExecStart={quote_word(literal_word(str(server)))} \\\n"
        f"    --model {quote_word(literal_word(str(model)))} \\\n"
        f"    --host 127.0.0.1 --port {port} \\\n"
        "    --threads 1 \\\n"
        "    --ctx-size 8192 \\\n"
        "    --parallel 8\n"
        "Restart=on-failure\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def write_project(path: Path, unit: str, port: int) -> None:
    path.write_text(
        "# flagtrial demo project\n"
        'target = "process"\n'
        f'unit = "{unit}"\n'
        'engine = "llamacpp"\n'
        f'endpoint = "http://127.0.0.1:{port}"\n'
        "ready_timeout_s = 60\n"
        "\n"
        "[workload]\n"
        "concurrency = [4, 8]\n"
        "prompt_words = 48\n"
        "max_tokens = 32\n"
        "requests_per_run = 8\n"
        "warmup_requests = 2\n"
        "run_timeout_s = 60\n"
        "\n"
        "[policy]\n"
        "capacity_loss_max_pct = 5.0\n"
    )


def prepare(workdir: Path, port: int) -> Path:
    """Model, unit and project file in `workdir`; returns the project file."""
    # The unit names the model by absolute path: the server runs from the unit's folder.
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    model = generate_model(workdir / "demo-small.gguf", size="small", seed=1)
    write_unit(workdir / "llama-demo.service", llama_server_path(), model, port)
    project = workdir / "flagtrial.toml"
    write_project(project, "llama-demo.service", port)
    return project


def vllm_model(python: Path) -> Path:
    """The tiny HF-format Llama, generated once into the cache by the vLLM venv's own
    interpreter (flagtrial does not depend on torch; vLLM's compile cache is keyed by it)."""
    out = cache_root() / "models" / "tiny-llama-hf"
    src = Path(flagtrial.__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"}
    subprocess.run(
        [str(python), "-m", "flagtrial.hfmodelgen", str(out)],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def write_vllm_unit(path: Path, python: Path, model: Path, port: int) -> None:
    program = " ".join(quote_word(literal_word(w)) for w in (str(python), "-m", VLLM_MODULE))
    path.write_text(
        "# vLLM as it runs in production (flagtrial demo)\n"
        "[Unit]\n"
        "Description=vLLM server (flagtrial demo)\n"
        "\n"
        "[Service]\n"
        + "".join(f"Environment={k}={v}\n" for k, v in VLLM_DEMO_ENV.items())
        + f"ExecStart={program} \\\n"
        f"    --model {quote_word(literal_word(str(model)))} \\\n"
        f"    --host 127.0.0.1 --port {port} \\\n"
        "    --max-model-len 512 --dtype float32 \\\n"
        "    --max-num-seqs 8\n"
        "Restart=on-failure\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def write_vllm_project(path: Path, unit: str, port: int) -> None:
    # 4 requests in flight: what the candidate still admits, so it has nothing to gain.
    # Runs of about a second against 30 s restarts: more runs narrow the interval cheaply.
    path.write_text(
        "# flagtrial demo project\n"
        'target = "process"\n'
        f'unit = "{unit}"\n'
        'engine = "vllm"\n'
        f'endpoint = "http://127.0.0.1:{port}"\n'
        "ready_timeout_s = 300\n"
        "\n"
        "[workload]\n"
        "concurrency = [4]\n"
        "prompt_words = 16\n"
        "max_tokens = 64\n"
        "requests_per_run = 32\n"
        "warmup_requests = 4\n"
        "run_timeout_s = 60\n"
        "\n"
        "[policy]\n"
        "capacity_loss_max_pct = 5.0\n"
        "runs = 5\n"
        "recheck_runs = 5\n"
        # The server's three processes and the load generator fill both cores of a small
        # machine, where any other process counts as disturbance: shown, but counted.
        "set_aside_disturbed = false\n"
    )


def prepare_vllm(workdir: Path, port: int) -> Path:
    """Model (in the cache), unit and project file in `workdir`; returns the project file."""
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    python = vllm_python()
    write_vllm_unit(workdir / "vllm-demo.service", python, vllm_model(python), port)
    project = workdir / "flagtrial.toml"
    write_vllm_project(project, "vllm-demo.service", port)
    return project
