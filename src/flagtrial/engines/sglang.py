"""Engine `sglang`: SGLang's HTTP server (`python -m sglang.launch_server`, `sglang serve`).

Capacity is what the scheduler admits, never what the flags say. `concurrent_requests` is
the least of its limits (`Facts.limits`), each with its value and source, the binding one
named: `max_running_requests`, each DP rank's `effective_max_running_requests_per_dp` of
`/server_info` summed (the top-level field is None when unset), else the scheduler's startup
line; `max_total_num_tokens`, the KV cache at the workload's request length (the scheduler
admits a request while its prompt plus max_tokens, reserved whole under `ignore_eos`, fit in
the free KV tokens: srt/managers/schedule_policy.py `add_one_req`); `context_len`, listed
when the workload's requests are longer than the context (the server refuses them:
srt/managers/tokenizer_manager.py `_validate_one_request`). `kv_tokens` is the sum of
`memory_usage.token_capacity` (else `max_total_num_tokens`); context per request is
`/v1/models` `max_model_len` (the model's `context_len`). Every version's endpoints and log
formats are in VERSIONS below, with the file:line they come from.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import httpx

from flagtrial.engines import logfacts, promtext, pyrepr
from flagtrial.engines.base import Phase
from flagtrial.engines.flag_table import EngineSchema
from flagtrial.engines.pyengine import cached_table, engine_schema, version_key
from flagtrial.facts import Facts, Limit, Scalar, binding
from flagtrial.launch.schema import FlagSchema
from flagtrial.load.prompts import build_prompt
from flagtrial.load.workload import Workload
from flagtrial.targets.base import Target

# Start phases, as a real SGLang 0.5.23 start on CPU logs them
# (tests/fixtures/logs/sglang-0.5.23-cpu-start.log). The KV pool is sized and allocated right
# after the weights (the line after `Load weight end` is `KV Cache is allocated`); on a GPU
# CUDA graphs are captured next; once Uvicorn runs, a warm-up request must pass before
# /health answers 200.
START_PHASES: tuple[Phase, ...] = (
    # srt/model_executor/model_runner.py:1274
    Phase("loading weights", re.compile(r"Load weight begin")),
    # model_runner.py:1373, srt/mem_cache/memory_pool.py, kv_pool_runtime.py (post-capture)
    Phase(
        "KV allocation",
        re.compile(r"Load weight end\. elapsed|KV [Cc]ache (?:is )?allocated|KV sizing"),
    ),
    # model_runner_components/cuda_graph_setup.py:685 `Capture %s CUDA graph begin.`; 0.5.10
    # model_runner.py:2446 `Capture cuda graph begin.` (`cpu graph`, `npu graph`)
    Phase("compiling", re.compile(r"Capture .*[Gg]raph begin")),
    Phase("warming up", re.compile(r"Uvicorn running on")),
    # srt/entrypoints/http_server.py:2600
    Phase("ready", re.compile(r"The server is fired up and ready to roll")),
)


@dataclass(frozen=True)
class SglangVersion:
    """What one range of SGLang versions exposes."""

    since: str
    server_args_log: re.Pattern[str]  # the resolved-arguments dump at start
    cause: str  # where the resolver behind each resolved value is recorded


# entrypoints/http_server.py: /server_info (0.5.10: line 601, 0.5.23: line 863), its
# deprecated alias /get_server_info (0.5.10: 591, 0.5.23: 853; older releases had only it).
_INFO = ("/server_info", "/get_server_info")
VERSIONS = (
    SglangVersion(
        since="0.5.23",
        # srt/entrypoints/engine.py:311 `logger.info(f"server_args={...resolved_dict()}")`
        server_args_log=re.compile(r"server_args=(\{.*\})\s*$"),
        cause="declare_resolution sources (srt/arg_groups/*.py)",
    ),
    SglangVersion(
        since="0.0",
        # 0.5.10 srt/entrypoints/engine.py:181 `logger.info(f"{server_args=}")`: a dataclass repr
        server_args_log=re.compile(r"server_args=(ServerArgs\(.*\))\s*$"),
        cause="",
    ),
)


def version_knowledge(version: str | None) -> SglangVersion:
    key = version_key(version or "0")
    return next(v for v in VERSIONS if version_key(v.since) <= key)


# Startup log lines, the same in 0.5.10 and 0.5.23 unless noted.
# srt/managers/scheduler.py:1269 (0.5.10: 691)
SCHEDULER_LINE = re.compile(
    r"max_total_num_tokens=(?P<tokens>\d+), chunked_prefill_size=(?P<chunk>-?\d+), "
    r"max_prefill_tokens=(?P<prefill>\d+), max_running_requests=(?P<running>\d+), "
    r"context_len=(?P<context>\d+)"
)
# srt/mem_cache/memory_pool.py:2088 (0.5.10: 696 has no `dtype:`); and the 0.5.23 resize,
# model_executor/model_runner_components/kv_pool_runtime.py:195, which is the final size.
KV_LINE = re.compile(
    r"(?P<post>Post-capture KV sizing: )?KV [Cc]ache (?:is )?allocated\. "
    r"(?:dtype: (?P<dtype>[\w.]+), )?#tokens: (?P<tokens>\d+)"
)
# kv_pool_runtime.py:171 `Post-capture KV sizing: max_running_requests %d -> %d`
RUNNING_CAPPED = re.compile(r"max_running_requests (\d+) -> (\d+)")
# 0.5.23 model_executor/model_runner_components/cuda_graph_setup.py:788
#   `Capture target decode CUDA graph end. bs=[1, 2, 4], elapsed=...`
# 0.5.10 model_executor/cuda_graph_runner.py:570 `Capture cuda graph bs [1, 2, 4]`
GRAPH_BS = re.compile(
    r"Capture (?:(?P<what>[\w ]*?decode) \S+ graph end\. bs=|cuda graph bs )"
    r"(?P<bs>\[[\d, ]*\])"
)

# The parser `sglang serve` and launch_server build (srt/server_args.py
# `prepare_server_args`, the same in 0.5.10), built on the host by engines/parser_dump.py:
# importing server_args touches no GPU and needs no sgl_kernel.
PARSER = """
import argparse
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
"""

# Volatile or bulky /server_info keys that are not settings (max_total_num_tokens is the
# KV capacity, a capacity fact).
_NOT_SETTINGS = {
    "max_total_num_tokens",
    "internal_states",
    "startup_time",
    "launch_command",
    "version",
    "status",
    "kv_events",
    "frontend",
    "hicache_object_layout",
    "kv_event_sources",
}


# Settings SGLang draws at each start unless their flag is given (0.5.23
# srt/arg_groups/serving_hook.py:660 `random_seed=random.randint(0, 1 << 30)`): not a
# setting of the spec. `launch_command` (/server_info) is what was asked.
_DRAWN_AT_START = {"random_seed": "--random-seed"}


def parse_startup_log(log: str) -> tuple[dict[str, Any], dict[str, Scalar], list[str]]:
    """(numbers from the capacity lines, settings, the lines read) of one start."""
    numbers: dict[str, Any] = {}
    settings: dict[str, Scalar] = {}
    lines: list[str] = []
    for raw in log.splitlines():
        line = raw.strip()
        if m := SCHEDULER_LINE.search(line):
            numbers.update(
                tokens=int(m["tokens"]), running=int(m["running"]), context=int(m["context"])
            )
            settings["max_prefill_tokens"] = int(m["prefill"])
            lines.append(line)
        elif m := KV_LINE.search(line):
            if m["post"] or "kv_pool_tokens" not in numbers:
                numbers["kv_pool_tokens"] = int(m["tokens"])
            if m["dtype"]:
                settings["kv_cache_dtype_resolved"] = m["dtype"]
            lines.append(line)
        elif m := RUNNING_CAPPED.search(line):
            numbers["running"] = int(m[2])
            lines.append(line)
        elif m := GRAPH_BS.search(line):
            key = "cuda_graph_bs_" + (m["what"] or "decode").replace(" ", "_")
            settings[key] = m["bs"]
            lines.append(line)
    return numbers, settings, lines


def server_args_from_log(log: str, version: str | None) -> dict[str, Scalar]:
    pattern = version_knowledge(version).server_args_log
    for line in log.splitlines():
        if m := pattern.search(line):
            return pyrepr.parse_repr(m[1])
    return {}


def flatten(body: dict[str, Any]) -> dict[str, Scalar]:
    """Resolved fields as settings, less the keys that are not settings."""
    return pyrepr.flatten({k: v for k, v in body.items() if k not in _NOT_SETTINGS})


async def _server_info(
    client: httpx.AsyncClient, base_url: str
) -> tuple[str, dict[str, Any]] | None:
    for path in _INFO:
        response = await client.get(f"{base_url}{path}")
        if response.status_code == 404:
            continue
        return path, response.raise_for_status().json()
    return None


async def _metric(client: httpx.AsyncClient, base_url: str, name: str) -> float | None:
    response = await client.get(f"{base_url}/metrics")
    if response.status_code != 200:
        return None
    sample = promtext.first(promtext.parse(response.text), name)
    return sample.value if sample else None


def _context(models: dict[str, Any]) -> int | None:
    cards = models.get("data") or []
    return cards[0].get("max_model_len") if cards else None


def _resolved_by(labels: list[str]) -> str:
    """`resolved by _handle_gpu_memory_settings (srt/arg_groups/memory_hook.py:94, 108)`."""
    lines: dict[str, list[str]] = {}
    for label in labels:
        name, _, where = label.partition(" (")
        path, _, line = where.rstrip(")").rpartition(":")
        lines.setdefault(f"{name} ({path}", []).append(line)
    return "resolved by " + "; ".join(f"{k}:{', '.join(v)})" for k, v in lines.items())


# srt/managers/schedule_policy.py:89: what the scheduler reserves for a request's output at
# most (env SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION).
CLIP_MAX_NEW_TOKENS = 4096
# Without ignore_eos the scheduler counts running requests' outputs at its new-token ratio (an
# expected early EOS, schedule_policy.py `_get_running_request_total_token_offset`).
_EARLY_EOS = "; at least: the workload does not send ignore_eos"
# Prompts of the workload tokenized to size its requests: the longest of these counts.
_SAMPLED_PROMPTS = 8


async def _prompt_tokens(
    client: httpx.AsyncClient, base_url: str, workload: Workload
) -> int | None:
    """Tokens of the workload's longest prompt as the server counts them (`POST /tokenize`,
    srt/entrypoints/http_server.py:1907; chat prompts with the chat template applied), None
    where the server has no such endpoint or does not tokenize them."""
    longest = 0
    for index in range(_SAMPLED_PROMPTS):
        text = build_prompt(index, workload.prompt_words)
        body: dict[str, Any] = (
            {"messages": [{"role": "user", "content": text}], "add_generation_prompt": True}
            if workload.api == "chat"
            else {"prompt": text}
        )
        if workload.model:
            body["model"] = workload.model
        response = await client.post(f"{base_url}/tokenize", json=body)
        if response.status_code != 200:
            return None
        longest = max(longest, int(response.json()["count"]))
    return longest


def _running_limits(path: str, states: list[Any], numbers: dict[str, Any]) -> list[Limit]:
    """The running-requests limit: summed over the DP ranks /server_info lists, else the
    startup log's."""
    running = [
        s["effective_max_running_requests_per_dp"]
        for s in states
        if s.get("effective_max_running_requests_per_dp") is not None
    ]
    if running:
        return [
            Limit(
                name="max_running_requests",
                setting=sum(running),
                admits=sum(running),
                source=f"GET {path} internal_states[].effective_max_running_requests_per_dp"
                f", summed over {len(running)} DP rank(s)",
            )
        ]
    if "running" in numbers:
        return [
            Limit(
                name="max_running_requests",
                setting=numbers["running"],
                admits=numbers["running"],
                source="startup log: max_running_requests",
            )
        ]
    return []


async def _kv_per_rank(
    client: httpx.AsyncClient,
    base_url: str,
    path: str,
    body: dict[str, Any],
    numbers: dict[str, Any],
    sources: dict[str, str],
) -> list[float]:
    """KV tokens per DP rank (each rank admits into its own pool), from the first source that
    has them; the source is written into `sources`."""
    states = body.get("internal_states") or []
    tokens = [(s.get("memory_usage") or {}).get("token_capacity") for s in states]
    if tokens and None not in tokens:
        sources["kv_tokens"] = f"GET {path} internal_states[].memory_usage.token_capacity"
        return [float(t) for t in tokens if t is not None]
    if body.get("max_total_num_tokens") is not None:
        sources["kv_tokens"] = f"GET {path} max_total_num_tokens"
        return [float(body["max_total_num_tokens"])]
    if (metric := await _metric(client, base_url, "sglang:max_total_num_tokens")) is not None:
        sources["kv_tokens"] = "GET /metrics sglang:max_total_num_tokens"
        return [metric]  # served with --enable-metrics
    if "kv_pool_tokens" in numbers or "tokens" in numbers:
        pool = numbers["kv_pool_tokens"] if "kv_pool_tokens" in numbers else numbers["tokens"]
        sources["kv_tokens"] = "startup log: KV Cache ... #tokens"
        return [float(pool)]
    return []


def _settings(
    body: dict[str, Any], startup_log: str, version: str | None, log_settings: dict[str, Scalar]
) -> dict[str, Scalar]:
    """The server's settings: /server_info flattened (else the logged server_args), less what
    SGLang draws at each start unless asked, plus what the startup log adds."""
    settings = flatten(body) if body else server_args_from_log(startup_log, version)
    asked = str(body.get("launch_command") or "").split()
    for key, flag in _DRAWN_AT_START.items():
        if not any(word.split("=")[0] == flag for word in asked):
            settings.pop(key, None)
    settings.update(log_settings)
    if body.get("max_req_input_len") is not None:
        settings["max_req_input_len"] = body["max_req_input_len"]
    return settings


class SglangEngine:
    name = "sglang"
    default_port = 30000
    tp_flags: tuple[str, ...] = ("--tp-size", "--tp", "--tensor-parallel-size")
    source_gates = True

    @staticmethod
    def starts(program_parts: set[str]) -> bool:
        return "sglang" in program_parts

    # KV capacity is sized from free GPU memory at start, which drifts a little between starts.
    capacity_tolerance_pct = 1.0
    start_phases = START_PHASES

    def __init__(self, workload: Workload | None = None) -> None:
        self._schema: EngineSchema | None = None
        # The requests the scheduler will be asked to admit; without it the KV cache's limit
        # is not known (make_engine passes the project's).
        self.workload = workload

    async def is_ready(self, client: httpx.AsyncClient, base_url: str) -> bool:
        # /health: 503 while the server status is Starting, then a 1-token generation
        # (srt/entrypoints/http_server.py:721-735). Starting ends with the warm-up, when the
        # server logs "The server is fired up and ready to roll!" (http_server.py:2600).
        return (await client.get(f"{base_url}/health")).status_code == 200

    async def facts(self, client: httpx.AsyncClient, base_url: str, startup_log: str) -> Facts:
        info = await _server_info(client, base_url)
        models = (await client.get(f"{base_url}/v1/models")).raise_for_status().json()
        numbers, log_settings, lines = parse_startup_log(startup_log)
        path, body = info if info else ("", {})
        version = body.get("version")
        capacity: dict[str, float] = {}
        sources: dict[str, str] = {}
        states = body.get("internal_states") or []
        limits = _running_limits(path, states, numbers)
        per_rank = await _kv_per_rank(client, base_url, path, body, numbers, sources)
        if per_rank:
            capacity["kv_tokens"] = sum(per_rank)
        context = _context(models)
        if context is not None:
            capacity["context_per_request"] = float(context)
            sources["context_per_request"] = "GET /v1/models max_model_len"
        elif "context" in numbers:
            capacity["context_per_request"] = float(numbers["context"])
            sources["context_per_request"] = "startup log: context_len"
        settings = _settings(body, startup_log, version, log_settings)
        if self.workload is not None:
            page = settings.get("page_size")
            limits += await self._length_limits(
                client, base_url, capacity, sources, per_rank, page if isinstance(page, int) else 1
            )
        bound = binding(limits)
        if bound is not None:
            capacity["concurrent_requests"] = bound.admits
            sources["concurrent_requests"] = f"bound by {bound.describe()} ({bound.source})"
        warnings, warning_lines = logfacts.override_warnings(startup_log)
        settings.update(warnings)
        sources.update(self._causes(version, settings))
        return Facts(
            engine=self.name,
            version=version,
            capacity=capacity,
            settings=settings,
            sources=sources,
            log_lines=lines + warning_lines,
            limits=limits,
        )

    async def _length_limits(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        capacity: dict[str, float],
        sources: dict[str, str],
        per_rank: list[float],
        page: int,
    ) -> list[Limit]:
        """The limits that depend on how long the workload's requests are."""
        assert self.workload is not None
        prompt = await _prompt_tokens(client, base_url, self.workload)
        if prompt is None:
            return []
        new = min(self.workload.max_tokens, CLIP_MAX_NEW_TOKENS)
        limits = []
        context = capacity.get("context_per_request")
        if context is not None and prompt + self.workload.max_tokens > context:
            limits.append(
                Limit(
                    name="context_len",
                    setting=context,
                    admits=0,
                    source=f"{sources['context_per_request']}; the workload's requests are "
                    f"{prompt} + {self.workload.max_tokens} tokens: refused",
                )
            )
        if per_rank:
            # add_one_req: the prompt in whole pages, max_new reserved, one page of overhead.
            request = math.ceil(prompt / page) * page + new + page
            limits.append(
                Limit(
                    name="max_total_num_tokens",
                    setting=sum(per_rank),
                    admits=sum(t // request for t in per_rank),
                    source=f"{sources['kv_tokens']}, {request} tokens per request: the "
                    f"workload's longest prompt ({prompt}, POST /tokenize) + max_tokens {new}"
                    f" + page_size {page}{'' if self.workload.ignore_eos else _EARLY_EOS}",
                )
            )
        return limits

    def _causes(self, version: str | None, settings: dict[str, Scalar]) -> dict[str, str]:
        """For resolved settings, the resolvers SGLang records as able to decide them."""
        known = version_knowledge(version)
        table = cached_table(self.name, version) if version and known.cause else None
        resolvers: dict[str, list[str]] = (table or {}).get("resolvers") or {}
        return {key: _resolved_by(resolvers[key]) for key in settings if key in resolvers}

    def crash_reason(self, log: str) -> str | None:
        return logfacts.python_crash_reason(log)

    def settings_for_flag(self, canonical_flag: str) -> set[str]:
        if self._schema is not None:
            return self._schema.settings_for(canonical_flag)
        return {canonical_flag.lstrip("-").replace("-", "_")}

    async def flag_schema(self, target: Target, program: list[str]) -> FlagSchema:
        self._schema = await engine_schema(target, self.name, program, PARSER)
        return self._schema
