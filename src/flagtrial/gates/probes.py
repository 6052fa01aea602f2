"""The host facts an evaluation comes down to: `get_device_capability()`, `get_device_sm()`,
`torch.version.cuda` / `.hip`, `torch.cuda.is_available()`, `device_count()`, the GPU's name
and properties, the gfx architecture, the variables the launch's environment sets; and, when
the platform's own pick is computed, what the environment's other variables (unset) and the
platform's installed packages give."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flagtrial.gates.model import GateHost
from flagtrial.gates.platforms import dependency_platforms
from flagtrial.gates.values import (
    NOT_NONE,
    UNKNOWN,
    Capability,
    DeviceProps,
    Instance,
    Scope,
    Val,
)
from flagtrial.redact import is_secret_name

if TYPE_CHECKING:
    from flagtrial.gates.capability import Evaluator

# vLLM reads the gfx architecture through amdsmi first: a probe of the host's fact.
_GCN_ARCH_PROBES = {"_get_gcn_arch", "_query_gcn_arch_from_amdsmi", "get_gcn_arch"}


def _fact(value: Any, note: str) -> Val:
    return Val(value, True, (("fact", -1, 0, note),))


def _cap_note(host: GateHost) -> str:
    cap = host.capability
    return "host compute capability " + ("{}.{}".format(*cap) if cap else "unknown")


def primitive_call(ev: Evaluator, node: ast.Call, scope: Scope) -> Val | None:
    func = node.func
    last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    host = ev.host
    if last in ("get_device_capability", "get_device_sm") and host.gpu_count == 0:
        return _fact(None, "host has no GPU")
    if last == "get_device_capability":
        cap = host.capability
        return _fact(Capability(cap) if cap else UNKNOWN, _cap_note(ev.host))
    if last == "get_device_sm":
        cap = host.capability
        return _fact(cap[0] * 10 + cap[1] if cap else UNKNOWN, _cap_note(ev.host))
    dotted = ev.external_name(func, scope)
    if dotted == "torch.cuda.is_available":
        return _fact(host.gpu_count > 0, f"host has {host.gpu_count} GPU(s)")
    if dotted == "torch.cuda.device_count":
        return _fact(host.gpu_count, f"host has {host.gpu_count} GPU(s)")
    if dotted == "torch.cuda.get_device_name":
        return _fact(host.gpu_name or UNKNOWN, "host GPU name")
    if dotted in ("os.getenv", "os.environ.get") and node.args:
        launched = _launch_env(ev, node.args[0], scope)
        if launched is not None:
            return launched
    if last == "get" and not node.args and not node.keywords:
        field = _env_field(ev, node, scope)
        if field is not None:
            return field
    if ev.defaults is not None:
        assumed = _assumed_call(ev, dotted, node, scope)
        if assumed is not None:
            return assumed
    if last in _GCN_ARCH_PROBES and host.platform == "rocm":
        return _fact(host.gfx or UNKNOWN, "host gfx architecture")
    if dotted in ("torch.backends.mps.is_available", "torch.mps.is_available"):
        return _fact(False, f"host runtime is {host.platform}")
    if dotted == "torch.cuda.get_device_properties":
        return _fact(DeviceProps(host), "host GPU properties")
    return None


def _launch_env(ev: Evaluator, name_node: ast.expr, scope: Scope) -> Val | None:
    """The value the launch's environment gives a variable; None where the launch does not
    set it. UNKNOWN where the engine's own code also sets it: the read may see either."""
    name = ev.expr(name_node, scope).value
    if not isinstance(name, str) or name not in ev.env:
        return None
    if name in ev.index.env_writes:
        return Val(UNKNOWN)
    return _fact(ev.env[name], _launch_note(name, ev.env[name]))


def _launch_note(name: str, value: str) -> str:
    shown = f"{name} (value withheld)" if is_secret_name(name) else f"{name}={value}"
    return f"{shown} in the launch's environment"


def _env_bool(text: str) -> bool:
    word = text.lower()
    if word in ("true", "1", "yes", "y", "false", "0", "no", "n"):
        return word in ("true", "1", "yes", "y")
    raise ValueError(text)


# SGLang's typed environment fields (srt/environ.py `EnvBool.parse` ...) by class name
_ENV_FIELDS: dict[str, Callable[[str], Any]] = {
    "EnvBool": _env_bool,
    "EnvInt": int,
    "EnvFloat": float,
    "EnvStr": str,
}
_ENVIRON = "sglang.srt.environ"


def _env_field(ev: Evaluator, node: ast.Call, scope: Scope) -> Val | None:
    """SGLang's `envs.NAME.get()`, `NAME = EnvBool(default)` in its `Envs` class: the value
    the launch sets, parsed as the field parses it; unset, the declared default where the
    platform's own pick is computed, else unknown (as `os.getenv` is read). None: not one."""
    func = node.func
    if not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Attribute):
        return None
    if not isinstance(func.value.value, ast.Name):  # `envs.NAME.get()`: nothing else is
        return None
    holder = ev.expr(func.value.value, scope).value
    if not isinstance(holder, Instance) or holder.cls.name != "Envs":
        return None
    info = ev.index.files[holder.cls.fi]
    name = func.value.attr
    if info.module != _ENVIRON or name not in info.classes["Envs"].attrs:
        return None
    stmts = ev.reader.unit(holder.cls.fi, *info.classes["Envs"].attrs[name])
    made = getattr(stmts[0], "value", None) if stmts else None
    kind = getattr(made.func, "id", "") if isinstance(made, ast.Call) else ""
    parse = _ENV_FIELDS.get(kind)
    if parse is None or not isinstance(made, ast.Call) or name in ev.index.env_writes:
        return Val(UNKNOWN)
    if name in ev.env:
        try:
            return _fact(parse(ev.env[name]), _launch_note(name, ev.env[name]))
        except ValueError:
            return Val(UNKNOWN)  # the field warns and falls back to its default
    if ev.defaults is None or not made.args or not isinstance(made.args[0], ast.Constant):
        return Val(UNKNOWN)
    return _fact(made.args[0].value, f"{name} unset: its default")


def _assumed_call(ev: Evaluator, dotted: str | None, node: ast.Call, scope: Scope) -> Val | None:
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "is_out_of_tree":
        return Val(False, True, (("fact", -1, 0, "no out-of-tree platform plugin"),))
    if dotted in ("os.getenv", "os.environ.get") and len(node.args) >= 1:
        default = node.args[1] if len(node.args) > 1 else None
        val = ev.expr(default, scope) if default is not None else Val(None)
        return Val(val.value, True, (("fact", -1, 0, "environment variables unset"),))
    if dotted == "importlib.util.find_spec" and node.args:
        name = ev.expr(node.args[0], scope).value
        if isinstance(name, str):
            installed = ev.host.platform in dependency_platforms(name.split(".")[0])
            note = f"{name} {'is' if installed else 'is not'} installed on {ev.host.platform}"
            return Val(NOT_NONE if installed else None, True, (("fact", -1, 0, note),))
    return None


def primitive_attr(ev: Evaluator, dotted: str) -> Val | None:
    host = ev.host
    if dotted == "torch.version.cuda":
        if host.platform != "cuda":
            return _fact(None, f"host runtime is {host.platform}")
        if host.cuda_version is None:
            return _fact(NOT_NONE, "host CUDA version not given")
        return _fact("{}.{}".format(*host.cuda_version), "host CUDA version")
    if dotted == "torch.version.hip":
        if host.platform != "rocm":
            return _fact(None, f"host runtime is {host.platform}")
        if host.rocm_version is None:
            return _fact(NOT_NONE, "host runtime is ROCm")
        return _fact("{}.{}".format(*host.rocm_version), "host ROCm version")
    if dotted in ("torch.version.musa", "torch.version.xpu"):
        return _fact(None, f"host runtime is {host.platform}")
    return None
