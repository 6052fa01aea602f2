"""A stand-in for vLLM's OpenAI server: `python -m flagtrial.standin.vllm [MODEL] [vllm flags]`.

Flags are parsed with the flag table of the vllm wheel installed for this interpreter. The KV
cache is sized the way vLLM 0.33 sizes it, in outline (v1/worker/gpu_worker.py: requested
memory = GiB x gpu_memory_utilization, minus weights, the activation peak and the CUDA-graph
estimate); the activation and graph terms are the stand-in's constants. `--enforce-eager`
gives up CUDA graphs: their memory goes to the KV cache, every token takes 1.6x longer (the
stand-in's figure for eager decode), and vLLM's own warning is printed. `/server_info` answers
only with `VLLM_SERVER_DEV_MODE=1`, as in vLLM.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from flagtrial.sourceread.vllm_config import config_defaults
from flagtrial.standin import declared
from flagtrial.standin.engine_args import EngineArgs, env_float, log
from flagtrial.standin.http import Request, Response, json_response, serve, text_response
from flagtrial.standin.stream import VLLM, Generator

ACTIVATION_GIB = 2.0  # profiled activation peak at 8192 batched tokens (stand-in constant)
GRAPH_GIB = 0.5  # CUDA-graph estimate (stand-in constant)
EAGER_SLOWDOWN = 1.6


class Server:
    def __init__(self, argv: list[str]) -> None:
        self.args = EngineArgs("vllm", "vllm serve", argv, underscores=True)
        args = self.args
        self.gpu = declared.declared_gpu()
        self.model = declared.declared_model(args.get("model_tag") or args.get("model"))
        self.tp = int(args.get("tensor_parallel_size") or 1)
        self.eager = bool(args.get("enforce_eager"))
        self.max_model_len = int(args.get("max_model_len") or self.model.context_len)
        # engine/arg_utils.py:2983-3006 get_batch_defaults, API-server values: 70+ GiB GPUs
        # get 8192 batched tokens and 1024 sequences.
        big = self.gpu.gib >= 70
        self.max_num_seqs = int(args.get("max_num_seqs") or (1024 if big else 256))
        self.batched = int(args.get("max_num_batched_tokens") or (8192 if big else 2048))
        self.block_size = int(args.get("block_size") or 16)
        utilization = float(args.get("gpu_memory_utilization") or 0.92)
        available = (
            self.gpu.gib * utilization
            - self.model.weights_gib / self.tp
            - ACTIVATION_GIB * self.batched / 8192
            - (0.0 if self.eager else GRAPH_GIB)
        )
        self.available_gib = max(available, 0.0)
        per_token = self.model.kv_kib_per_token / self.tp * 1024
        blocks = int(self.available_gib * declared.GIB / per_token) // self.block_size
        self.kv_tokens = blocks * self.block_size
        self.concurrency = self.kv_tokens / self.max_model_len
        self.cache_config = {
            **config_defaults(args.folder, "vllm.config.cache", "CacheConfig"),
            "block_size": self.block_size,
            "gpu_memory_utilization": utilization,
            "num_gpu_blocks": blocks,
            "kv_cache_size_tokens": self.kv_tokens,
            "kv_cache_max_concurrency": self.concurrency,
            "enable_prefix_caching": args.get("enable_prefix_caching") is not False,
        }
        self.ready = False
        self.started = time.time()
        delay = env_float("FLAGTRIAL_STANDIN_TOKEN_DELAY_S", 0.01)
        self.generator = Generator(
            VLLM,
            self.served_name,
            min(self.max_num_seqs, self.kv_tokens // 64 or 1),
            delay * (EAGER_SLOWDOWN if self.eager else 1.0),
        )

    @property
    def served_name(self) -> str:
        names = self.args.get("served_model_name")
        return names[0] if names else self.model.path

    def _log(self, process: str, level: str, where: str, message: str) -> None:
        # vllm/logger.py:28-33 `(%(vllm_process_name)s pid=%(process)d) %(levelname)s
        # %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s`, dates `%m-%d %H:%M:%S`.
        log(
            f"({process} pid={os.getpid()}) {level} {time.strftime('%m-%d %H:%M:%S')} "
            f"[{where}] {message}"
        )

    def startup_log(self) -> None:
        given = {k: v for k, v in self.args.given.items() if v is not None}
        self._log("APIServer", "INFO", "startup.py:96", f"non-default args: {given!r}")
        self._log("APIServer", "INFO", "model.py:2170", f"Using max model len {self.max_model_len}")
        self._log(
            "APIServer",
            "INFO",
            "scheduler.py:311",
            f"Chunked prefill is enabled with max_num_batched_tokens={self.batched}.",
        )
        if self.eager:
            self._log(
                "APIServer",
                "WARNING",
                "vllm.py:1779",
                "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. "
                "This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and "
                "--kernel_config.enable_jit_warmup=False",
            )
        # v1/engine/core.py:139, the config as VllmConfig.__str__ (config/vllm.py:2809) shows it
        config = (
            f"model={self.model.path!r}, speculative_config=None, tokenizer={self.model.path!r}, "
            f"skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
            f"tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, "
            f"max_seq_len={self.max_model_len}, download_dir=None, load_format=auto, "
            f"tensor_parallel_size={self.tp}, pipeline_parallel_size=1, data_parallel_size=1, "
            f"disable_custom_all_reduce=False, quantization=None, "
            f"enforce_eager={self.eager}, kv_cache_dtype={self.args.get('cache_dtype')}, "
            f"device_config=cuda, seed=0, served_model_name={self.served_name}, "
            f"enable_prefix_caching={self.cache_config['enable_prefix_caching']}, "
            f"enable_chunked_prefill=True"
        )
        version = self.args.version
        self._log(
            "EngineCore_DP0",
            "INFO",
            "core.py:139",
            f"Initializing a V1 LLM engine (v{version}) with config: {config}",
        )
        self._log(
            "EngineCore_DP0",
            "INFO",
            "gpu_worker.py:773",
            f"Available KV cache memory: {self.available_gib:.2f} GiB",
        )
        # v1/core/kv_cache_utils.py:1147-1154
        self._log(
            "EngineCore_DP0",
            "INFO",
            "kv_cache_utils.py:1148",
            f"GPU KV cache size: {self.kv_tokens:,} tokens, Maximum concurrency for "
            f"{self.max_model_len:,} tokens per request: {self.concurrency:.2f}x",
        )

    def metrics(self) -> str:
        # CacheConfig.metrics_info() (config/cache.py:440): every field as a string label,
        # plus `engine` (v1/metrics/loggers.py:1110-1135).
        labels = ",".join(f'{k}="{v}"' for k, v in {**self.cache_config, "engine": "0"}.items())
        g = self.generator
        return (
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f"vllm:cache_config_info{{{labels}}} 1.0\n"
            f'vllm:num_requests_running{{engine="0",model_name="{g.model}"}} {g.running}.0\n'
            f'vllm:num_requests_waiting{{engine="0",model_name="{g.model}"}} {g.waiting}.0\n'
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="{g.model}"}} 0.0\n'
            f'vllm:num_preemptions_total{{engine="0",model_name="{g.model}"}} 0.0\n'
        )

    def server_info(self) -> dict[str, Any]:
        # entrypoints/serve/dev/server_info/api_router.py:43-58: the VllmConfig dumped as JSON.
        return {
            "vllm_config": {
                "model_config": {
                    "model": self.model.path,
                    "max_model_len": self.max_model_len,
                    "enforce_eager": self.eager,
                    "served_model_name": self.served_name,
                },
                "cache_config": self.cache_config,
                "parallel_config": {"tensor_parallel_size": self.tp},
                "scheduler_config": {
                    "max_num_seqs": self.max_num_seqs,
                    "max_num_batched_tokens": self.batched,
                },
                "compilation_config": {"cudagraph_mode": "NONE" if self.eager else "FULL"},
            },
            "vllm_env": {"VLLM_SERVER_DEV_MODE": "1"},
            "system_env": {},
        }

    def models(self) -> dict[str, Any]:
        # entrypoints/serve/engine/protocol.py:105-117 ModelCard / ModelList
        card = {
            "id": self.served_name,
            "object": "model",
            "created": int(self.started),
            "owned_by": "vllm",
            "root": self.model.path,
            "parent": None,
            "max_model_len": self.max_model_len,
            "permission": [],
        }
        return {"object": "list", "data": [card]}

    async def handle(self, request: Request) -> Response:
        path = request.path
        if not self.ready:
            return Response(503)  # the API server listens only once the engine is up
        if path == "/health":
            return Response(200)
        if path == "/version":
            return json_response({"version": self.args.version})
        if path == "/v1/models":
            return json_response(self.models())
        if path == "/metrics":
            return text_response(self.metrics(), content_type="text/plain; version=0.0.4")
        if path == "/server_info" and os.environ.get("VLLM_SERVER_DEV_MODE") == "1":
            return json_response(self.server_info())
        if path in ("/v1/completions", "/v1/chat/completions") and request.method == "POST":
            return await self.generator.handle(request)
        return json_response({"detail": "Not Found"}, 404)


async def run(argv: list[str]) -> None:
    server = Server(argv)
    http = await serve(int(server.args.get("port") or 8000), server.handle)
    server.startup_log()
    await asyncio.sleep(env_float("FLAGTRIAL_STANDIN_START_S", 0.3))
    server.ready = True
    server._log("APIServer", "INFO", "entry.py:139", "Starting vLLM server on http://127.0.0.1")
    async with http:
        await http.serve_forever()


def main() -> None:
    asyncio.run(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
