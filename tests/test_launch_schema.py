"""Flag schemas from real `--help` output: llama-server's own, and Python argparse's."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from flagtrial.errors import SpecError, UnknownFlagError
from flagtrial.launch.schema import FlagSchema, parse_argv

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine


@pytest.fixture(scope="module")
def llama_help(llama_server_bin: Path) -> str:
    return subprocess.run(
        [str(llama_server_bin), "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout


@pytest.fixture(scope="module")
def llama(llama_help: str, llama_server_bin: Path) -> FlagSchema:
    return FlagSchema.parse_help(llama_help, program=str(llama_server_bin))


def run_llama(binary: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # --version ends the run right after argument parsing; nothing is loaded.
    return subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_llama_aliases_normalise(llama: FlagSchema) -> None:
    assert llama.program == "llama-server"
    assert llama.style == "llama"
    for alias, canonical in [
        ("-np", "--parallel"),
        ("--parallel", "--parallel"),
        ("-c", "--ctx-size"),
        ("--ctx-size", "--ctx-size"),
        ("-t", "--threads"),
        ("-cb", "--cont-batching"),
        ("--no-cont-batching", "--cont-batching"),
    ]:
        assert llama.lookup(alias).canonical == canonical


def test_llama_flag_details(llama: FlagSchema) -> None:
    parallel = llama.lookup("-np")
    assert (parallel.names, parallel.takes_value, parallel.nargs) == (
        ("-np", "--parallel"),
        True,
        1,
    )
    assert (parallel.metavar, parallel.env_var) == ("N", "LLAMA_ARG_N_PARALLEL")
    assert "server slots" in parallel.help
    assert llama.lookup("-c").env_var == "LLAMA_ARG_CTX_SIZE"
    cb = llama.lookup("--cont-batching")
    assert not cb.takes_value
    assert cb.negative_names == ("-nocb", "--no-cont-batching")
    assert llama.lookup("--control-vector-layer-range").nargs == 2
    # `[on|off|auto]` is a hint: llama-server also takes `-fa 1`, so no closed choice list.
    fa = llama.lookup("-fa")
    assert (fa.takes_value, fa.optional_value, fa.choices) == (True, False, None)
    assert llama.lookup("-sm").choices == ("none", "layer", "row", "tensor")
    assert "q8_0" in (llama.lookup("-ctk").choices or ())


def test_llama_choice_lists_match_the_binary(llama: FlagSchema, llama_server_bin: Path) -> None:
    assert run_llama(llama_server_bin, "-fa", "1", "--version").returncode == 0
    assert run_llama(llama_server_bin, "-sm", "bogus", "--version").returncode != 0
    assert run_llama(llama_server_bin, "-ctk", "bogus", "--version").returncode != 0
    assert run_llama(llama_server_bin, "-ctk", "q8_0", "--version").returncode == 0


def test_every_llama_switch_and_value_flag_is_what_the_binary_says(
    llama: FlagSchema, llama_server_bin: Path
) -> None:
    """Each switch spelling parses alone; each value flag without its value is refused."""
    for flag in llama.flags:
        for name in flag.names:
            if flag.takes_value:
                result = run_llama(llama_server_bin, name)
                assert "expected value for argument" in result.stderr, name
            else:
                assert run_llama(llama_server_bin, name, "--version").returncode == 0, name


def test_close_matches(llama: FlagSchema) -> None:
    with pytest.raises(UnknownFlagError) as err:
        llama.lookup("--paralel")
    assert str(err.value) == "unknown flag --paralel for llama-server; did you mean --parallel?"
    with pytest.raises(UnknownFlagError, match=r"did you mean --ctx-size or --ctx-checkpoints\?"):
        llama.lookup("--ctx")
    with pytest.raises(
        UnknownFlagError, match=r"^unknown flag --no-such-flag-at-all for llama-server$"
    ):
        llama.lookup("--no-such-flag-at-all")
    assert UnknownFlagError.exit_code == 4


def test_llama_refuses_flag_equals_value(llama: FlagSchema, llama_server_bin: Path) -> None:
    assert "invalid argument" in run_llama(llama_server_bin, "--parallel=4", "--version").stderr
    with pytest.raises(
        UnknownFlagError, match="does not accept --parallel=VALUE; write --parallel 4"
    ):
        llama.lookup("--parallel=4")


def test_parse_llama_argv(llama: FlagSchema) -> None:
    items = parse_argv(
        ["/usr/bin/llama-server", "-m", "/m.gguf", "-t", "-1", "--no-cont-batching",
         "--control-vector-layer-range", "1", "5", "-fa", "on", "stray"],
        llama,
    )  # fmt: skip
    assert [(i.flag.canonical if i.flag else None, i.words, i.value) for i in items] == [
        (None, ("/usr/bin/llama-server",), None),
        ("--model", ("-m", "/m.gguf"), "/m.gguf"),
        ("--threads", ("-t", "-1"), "-1"),
        ("--cont-batching", ("--no-cont-batching",), None),
        ("--control-vector-layer-range", ("--control-vector-layer-range", "1", "5"), "1 5"),
        ("--flash-attn", ("-fa", "on"), "on"),
        (None, ("stray",), None),
    ]
    assert items[3].negated and items[2].name == "-t"


def test_parse_llama_argv_errors(llama: FlagSchema) -> None:
    with pytest.raises(SpecError, match="-np expects N"):
        parse_argv(["llama-server", "-np"], llama)
    with pytest.raises(UnknownFlagError, match="did you mean --parallel"):
        parse_argv(["llama-server", "--paralel", "4"], llama)


# ---------------------------------------------------------------------------- argparse


def sglang_like_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang.launch_server")
    p.add_argument("--model-path", "--model", type=str, required=True, help="model weights")
    p.add_argument("--tensor-parallel-size", "--tp-size", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float, help="fraction of GPU memory")
    p.add_argument("--dtype", choices=["auto", "half", "bfloat16"], default="auto")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--log-requests", action=argparse.BooleanOptionalAction)
    p.add_argument("--served-model-name", nargs="?", const="default")
    p.add_argument("--lora-paths", nargs="+")
    p.add_argument("--api-keys", nargs="*")
    p.add_argument("--offset", type=int)
    return p


@pytest.fixture(scope="module")
def sglang() -> FlagSchema:
    return FlagSchema.parse_help(sglang_like_parser().format_help(), program="sglang.launch_server")


def test_argparse_help(sglang: FlagSchema) -> None:
    assert sglang.style == "argparse" and sglang.accepts_equals
    tp = sglang.lookup("--tp-size")
    assert (tp.canonical, tp.names, tp.metavar) == (
        "--tensor-parallel-size",
        ("--tensor-parallel-size", "--tp-size"),
        "TENSOR_PARALLEL_SIZE",
    )
    assert sglang.lookup("--dtype").choices == ("auto", "half", "bfloat16")
    assert not sglang.lookup("--enable-metrics").takes_value
    assert sglang.lookup("--no-log-requests").negative_names == ("--no-log-requests",)
    served = sglang.lookup("--served-model-name")
    assert served.optional_value and served.takes_value
    assert sglang.lookup("--lora-paths").variadic
    assert sglang.lookup("--api-keys").variadic and sglang.lookup("--api-keys").optional_value
    assert sglang.lookup("--tp").canonical == "--tensor-parallel-size"  # argparse abbreviation
    with pytest.raises(UnknownFlagError, match="ambiguous flag --m"):
        sglang.lookup("--m")


@pytest.mark.parametrize(
    "args",
    [
        ["--model-path", "/m", "--tp", "4", "--mem-fraction-static=0.85", "--dtype", "half"],
        ["--model=/m", "--offset", "-3", "--enable-metrics", "--no-log-requests"],
        ["--model", "/m", "--served-model-name", "--lora-paths", "a", "b", "--api-keys"],
        ["--model", "/m", "--served-model-name", "x", "--api-keys", "k1", "k2", "--tp-size=2"],
    ],
)
def test_argparse_argv_agrees_with_argparse(sglang: FlagSchema, args: list[str]) -> None:
    items = parse_argv(["python", *args], sglang)
    assert [w for it in items[1:] for w in it.words] == args
    ours: dict[str, object] = {}
    for it in items[1:]:
        assert it.flag is not None
        dest = it.flag.canonical[2:].replace("-", "_")
        if not it.flag.takes_value or it.negated:
            ours[dest] = not it.negated
        elif it.flag.variadic:
            ours[dest] = list(it.values)
        else:
            ours[dest] = it.values[0] if it.values else "default"  # the flag's const
    theirs = vars(sglang_like_parser().parse_args(args))
    assert ours == {
        k: v if isinstance(v, bool | list) else str(v) for k, v in theirs.items() if k in ours
    }
