"""The engine's own argument resolution for commands on one engine, run in its python.

flagtrial runs this file on the engine's host with the engine's interpreter
(`python -c SOURCE REQUEST`), like parser_dump.py: only the standard library is imported
here, the engine by the resolver below. REQUEST is JSON: {"engine", "commands" (each a list of
the flags, as the server gets them), "env" (the unit's environment, shared by the commands),
"facts" (null: the host's own GPUs, as the engine queries them; else declared GPU facts)}. It
prints one marked JSON line per command, with its "index":
{"status": "resolved", "settings": ...} | {"status": "raised", "raised": {type, message, file,
line}} | {"status": "unresolved", "reason"}; with "patched" (the platform queries answered
from declared facts), "stood_in" (absent GPU-only packages imported as stand-ins) and
"model" ({"source", "config"}: the config.json of the model the command names, in its folder
or the host's Hugging Face cache, never downloaded; null where there is none to read).

What runs is what the server runs at start before it loads weights:
- SGLang 0.5.23 (`sglang serve` / launch_server.py, srt/entrypoints/engine.py
  `_launch_subprocesses`): load_plugins, prepare_server_args (the parser only: it returns the
  raw record), resolve_once (the whole resolution pipeline, srt/arg_groups/pipeline.py),
  check_server_args, resolve_auto_parsers. Left out: `_set_envs_and_config` (process
  environment, signal handlers, package-version asserts), port allocation.
  Before 0.5.23's resolve_once (0.5.10), ServerArgs.__post_init__ resolved inside
  prepare_server_args, and there were no plugins to load.
- vLLM (`vllm serve`, entrypoints/cli/serve.py and launchers/api_server/entry.py):
  make_arg_parser, validate_parsed_serve_args, AsyncEngineArgs.from_cli_args,
  create_engine_config (every config and the platform's check_and_update_config; it reads
  the model's config.json, loads no weights and allocates no memory).

Declared facts replace the platform query and nothing else: torch's device queries
(`torch.cuda.is_available`, `device_count`, `get_device_capability`, `get_device_name`,
`get_device_properties`, `mem_get_info`), `torch.version.cuda` / `.hip`, and for vLLM its
platform object (vllm.platforms._current_platform: the engine's CUDA or ROCm class with its
device queries answered from the facts, and the cumem allocator, which every GPU build ships,
available; a model's info it inspected is used, not saved to its cache). GPU memory is a
declared fact too; when none is declared, SGLang's memory query (`get_device_memory_capacity`)
answers None, its own "memory unknown" path, and vLLM's `get_device_total_memory` raises,
which its batch defaults treat as unknown. A raise
the stand-ins cause (a CUDA call on CPU torch, a stand-in kernel) is "unresolved", never the
engine's verdict.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import os
import re
import sys
import time
import traceback
import types
from typing import Any

MARK = "flagtrial-resolve"
# Packages a GPU build of the engine installs and a CPU venv lacks: imported as stand-ins when
# absent (a finder after every real one), so the engine's modules import as on the GPU host.
GPU_ONLY = (
    "sgl_kernel",
    "flashinfer",
    "deep_gemm",
    "flash_attn",
    "vllm._C_stable_libtorch",
    "vllm._moe_C",
    "vllm._flashmla_C",
    "vllm.vllm_flash_attn",
    "aiter",
)
ARG_MODULES = {"sglang": "sglang.srt.server_args", "vllm": "vllm.engine.arg_utils"}
_STAND_IN_NOTE = "a stand-in for a GPU-only package absent here"
_stood_in: list[str] = []
_patched: list[str] = []
# The model the command names (a folder or a Hub name), once the parser has read it: its
# config.json is reported whether or not the resolution after it raises.
_model_word: str | None = None
# The stand-ins asked for an answer (called, tested, iterated) while this is a list: what
# such an answer decided is not the GPU host's.
_answered: list[str] | None = None


def _answer(name: str) -> None:
    if _answered is not None:
        _answered.append(name)


class _StandIn:
    """Any attribute, call or base class: what import-time code does with a kernel module."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _StandIn:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _StandIn(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _answer(self._name)
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _StandIn(f"{self._name}()")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __or__(self, other: Any) -> _StandIn:  # `kernels.Plan | None` in an annotation
        return self

    __ror__ = __or__

    def __iter__(self) -> Any:
        _answer(self._name)
        return iter(())

    def __bool__(self) -> bool:
        _answer(self._name)
        return False

    def __repr__(self) -> str:
        return f"<{_STAND_IN_NOTE}: {self._name}>"


class _GpuOnlyFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if any(name == p or name.startswith(p + ".") for p in GPU_ONLY):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name, _STAND_IN_NOTE)
        module.__path__ = []
        module.__getattr__ = lambda attr: _attr(spec.name, attr)  # type: ignore[method-assign]
        _stood_in.append(spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _attr(module: str, attr: str) -> _StandIn:
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _StandIn(f"{module}.{attr}")


def _patch(owner: Any, name: str, value: Any) -> None:
    if getattr(owner, name, None) is not value:  # `torch.version.hip = None` on CUDA torch
        setattr(owner, name, value)
        _patched.append(f"{owner.__name__}.{name}")


class _Props:
    """torch.cuda.get_device_properties' answer, from the declared facts."""

    def __init__(self, facts: dict[str, Any], name: str) -> None:
        self.name = name
        self.major, self.minor = capability(facts)
        self.total_memory = int((facts.get("memory_mib") or 0) * (1 << 20))
        self.gcnArchName = facts.get("gfx") or ""
        self.multi_processor_count = 0
        self.is_integrated = False


def capability(facts: dict[str, Any]) -> tuple[int, int]:
    """The declared compute capability; on ROCm, without one, what HIP derives from the gfx
    name (gfx<MAJOR><MINOR><STEPPING>: gfx942 -> 9.4, gfx90a -> 9.0, gfx1100 -> 11.0)."""
    if facts.get("compute_cap"):
        major, minor = facts["compute_cap"]
        return int(major), int(minor)
    digits = str(facts.get("gfx") or "").removeprefix("gfx")
    if len(digits) in (3, 4) and digits[:-2].isdigit():
        return int(digits[:-2]), int(digits[-2], 16)
    return 0, 0


def device_name(facts: dict[str, Any]) -> str:
    if facts.get("name"):
        return str(facts["name"])
    if facts["platform"] == "rocm":
        return f"AMD GPU {facts.get('gfx') or ''} (declared)".replace("  ", " ")
    major, minor = facts.get("compute_cap") or (0, 0)
    return f"NVIDIA GPU sm_{major}{minor} (declared)"


def declare_torch(facts: dict[str, Any]) -> None:
    """torch's device queries answered from the facts (CUDA or ROCm)."""
    import torch

    count = int(facts.get("gpus") or 1)
    cap = capability(facts)
    name = device_name(facts)
    memory = facts.get("memory_mib")

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        if memory is None:
            raise RuntimeError("GPU memory: not declared")
        return int(memory * (1 << 20)), int(memory * (1 << 20))

    cuda = torch.cuda
    _patch(cuda, "is_available", lambda: True)
    _patch(cuda, "device_count", lambda: count)
    _patch(cuda, "get_device_capability", lambda device=None: cap)
    _patch(cuda, "get_device_name", lambda device=None: name)
    props = _Props(facts, name)
    _patch(cuda, "get_device_properties", lambda device=None: props)
    _patch(cuda, "mem_get_info", mem_get_info)
    if facts["platform"] == "rocm":
        _patch(torch.version, "cuda", None)
        _patch(torch.version, "hip", str(facts.get("rocm") or "6.3"))
    else:
        _patch(torch.version, "cuda", str(facts.get("cuda") or "12.8"))
        _patch(torch.version, "hip", None)


def declare_sglang(facts: dict[str, Any]) -> None:
    if facts.get("memory_mib") is None:
        from sglang.srt.utils import common

        original = common.get_device_memory_capacity
        unknown = lambda device=None: None  # noqa: E731
        # the function and its copies already bound by `from ... import`
        for module in [common] + [m for m in list(sys.modules.values()) if m is not common]:
            if getattr(module, "get_device_memory_capacity", None) is original:
                _patch(module, "get_device_memory_capacity", unknown)


def declare_vllm(facts: dict[str, Any]) -> None:
    """vLLM's platform object: its own CUDA or ROCm class, device queries from the facts."""
    import vllm.platforms as platforms
    from vllm.platforms.interface import DeviceCapability

    if facts["platform"] == "rocm":
        _cpu_kernels_as_vllm_c()
        from vllm.platforms.rocm import RocmPlatform as base
    else:
        from vllm.platforms.cuda import NonNvmlCudaPlatform as base
    cap = DeviceCapability(*capability(facts))
    count = int(facts.get("gpus") or 1)
    name = device_name(facts)
    memory = facts.get("memory_mib")

    def total_memory(cls: Any, device_id: int = 0) -> int:
        if memory is None:
            raise RuntimeError("GPU memory: not declared")
        return int(memory * (1 << 20))

    declared = type(
        "Declared" + base.__name__,
        (base,),
        {
            "get_device_capability": classmethod(lambda cls, device_id=0: cap),
            "get_device_name": classmethod(lambda cls, device_id=0: name),
            "get_device_total_memory": classmethod(total_memory),
            "device_count": classmethod(lambda cls: count),
            "is_fully_connected": classmethod(lambda cls, ids: True),
            # The GPU builds (CUDA and ROCm) ship the compiled `vllm.cumem_allocator` and
            # load it beside the driver; the CPU build has neither, so its own answer
            # (device_allocator/cumem.py) would refuse sleep mode for the build, not the GPU.
            "is_cumem_allocator_available": lambda self: True,
        },
    )
    # the class overrides exactly these: get_device_capability, get_device_name,
    # get_device_total_memory, device_count, is_fully_connected, is_cumem_allocator_available
    _patch(platforms, "_current_platform", declared())
    stand_in_gpu_ops()


def _cpu_kernels_as_vllm_c() -> None:
    """The CPU build's `vllm._C` is its AVX512 kernel library; the ROCm platform module
    imports it by that name (platforms/rocm.py), which on a CPU without AVX512 dies of an
    illegal instruction. The CPU platform's own loader picks the variant this CPU runs
    (platforms/cpu.py `import_kernels`: `vllm._C_AVX2`); loaded first, the name is bound to
    it, its ops registered as `vllm._C` would have."""
    import torch

    if "vllm._C" in sys.modules or torch.cpu._is_avx512_supported():
        return
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.import_kernels()
    sys.modules["vllm._C"] = types.ModuleType("vllm._C", "the CPU kernels this CPU runs")
    _patched.append("sys.modules[vllm._C]")


# The op namespaces vLLM's GPU builds register from their compiled extensions.
GPU_OP_NAMESPACES = ("_C", "_moe_C", "_C_cache_ops", "_C_custom_ar", "_rocm_C")


def stand_in_gpu_ops() -> None:
    """An op of the GPU build's extensions that this CPU build lacks, looked up by vLLM's
    compilation passes, is a stand-in: they name such ops as the configuration builds them
    (`ROTARY_OP = torch.ops._C.rotary_embedding.default`, passes/fusion/matcher_utils.py)
    only to match graphs when compiling, and without one the resolution would stop there,
    before VllmConfig's later checks. Elsewhere a lookup still fails: vLLM tests for its
    ops with `hasattr` and registers fake kernels for those it finds."""
    from torch import _ops

    lookup = _ops._OpNamespace.__getattr__
    passes = f"{os.sep}vllm{os.sep}compilation{os.sep}"

    def gpu_lookup(self: Any, op_name: str) -> Any:
        try:
            return lookup(self, op_name)
        except AttributeError:
            caller = sys._getframe(1).f_code.co_filename
            if self.name not in GPU_OP_NAMESPACES or passes not in caller:
                raise
            _stood_in.append(f"torch.ops.{self.name}.{op_name}")
            return _StandIn(f"torch.ops.{self.name}.{op_name}")

    _ops._OpNamespace.__getattr__ = gpu_lookup
    _patched.append("torch._ops._OpNamespace.__getattr__")


def keep_model_infos_unsaved() -> None:
    """A model class vLLM has no cached info for is inspected in a subprocess (on this
    machine's own platform: its info does not depend on it), then saved to the cache by
    code that imports the model layers (model_executor/models/registry.py
    `_save_modelinfo_to_cache`), which on a CPU build under a declared CUDA platform raise
    on CUDA-only ops. On declared facts the info is used and not saved."""
    from vllm.model_executor.models import registry

    _patch(registry._LazyRegisteredModel, "_save_modelinfo_to_cache", lambda *args: None)


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=_shown))


def _shown(value: Any) -> str:
    """A value JSON cannot hold, as its repr without the object's address (`<ModelConfig
    object at 0x7f...>` in 0.5.10's settings), which differs at every run."""
    return re.sub(r" at 0x[0-9a-fA-F]+>", ">", repr(value))


def _sglang_model(argv: list[str]) -> str | None:
    """The model path as SGLang's own parser reads it, parsed alone: prepare_server_args
    goes on into the resolution, which may raise."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(parser)
    with contextlib.suppress(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        return getattr(parser.parse_known_args(argv)[0], "model_path", None)
    return None


def model_config(word: str | None) -> dict[str, Any] | None:
    """The config.json the server reads for the model `word` names: in that folder, or for a
    Hub name in this host's Hugging Face cache (never downloaded); None where there is none."""
    if not word:
        return None
    path = os.path.join(word, "config.json")
    if not os.path.isfile(path):
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(word, "config.json")
        except Exception:  # not a Hub name, or no huggingface_hub: nothing cached to read
            return None
        if not isinstance(found, str):
            return None
        path = found
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    return {"source": path, "config": config} if isinstance(config, dict) else None


def resolve_sglang(argv: list[str]) -> dict[str, Any]:
    from sglang.srt.server_args import prepare_server_args

    global _model_word
    _model_word = _sglang_model(argv)
    if importlib.util.find_spec("sglang.srt.plugins") is not None:  # 0.5.10 has no plugins
        importlib.import_module("sglang.srt.plugins").load_plugins()
    args = _parsed(lambda: prepare_server_args(argv))
    if hasattr(args, "resolve_once"):
        args.resolve_once()
    args.check_server_args()
    with contextlib.suppress(ImportError):
        from sglang.srt.parser.template_detection import resolve_auto_parsers

        resolve_auto_parsers(args)
    settings = args.resolved_dict() if hasattr(args, "resolved_dict") else vars(args)
    return {"settings": _plain(settings)}


def resolve_vllm(argv: list[str], declared: bool) -> dict[str, Any]:
    global _model_word
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli = None
    for name in (  # where make_arg_parser lives, newest release first
        "vllm.entrypoints.common.cli_args",
        "vllm.entrypoints.launchers.cli_args",
        "vllm.entrypoints.openai.cli_args",
    ):
        with contextlib.suppress(ModuleNotFoundError):
            cli = importlib.import_module(name)
            if hasattr(cli, "make_arg_parser"):
                break
            cli = None
    if cli is None:  # not the engine's verdict: this release is laid out as none known here
        raise _NoEngine("no vLLM serve parser module (make_arg_parser) known here")
    words = argv[1:] if argv[:1] == ["serve"] else argv
    args = _parsed(lambda: cli.make_arg_parser(FlexibleArgumentParser()).parse_args(words))
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    _model_word = getattr(args, "model", None)
    cli.validate_parsed_serve_args(args)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    with _reads_of(engine_args) as read:
        config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    scheduler, cache = config.scheduler_config, config.cache_config
    attention = _attention_backend(config, declared)
    beyond = _read_beyond_config(engine_args)
    # The API server's own arguments (not engine arguments) as it parsed them.
    frontend = {f"frontend.{k}": v for k, v in vars(args).items() if not hasattr(engine_args, k)}
    return {
        "config_line": str(config),
        "settings": _plain(
            {
                "scheduler_config.max_num_seqs": scheduler.max_num_seqs,
                "scheduler_config.max_num_batched_tokens": scheduler.max_num_batched_tokens,
                "cache_config.block_size": cache.block_size,
                "cache_config.cache_dtype": str(cache.cache_dtype),
                **attention,
                **frontend,
            }
        ),
        "record": {**_config_record(config), **attention},
        "config_only": sorted(read - beyond),
        "read_beyond_config": sorted(beyond),
    }


# Where vLLM refuses an attention configuration: its selector and the platforms' pickers.
_SELECTORS = ("vllm/v1/attention/selector.py", "vllm/platforms/")


def _attention_backend(config: Any, declared: bool) -> dict[str, str]:
    """The attention backend the model's layers get. Each layer calls vLLM's selector when it
    is built (model_executor/layers/attention/attention.py, mla_attention.py: the model's
    head size, its dtype, the cache's dtype, under the resolved configuration); this is that
    call, for the model's main attention. {"attention.backend": its name}, or nothing where
    the pick rested on a stand-in's answer (a kernel package this venv lacks), the release
    has no such selector, or it raised other than by refusing; its refusal (a ValueError of
    the selector or the platform's) raises, as the server does at startup."""
    global _answered
    try:
        from vllm.config import set_current_vllm_config
        from vllm.v1.attention.selector import get_attn_backend
    except ImportError:
        return {}
    model = config.model_config
    mla = bool(model.use_mla)
    _answered = []
    try:
        with set_current_vllm_config(config):
            backend = get_attn_backend(
                model.get_head_size(),
                model.dtype,
                config.cache_config.cache_dtype,
                use_mla=mla,
                num_heads=model.get_num_attention_heads(config.parallel_config) if mla else None,
                has_sliding_window=model.get_sliding_window() is not None,
            )
        name = backend.get_name()
    except Exception as e:
        file, _ = _innermost(e.__traceback__, "vllm")
        refused = isinstance(e, ValueError) and (file or "").startswith(_SELECTORS)
        if _answered or _ours(e, declared) or not refused:
            return {}
        raise
    finally:
        answered, _answered = _answered, None
    return {} if answered else {"attention.backend": str(name)}


# Drawn afresh at every start: not a setting of the command.
_DRAWN = ("instance_id",)


def _config_record(config: Any, prefix: str = "", depth: int = 0) -> dict[str, Any]:
    """Every field of vLLM's resolved configuration (VllmConfig, its nested configs), dotted,
    each a plain value (anything else as its repr): all the engine core is given."""
    import dataclasses
    import enum

    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        key, value = f"{prefix}{f.name}", getattr(config, f.name, None)
        if key in _DRAWN:
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type) and depth < 4:
            out.update(_config_record(value, key + ".", depth + 1))
        elif isinstance(value, enum.Enum):
            out[key] = str(value)
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[key] = value
        else:
            out[key] = repr(value)[:500]
    return out


@contextlib.contextmanager
def _reads_of(engine_args: Any) -> Any:
    """The fields of `engine_args` read inside the block (by the config's creation)."""
    read: set[str] = set()
    fields, own = set(vars(engine_args)), type(engine_args)

    def reading(self: Any, name: str) -> Any:
        if name in fields:
            read.add(name)
        return object.__getattribute__(self, name)

    engine_args.__class__ = type("Watched" + own.__name__, (own,), {"__getattribute__": reading})
    try:
        yield read
    finally:
        engine_args.__class__ = own


# Where the arguments' reads are not the server's: the config package (what the record
# holds), and the `vllm bench` commands, which `vllm serve` never imports.
_NOT_THE_SERVERS_READS = ("config", "benchmarks", os.path.join("entrypoints", "cli", "benchmark"))


def _read_beyond_config(engine_args: Any) -> set[str]:
    """Engine-argument fields vLLM's source reads by name outside the argument module and the
    config package (`engine_args.disable_log_stats` in the engine client, `args.X` in the
    entrypoints, `getattr(args, "X", ...)`): their values reach the server by more than its
    configuration. By name and by any receiver called `args`, so more fields than are; a
    loop over every field (`vars(args)`, the non-default-args log line) is not seen."""
    root = os.path.dirname(importlib.import_module("vllm").__file__ or "")
    fields = set(vars(engine_args))
    pattern = re.compile(
        r"\b(?:engine_args|args)\.(\w+)\b|getattr\(\s*(?:engine_args|args)\s*,\s*[\"'](\w+)"
    )
    found: set[str] = set()
    for folder, _dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        if any(rel == p or rel.startswith(p + os.sep) for p in _NOT_THE_SERVERS_READS):
            continue
        for name in files:
            if not name.endswith(".py") or (rel == "engine" and name == "arg_utils.py"):
                continue
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as fh:
                found.update(m for pair in pattern.findall(fh.read()) for m in pair if m in fields)
    return found


class _NoEngine(Exception):
    """The engine does not import with this interpreter: nothing was resolved."""


class _ParseError(Exception):
    """argparse refused the command (it exits): its own message."""


def _parsed(parse: Any) -> Any:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse()
    except SystemExit as e:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        raise _ParseError(lines[-1] if lines else f"the parser exited ({e.code})") from None


def _innermost(tb: Any, package: str) -> tuple[str | None, int | None]:
    """file:line of the innermost frame inside the engine's package (path from the package)."""
    found: tuple[str | None, int | None] = (None, None)
    for frame in traceback.extract_tb(tb):
        parts = frame.filename.replace("\\", "/").split("/")
        if package in parts[:-1]:
            at = len(parts) - 1 - parts[::-1].index(package)
            found = ("/".join(parts[at:]), frame.lineno)
    return found


def _ours(e: BaseException, declared: bool) -> str | None:
    """Why a raise is the stand-ins' doing, not the engine's verdict; None if it is not. On
    declared facts a missing module or torch op is one the GPU host has and this venv lacks."""
    text = f"{type(e).__name__}: {e}"
    chain = [e]
    while chain[-1].__cause__ or chain[-1].__context__:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)  # type: ignore[arg-type]
    texts = " | ".join(f"{type(x).__name__}: {x}" for x in chain)
    markers = (
        _STAND_IN_NOTE,
        "_StandIn",
        "not compiled with CUDA",
        "torch._C' has no attribute '_cuda",
        "GPU memory: not declared",
    )
    # An op the GPU build's extension registers (torch.ops._C.rotary_embedding, looked up
    # when vLLM builds its fusion passes) that this CPU build has not.
    missing_op = "'_OpNamespace' " in texts and "has no attribute" in texts
    if any(m in texts for m in markers) or (
        declared and (isinstance(e, ModuleNotFoundError) or missing_op)
    ):
        return f"the resolution needs what is not here ({text[:300]})"
    return None


def _setup(engine: str, facts: dict[str, Any] | None, declared: bool) -> None:
    """The engine's argument module imported, as the server imports it first, with the
    declared facts in place: what every command of the request shares."""
    if importlib.util.find_spec(engine) is None:
        raise _NoEngine(f"{engine} is not installed for this python")
    try:
        if declared:
            sys.meta_path.append(_GpuOnlyFinder())
            declare_torch(facts or {})
            if engine == "vllm":  # before any module binds vLLM's platform object
                declare_vllm(facts or {})
        importlib.import_module(ARG_MODULES[engine])
        if declared and engine == "sglang":
            declare_sglang(facts or {})
        if declared and engine == "vllm":
            keep_model_infos_unsaved()
    except Exception as e:
        raise _NoEngine(f"{engine} does not import here: {type(e).__name__}: {e}") from e


def _resolved(engine: str, words: list[str], declared: bool) -> dict[str, Any]:
    """One command's outcome: resolved, the engine's raise, or why it could not run."""
    try:
        got = resolve_sglang(words) if engine == "sglang" else resolve_vllm(words, declared)
        return {"status": "resolved", **got}
    except _NoEngine as e:
        return {"status": "unresolved", "reason": str(e)[:500]}
    except _ParseError as e:
        return {"status": "raised", "raised": {"type": "SystemExit", "message": str(e),
                                               "file": None, "line": None}}  # fmt: skip
    except Exception as e:
        why = _ours(e, declared)
        if why is not None:
            return {"status": "unresolved", "reason": why}
        file, line = _innermost(e.__traceback__, engine)
        message = str(e) or repr(e)
        return {"status": "raised", "raised": {"type": type(e).__name__,
                                               "message": message[:2000], "file": file,
                                               "line": line}}  # fmt: skip


def main(argv: list[str]) -> int:
    """Each command of the request resolved in a process of its own, forked once the engine
    is imported (most of a resolution's time): what one resolution sets in the engine's
    modules or the environment never reaches the next. The last runs in this process."""
    request = json.loads(argv[0])
    engine, facts = request["engine"], request.get("facts")
    os.environ.update(request.get("env") or {})
    began = time.monotonic()
    declared = facts is not None and facts["platform"] in ("cuda", "rocm")
    failed: dict[str, Any] | None = None
    try:
        _setup(engine, facts, declared)
    except _NoEngine as e:
        failed = {"status": "unresolved", "reason": str(e)[:500]}
    imported = time.monotonic() - began
    commands = request["commands"]
    for index, words in enumerate(commands):
        last = index == len(commands) - 1
        sys.stdout.flush()
        sys.stderr.flush()  # or the child repeats what is buffered
        if not last and os.fork() != 0:
            os.wait()
            continue
        started = time.monotonic()
        out = failed or _resolved(engine, words, declared)
        out.update(patched=_patched, stood_in=sorted(set(_stood_in)),
                   model=model_config(_model_word), index=index,
                   seconds=round(imported + time.monotonic() - started, 2))  # fmt: skip
        print("\n" + MARK + " " + json.dumps(out, default=repr), flush=True)
        if not last:
            sys.stderr.flush()
            os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
