"""What Python engines' startup logs say beyond their numbers: the decisions they announce
as warnings (a setting overridden, a feature disabled, a fallback taken) and why a start failed.

Line prefixes differ: SGLang `[2025-11-29 22:40:00 TP0] `, vLLM
`(EngineCore_DP0 pid=12) WARNING 11-29 22:40:00 [fa_utils.py:121] `; both are dropped, so a
message reads the same from one start to the next.
"""

from __future__ import annotations

import re

from flagtrial.facts import Scalar

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PREFIX = re.compile(
    r"^(?:\(\S+ pid=\d+\) )?(?:[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] )?"
    r"(?:\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?[^\]]*\] )?"
    # c10/glog lines from torch's C++: `[W1201 12:22:27.970113757 ProcessGroupGloo.cpp:524] `
    r"(?:\[[DIWEF]\d{4} \d\d:\d\d:\d\d(?:\.\d+)? [^\]]*\] )?"
)
# The wording engines use when they change what was asked for (see the engines' warnings,
# e.g. vLLM v1/attention/backends/fa_utils.py:121 "..., defaulting to FA version 4 ...";
# SGLang srt/arg_groups/overrides.py:1308 "..., will fallback to torch_native backend.");
# vLLM 0.32 CPU: "Reducing Torch threads from 2 to 1 for serving." (utils/torch_utils.py:295),
# "Model Runner V2 requires Triton; using the V1 model runner instead." (config/vllm.py:725).
# Whole words only: nanobind's leak report at a Triton process's exit (`- leaked function
# "get_disable_loop_licm_attr"`, printed at some exits, not others) names no decision.
OVERRIDE = re.compile(
    r"\b(?:Overriding|[Ff]all(?:ing)? ?back|defaulting to|[Dd]isabl|precluded|Reducing|instead\b)"
)
# Dumps of every setting mention "disable_..." by name: they are settings, not decisions.
DUMPS = ("server_args=", "non-default args:", "with config:")
_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt): .+")
_ARGPARSE = re.compile(r"^\S+: error: .+")
# vLLM's prefix naming the process a line comes from (entrypoints: the API server has none)
_PROCESS = re.compile(r"^\(\S+ pid=\d+\) ")


def message(line: str) -> str:
    return _PREFIX.sub("", _ANSI.sub("", line).strip(), count=1)


def override_warnings(log: str) -> tuple[dict[str, Scalar], list[str]]:
    """Settings `override: <message head>` = message, one per distinct override message."""
    settings: dict[str, Scalar] = {}
    lines: list[str] = []
    for raw in log.splitlines():
        text = message(raw)
        if not OVERRIDE.search(text) or any(d in text for d in DUMPS) or len(text) > 400:
            continue
        head = re.split(r"[,.;:] ", text, maxsplit=1)[0][:80]
        settings[f"override: {head}"] = text
        lines.append(text)
    return settings, list(dict.fromkeys(lines))


def python_crash_reason(log: str) -> str | None:
    """An argparse error (the engine refused its flags), else the root cause: each process's
    last exception (its traceback's last error line), the earliest of them. In a vLLM log
    the worker or engine core (`(EngineCore pid=N)` lines) fails first; the API server's
    `Engine core initialization failed. See root cause above.` follows and is not the cause."""
    last: dict[str, tuple[int, str]] = {}  # process -> (order of its last exception, text)
    for order, line in enumerate(log.splitlines()):
        text = message(line)
        if _ARGPARSE.match(text):
            return text
        if _EXCEPTION.match(text):
            found = _PROCESS.match(_ANSI.sub("", line).strip())
            process = found[0] if found else ""
            last[process] = (order, text)
    return min(last.values())[1] if last else None
