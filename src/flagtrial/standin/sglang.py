"""A stand-in for SGLang's server: `python -m flagtrial.standin.sglang [sglang flags]`.

It parses its flags with the flag table of the sglang wheel installed for this interpreter
(0.5.10 and 0.5.23 are what the tests install), resolves the few settings that decide
capacity the way that version does (cited below), sizes its capacity with the declared
hardware (`flagtrial.standin.declared`), prints the startup log in SGLang's formats and
serves SGLang's endpoints. For 0.5.23 the `memory_usage` body is built by the wheel's own
`build_memory_usage`. Bodies and log lines written here cite the code they copy.
"""

from __future__ import annotations

import asyncio
import importlib
import random
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flagtrial.engines.pyengine import version_key
from flagtrial.standin import declared
from flagtrial.standin.engine_args import EngineArgs, env_float, fail, log, stamp
from flagtrial.standin.http import Request, Response, json_response, serve, text_response
from flagtrial.standin.stream import SGLANG, Generator


@dataclass(frozen=True)
class Release:
    """How one range of SGLang versions behaves where the stand-in must differ."""

    since: str
    graph_max_bs_field: str
    # SM120 with all-reduce fusion asked: "raise" (0.5.23 layers/flashinfer_comm_fusion.py:48-50
    # `_resolve_backend`: "FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.")
    # or "no-op" (0.5.10 layers/communicator.py:95 `apply_flashinfer_allreduce_fusion` needs
    # SM90/SM100, so the fusion never runs; the workspace is still set up: the seed's finding).
    fusion_unsupported: str


RELEASES = (
    Release("0.5.23", "cuda_graph_max_bs_decode", "raise"),
    Release("0.0", "cuda_graph_max_bs", "no-op"),
)


def release(version: str) -> Release:
    return next(r for r in RELEASES if version_key(r.since) <= version_key(version))


def engine_function(folder: Path, module: str, name: str) -> Any:
    """A function of the installed sglang, loaded without running its package `__init__`
    files (they import torch): fails if the module itself needs more than what is here."""
    parts = module.split(".")
    for i in range(1, len(parts)):
        package = ".".join(parts[:i])
        if package not in sys.modules:
            bare = types.ModuleType(package)
            bare.__path__ = [str(folder.parent.joinpath(*parts[:i]))]
            sys.modules[package] = bare
    return getattr(importlib.import_module(module), name)


class Server:
    def __init__(self, argv: list[str]) -> None:
        self.args = EngineArgs("sglang", "launch_server.py", argv)
        self.release = release(self.args.version)
        self.gpu = declared.declared_gpu()
        self.model = declared.declared_model(self.args.get("model_path"))
        self.ready = False
        self.started = time.time()
        self.resolved = self._resolve()
        self.generator = Generator(
            SGLANG,
            self.resolved["served_model_name"] or self.model.path,
            self.capacity.running * self.dp,
            env_float("FLAGTRIAL_STANDIN_TOKEN_DELAY_S", 0.01),
        )

    @property
    def tp(self) -> int:
        return int(self.args.get("tp_size") or 1)

    @property
    def dp(self) -> int:
        return int(self.args.get("dp_size") or 1)

    def _resolve(self) -> dict[str, Any]:
        """The resolved fields: every flag's value or default, then the decisions below."""
        args = self.args
        resolved = {field: args.get(field) for field in args.defaults}
        if resolved.get("random_seed", 0) is None:
            # 0.5.23 srt/arg_groups/serving_hook.py:660 (0.5.10 server_args.py:955): a seed
            # drawn at each start when none is given.
            resolved["random_seed"] = random.randint(0, 1 << 30)
        gib = self.gpu.gib
        # 0.5.10 srt/server_args.py:1141-1230 `_handle_gpu_memory_settings` GPU tiers (the
        # 60-160 GiB tier: chunked prefill 8192, graph max bs 256, or 512 from tp 4).
        chunk = args.get("chunked_prefill_size") or (8192 if gib < 160 else 16384)
        graph_key = self.release.graph_max_bs_field
        graph_bs = args.get(graph_key) or (512 if self.tp >= 4 else 256)
        mfs = args.get("mem_fraction_static")
        if mfs is None:
            # 0.5.10 srt/server_args.py:1280-1325: reserved MB for activations and graphs.
            reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + self.tp / 8 * 1024
            reserved = max(reserved, 10 * 1024) if gib > 60 else reserved
            mfs = round((gib * 1024 - reserved) / (gib * 1024), 3)
        resolved.update(
            {"chunked_prefill_size": chunk, graph_key: graph_bs, "mem_fraction_static": mfs}
        )
        fusion = bool(args.get("enable_flashinfer_allreduce_fusion")) or bool(
            args.get("flashinfer_allreduce_fusion_backend")
        )
        if "flashinfer_allreduce_fusion_backend" in resolved and fusion:
            # 0.5.23 srt/arg_groups/serving_hook.py:285-302: the deprecated switch becomes
            # backend "auto" and the switch itself resolves to False.
            resolved["flashinfer_allreduce_fusion_backend"] = (
                args.get("flashinfer_allreduce_fusion_backend") or "auto"
            )
            resolved["enable_flashinfer_allreduce_fusion"] = False
        workspace = 0.0
        if fusion and self.tp > 1:
            if self.gpu.sm not in (90, 100) and self.release.fusion_unsupported == "raise":
                fail("ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.")
            # The workspace for 16384 tokens, the 0.5.10 default of
            # layers/flashinfer_comm_fusion.py:284 `max_token_num`.
            workspace = declared.allreduce_fusion_workspace_gib(
                self.tp, 16384, self.model.hidden_size
            )
        self.graph_gib = graph_bs * 2 / 1024  # 0.5.10 server_args.py:1290: 2 MB per graph bs
        self.capacity = declared.capacity(
            self.gpu,
            self.model,
            tp=self.tp,
            mem_fraction_static=mfs,
            graph_gib=self.graph_gib,
            workspace_gib=workspace,
            mamba_full_memory_ratio=float(args.get("mamba_full_memory_ratio") or 0.9),
            requested_running=args.get("max_running_requests"),
        )
        self.context_len = int(args.get("context_length") or self.model.context_len)
        # srt/managers/tp_worker.py:568-572: min(context_len - 1, kv capacity - 1) - 5
        self.max_req_input_len = min(self.context_len - 1, self.capacity.kv_tokens - 1) - 5
        self.graph_bs = [1, 2, 4, 8, *range(16, graph_bs + 1, 16)]
        return resolved

    # ------------------------------------------------------------------ log

    def _log(self, message: str, rank: bool = False) -> None:
        # srt/utils/common.py:2630 `[%(asctime)s{prefix}] %(message)s`, prefix ` TP0` for
        # scheduler ranks (srt/managers/scheduler.py:6289).
        prefix = " TP0" if rank and self.tp > 1 else ""
        log(f"[{stamp()}{prefix}] {message}")

    def startup_log(self) -> None:
        new = self.release.since != "0.0"
        if new and self.args.asked("enable_flashinfer_allreduce_fusion"):
            # 0.5.23 srt/arg_groups/serving_hook.py:289
            self._log(
                "--enable-flashinfer-allreduce-fusion is deprecated. "
                "Please use --flashinfer-allreduce-fusion-backend=auto instead."
            )
        if new:
            # 0.5.23 srt/entrypoints/engine.py:311 `server_args={resolved_dict()}`
            self._log(f"server_args={self.resolved!r}")
        else:
            # 0.5.10 srt/entrypoints/engine.py:181 `f"{server_args=}"`: a dataclass repr
            fields = ", ".join(f"{k}={v!r}" for k, v in self.resolved.items())
            self._log(f"server_args=ServerArgs({fields})")
        tokens = self.capacity.kv_tokens
        k_gib = tokens * self.model.kv_kib_per_token / self.tp / 2 / (1 << 20)
        dtype = "dtype: torch.bfloat16, " if new else ""
        # srt/mem_cache/memory_pool.py:2088 (0.5.10: 696, without `dtype:`)
        self._log(
            f"KV Cache is allocated. {dtype}#tokens: {tokens}, K size: {k_gib:.2f} GB, "
            f"V size: {k_gib:.2f} GB",
            rank=True,
        )
        if new:
            # 0.5.23 model_executor/model_runner_components/cuda_graph_setup.py:788
            self._log(
                f"Capture target decode CUDA graph end. bs={self.graph_bs}, elapsed=0.50 s, "
                f"mem usage={self.graph_gib:.2f} GB, avail mem={self._avail():.2f} GB.",
                rank=True,
            )
        else:
            # 0.5.10 model_executor/cuda_graph_runner.py:570
            self._log(f"Capture cuda graph bs {self.graph_bs}", rank=True)
        # srt/managers/scheduler.py:1269 (0.5.10: 691)
        self._log(
            f"max_total_num_tokens={tokens}, "
            f"chunked_prefill_size={self.resolved['chunked_prefill_size']}, "
            f"max_prefill_tokens={self.resolved['max_prefill_tokens']}, "
            f"max_running_requests={self.capacity.running}, "
            f"context_len={self.context_len}, available_gpu_mem={self._avail():.2f} GB",
            rank=True,
        )

    def _avail(self) -> float:
        return self.gpu.gib * (1 - float(self.resolved["mem_fraction_static"]))

    # ------------------------------------------------------------------ bodies

    def memory_usage(self) -> dict[str, Any]:
        weight = self.model.weights_gib / self.tp
        kv = self.capacity.kv_tokens * self.model.kv_kib_per_token / self.tp / (1 << 20)
        if self.release.since == "0.0":
            # 0.5.10 srt/managers/scheduler.py:3070-3078
            return {
                "weight": round(weight, 2),
                "kvcache": round(kv, 2),
                "token_capacity": self.capacity.kv_tokens,
                "graph": round(self.graph_gib, 2),
            }
        build = engine_function(
            self.args.folder,
            "sglang.srt.managers.scheduler_components.memory_usage",
            "build_memory_usage",
        )
        usage: dict[str, Any] = build(
            weight_gb=weight,
            kv_cache_gb=kv,
            startup_available_gb=self._avail(),
            token_capacity=self.capacity.kv_tokens,
            token_capacity_swa=None,
            target_graph_memory_usage={"decode": self.graph_gib},
            draft_graph_memory_usage=None,
        )
        return usage

    def server_info(self) -> dict[str, Any]:
        # srt/entrypoints/http_server.py:863-890 (0.5.10: 601-618): resolved fields, the
        # scheduler's init info (srt/managers/scheduler.py:1943-1948), internal_states (one
        # per DP rank, srt/managers/scheduler_components/internal_state.py:45-85), version.
        state = {
            **self.resolved,
            "world_size": self.tp * self.dp,
            "startup_time": self.started,
            "effective_max_running_requests_per_dp": self.capacity.running,
            "last_gen_throughput": 0.0,
            "memory_usage": self.memory_usage(),
        }
        return {
            **self.resolved,
            "launch_command": " ".join(["python3", "-m", "sglang.launch_server", *sys.argv[1:]]),
            "status": "ready",
            "max_total_num_tokens": self.capacity.kv_tokens,
            "max_req_input_len": self.max_req_input_len,
            "startup_time": self.started,
            "internal_states": [state for _ in range(self.dp)],
            "version": self.args.version,
        }

    def models(self) -> dict[str, Any]:
        # srt/entrypoints/http_server.py:1993-2022, ModelCard at openai/protocol.py:87
        name = self.resolved["served_model_name"] or self.model.path
        card = {
            "id": name,
            "object": "model",
            "created": int(self.started),
            "owned_by": "sglang",
            "root": name,
            "parent": None,
            "max_model_len": self.context_len,
        }
        return {"object": "list", "data": [card]}

    def metrics(self) -> str:
        # srt/observability metrics collector names (sglang:num_running_reqs, ...).
        labels = f'{{model_name="{self.generator.model}",engine_type="unified",tp_rank="0"}}'
        used = self.generator.running / max(self.capacity.running, 1)
        rows = {
            "sglang:num_running_reqs": self.generator.running,
            "sglang:num_queue_reqs": self.generator.waiting,
            "sglang:token_usage": round(used, 4),
            "sglang:gen_throughput": 0.0,
            "sglang:max_total_num_tokens": self.capacity.kv_tokens,
        }
        return "".join(
            f"# TYPE {name} gauge\n{name}{labels} {value}\n" for name, value in rows.items()
        )

    def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        # srt/entrypoints/openai/serving_tokenize.py (TokenizeResponse, protocol.py:1796);
        # a token per word, as the stand-in's usage counts them.
        text = body.get("prompt") or " ".join(m["content"] for m in body.get("messages") or [])
        tokens = list(range(len(str(text).split())))
        return {"tokens": tokens, "count": len(tokens), "max_model_len": self.context_len}

    async def handle(self, request: Request) -> Response:
        path = request.path
        if path in ("/health", "/health_generate"):
            return Response(200 if self.ready else 503)
        if path == "/ready":
            return Response(200 if self.ready else 503)
        if not self.ready:
            return Response(503)
        if path in ("/server_info", "/get_server_info"):
            return json_response(self.server_info())
        if path in ("/v1/models",):
            return json_response(self.models())
        if path in ("/model_info", "/get_model_info"):
            return json_response({"model_path": self.model.path, "is_generation": True})
        if path == "/metrics" and self.resolved.get("enable_metrics"):
            return text_response(self.metrics(), content_type="text/plain; version=0.0.4")
        if path in ("/v1/completions", "/v1/chat/completions") and request.method == "POST":
            return await self.generator.handle(request)
        if path in ("/tokenize", "/v1/tokenize") and request.method == "POST":
            return json_response(self.tokenize(request.json()))
        if path == "/flush_cache":
            return Response(200)
        return json_response({"detail": "Not Found"}, 404)


async def run(argv: list[str]) -> None:
    server = Server(argv)
    port = int(server.args.get("port") or 30000)
    http = await serve(port, server.handle)
    server.startup_log()
    await asyncio.sleep(env_float("FLAGTRIAL_STANDIN_START_S", 0.3))
    server.ready = True
    # srt/entrypoints/http_server.py:2600 (0.5.10: 1929)
    server._log("The server is fired up and ready to roll!")
    async with http:
        await http.serve_forever()


def main() -> None:
    asyncio.run(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
