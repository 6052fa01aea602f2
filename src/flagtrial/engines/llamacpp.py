"""Engine `llamacpp`: llama.cpp's llama-server.

Facts: `/props` (total_slots, per-slot n_ctx, build_info), `/v1/models` (meta.n_ctx_train)
and the startup log line
`load_model: initializing, n_slots = 8, n_ctx_slot = 1024, kv_unified = 'false'`.
Capacity: concurrent requests are bound by the slots, by the context of one slot (a request
longer than n_ctx_slot is never served), and with a unified KV cache by its cells, which
every request in flight draws from (`Facts.limits`); the binding one is named.
"""

from __future__ import annotations

import re
from pathlib import PurePath

import httpx

from flagtrial.engines.base import Phase
from flagtrial.engines.schema_cache import help_schema
from flagtrial.errors import ChangeError
from flagtrial.facts import Facts, Limit, Scalar, bind
from flagtrial.launch.schema import FlagSchema
from flagtrial.targets.base import Target

# Start phases (tests/fixtures/logs/llamacpp-*.log). At the default verbosity llama-server
# logs only `load_model: loading model` and `listening on http://...`; `-lv 4` adds the memory
# fit, `load_tensors`, `llama_kv_cache` and the warm-up; older builds log `KV self size` and
# `server is listening on`.
START_PHASES: tuple[Phase, ...] = (
    Phase("loading weights", re.compile(r"load_model: loading model|load_tensors: ")),
    Phase("profiling", re.compile(r"fitting params to device memory")),
    Phase("KV allocation", re.compile(r"llama_kv_cache|(?i:kv self size)")),
    Phase("warming up", re.compile(r"warming up the model")),
    Phase("ready", re.compile(r"listening on http")),
)
SLOTS_LINE = re.compile(
    r"n_slots = (?P<n_slots>\d+), n_ctx_slot = (?P<n_ctx_slot>\d+), "
    r"kv_unified = '(?P<kv_unified>\w+)'"
)
AUTO_LINE = re.compile(
    r"n_parallel is set to auto, using n_parallel = (\d+) and kv_unified = (\w+)"
)
THREADS_LINE = re.compile(r"threadpool init, n_threads = (\d+)")
# The line that says why llama-server stopped, most telling first: an argument error
# (common/arg.cpp prints `error while handling argument "-np": stoi` or
# `error: invalid argument: --bogus`, then the usage), a GGML_ABORT (`file.cpp:2526:
# GGML_ASSERT(n_outputs >= 1) failed`), then the first line logged at level "E"
# (`0.00.003.244 E srv  start: couldn't bind ...`).
CRASH_LINES = (
    re.compile(r"^error while handling (argument|environment variable) |^error: "),
    re.compile(r"^\S+\.(?:c|cpp|h):\d+: "),
    re.compile(r"^\s*[\d.]+ E "),
)

# Which resolved settings a flag sets directly; anything else that changes is implicit.
FLAG_SETTINGS: dict[str, set[str]] = {
    "--parallel": {"n_slots"},
    "--ctx-size": {"n_ctx_slot"},
    "--kv-unified": {"kv_unified"},
    "--threads": {"n_threads"},
    "--model": {"model_path", "model_ftype", "n_ctx_train"},
    "--alias": {"model_alias"},
}


def _bool(text: str) -> bool:
    return text.lower() in ("true", "1")


def parse_startup_log(log: str) -> tuple[dict[str, Scalar], list[str]]:
    settings: dict[str, Scalar] = {}
    lines: list[str] = []
    for line in log.splitlines():
        if m := SLOTS_LINE.search(line):
            settings.update(
                n_slots=int(m["n_slots"]),
                n_ctx_slot=int(m["n_ctx_slot"]),
                kv_unified=_bool(m["kv_unified"]),
            )
            lines.append(line.strip())
        elif m := AUTO_LINE.search(line):
            settings["n_parallel_auto"] = True
            lines.append(line.strip())
        elif m := THREADS_LINE.search(line):
            settings["n_threads"] = int(m[1])
    return settings, lines


def _slot_limits(slots: float, n_ctx: float, sources: dict[str, str]) -> list[Limit]:
    """The slots, and the context of one slot: a slot serves a request of at most n_ctx_slot
    tokens; a longer one fails ("the request exceeds the available context size", or
    "Context size has been exceeded" once its output reaches it), whatever the other slots do."""
    return [
        Limit(
            name="total_slots",
            setting=slots,
            admits=slots,
            source=sources["concurrent_requests"],
        ),
        Limit(
            name="n_ctx_slot",
            setting=n_ctx,
            admits=slots,
            source=sources["context_per_request"],
            per="context",
            slots=slots,
        ),
    ]


def _kv_cells(
    settings: dict[str, Scalar], capacity: dict[str, float], sources: dict[str, str]
) -> list[Limit]:
    """The KV cells the startup log states, into `capacity`; a unified cache's limit."""
    cells, slots_read = settings.get("n_ctx_slot"), settings.get("n_slots")
    if not (isinstance(cells, int | float) and isinstance(slots_read, int | float)):
        return []
    # A unified KV cache is one pool of n_ctx_slot cells shared by every slot; otherwise
    # each slot owns its own n_ctx_slot cells.
    shared = settings["kv_unified"]
    capacity["kv_tokens"] = float(cells) * (1 if shared else slots_read)
    sources["kv_tokens"] = "startup log: n_slots, n_ctx_slot, kv_unified"
    if not shared:
        return []
    # Every slot is started whatever the pool holds; once it is full, the requests in flight
    # fail ("Context size has been exceeded"): the pool decides how many run at once and
    # complete.
    return [
        Limit(
            name="kv_unified_cells",
            setting=capacity["kv_tokens"],
            admits=1.0,
            source="startup log: kv_unified = 'true', n_ctx_slot cells shared",
            per="pool",
        )
    ]


class LlamaCppEngine:
    name = "llamacpp"
    default_port = 8080
    tp_flags: tuple[str, ...] = ()
    source_gates = False

    @staticmethod
    def starts(program_parts: set[str]) -> bool:
        return any(p.startswith("llama-server") for p in program_parts)

    # llama.cpp sizes its KV cache from the flags alone: a restore must match exactly.
    capacity_tolerance_pct = 0.0
    start_phases = START_PHASES

    async def is_ready(self, client: httpx.AsyncClient, base_url: str) -> bool:
        # /health is 503 while the model loads, 200 {"status":"ok"} once slots serve.
        return (await client.get(f"{base_url}/health")).status_code == 200

    async def facts(self, client: httpx.AsyncClient, base_url: str, startup_log: str) -> Facts:
        props = (await client.get(f"{base_url}/props")).raise_for_status().json()
        models = (await client.get(f"{base_url}/v1/models")).raise_for_status().json()
        meta = (models.get("data") or [{}])[0].get("meta", {})
        settings, lines = parse_startup_log(startup_log)
        settings.update(
            n_ctx_train=meta.get("n_ctx_train"),
            model_path=props.get("model_path"),
            model_alias=props.get("model_alias"),
            model_ftype=props.get("model_ftype"),
        )
        slots = float(props["total_slots"])
        n_ctx = float(props["default_generation_settings"]["n_ctx"])
        capacity = {"concurrent_requests": slots, "context_per_request": n_ctx}
        sources = {
            "concurrent_requests": "GET /props total_slots",
            "context_per_request": "GET /props default_generation_settings.n_ctx",
        }
        limits = _slot_limits(slots, n_ctx, sources)
        limits += _kv_cells(settings, capacity, sources)
        bind(capacity, sources, limits)
        return Facts(
            engine=self.name,
            version=props.get("build_info"),
            capacity=capacity,
            settings=settings,
            sources=sources,
            log_lines=lines,
            limits=limits,
        )

    def startup_logged(self, log: str) -> bool:
        # the slots line, or for builds that never print it, the last line of a start
        ready = START_PHASES[-1].marker
        return SLOTS_LINE.search(log) is not None or ready.search(log) is not None

    def crash_reason(self, log: str) -> str | None:
        lines = log.splitlines()
        for pattern in CRASH_LINES:
            for line in lines:
                if pattern.search(line):
                    # An abort names a build path: keep the file name and the message.
                    return re.sub(r"^\S*/", "", line.strip())
        return None

    async def check_values(self, target: Target, program: list[str], args: list[str]) -> None:
        """Put the edited values through llama-server's own parser: `PROGRAM ARGS --help` parses
        every argument (each handler runs, `-np 0` throws), then prints usage and exits 0
        without loading anything. Only value flags of a known kind (numbers, toggles,
        choices) go in: their handlers touch no files, unlike `--log-file`."""
        if not args:
            return
        rc, out = await target.run([*program, *args, "--help"])
        if rc != 0:
            reason = self.crash_reason(out) or f"exit {rc}"
            raise ChangeError(f"{PurePath(program[-1]).name} rejects {' '.join(args)}: {reason}")

    def settings_for_flag(self, canonical_flag: str) -> set[str]:
        return FLAG_SETTINGS.get(canonical_flag, set())

    async def flag_schema(self, target: Target, program: list[str]) -> FlagSchema:
        return await help_schema(target, self.name, program)
