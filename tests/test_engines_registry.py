"""Engine adapters own their knowledge: the registry holds nothing an adapter could say."""

from __future__ import annotations

import pytest

from flagtrial.engines import ENGINES, GATED, detect_engine
from flagtrial.gates.preflight import tensor_parallel

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine


@pytest.mark.parametrize(
    ("argv", "engine"),
    [
        (["/opt/llama/llama-server", "-m", "m.gguf"], "llamacpp"),
        (["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "m"], "sglang"),
        (["/venv/bin/vllm", "serve", "m"], "vllm"),
        (["python", "-m", "vllm.entrypoints.openai.api_server"], "vllm"),
        (["python", "-m", "flagtrial.standin.vllm"], "vllm"),
        (["/usr/bin/nginx"], None),
    ],
)
def test_each_adapter_recognises_its_own_program(argv: list[str], engine: str | None) -> None:
    assert detect_engine(argv) == engine


def test_defaults_and_tensor_parallel_flags_come_from_the_adapter() -> None:
    assert {n: e.default_port for n, e in ENGINES.items()} == {
        "llamacpp": 8080, "sglang": 30000, "vllm": 8000,
    }  # fmt: skip
    assert GATED == ("sglang", "vllm")
    assert tensor_parallel(["vllm", "serve", "m", "-tp", "4"], "vllm") == 4
    sglang = ["python", "-m", "sglang.launch_server", "--tp-size", "2"]
    assert tensor_parallel(sglang, "sglang") == 2
    # a flag of the other engine is not this engine's
    assert tensor_parallel(["vllm", "serve", "m", "--tp-size", "2"], "vllm") == 1
