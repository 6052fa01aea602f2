"""The embedded default: replay the seed story on a local llama-server.

A known-good server (8 slots of 1024 tokens) is "optimized" with two flags that look like
optimizations: `--cont-batching` (already llama.cpp's default: a no-op, like the seed's
all-reduce fusion on SM120) and `--parallel -1` ("let llama.cpp size the slots itself"),
which the server resolves to 4 slots and a unified KV cache: half the serving capacity,
found from the server's own /props, not from reading the flags.
"""

from __future__ import annotations

import socket
from pathlib import Path

from flagtrial.cache import llama_server_path
from flagtrial.launch.change import Change, Edit
from flagtrial.launch.execwords import literal_word, quote_word
from flagtrial.modelgen import generate_model

DEMO_CHANGE = Change(
    edits=[
        Edit(op="add", name="--cont-batching", value=None),
        Edit(op="set", name="--parallel", value="-1"),
    ]
)


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
