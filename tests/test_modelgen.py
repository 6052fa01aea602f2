"""Generated GGUF models: deterministic files that a real llama-server loads and that always
produce exactly max_tokens tokens (no EOS, no byte tokens)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import httpx
import pytest

from flagtrial.modelgen import generate_model, main

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

StartServer = Callable[..., str]

SERVER_ARGS = ("-t", "1", "-c", "2048", "-np", "2")
MAX_TOKENS = 64
TIMEOUT = httpx.Timeout(60.0)
PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog.",
    "Write a poem about the sea, please!\nLine two: 1 2 3 {} <> ~",
    "x",
]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _post(url: str, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    # One fresh connection per request: no keep-alive reuse races with the server.
    resp = httpx.post(f"{url}{endpoint}", json=body, timeout=TIMEOUT)
    resp.raise_for_status()
    return resp.json()


def _assert_full_completion(url: str, prompt: str, temperature: float) -> None:
    body = {"max_tokens": MAX_TOKENS, "temperature": temperature, "stream": False}
    cmpl = _post(url, "/v1/completions", {"prompt": prompt, **body})
    chat = _post(
        url, "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]} | body
    )
    for resp, text in (
        (cmpl, cmpl["choices"][0]["text"]),
        (chat, chat["choices"][0]["message"]["content"]),
    ):
        assert resp["usage"]["completion_tokens"] == MAX_TOKENS
        assert resp["choices"][0]["finish_reason"] == "length"
        assert text
        assert "<0x" not in text


def _stream(url: str, endpoint: str, body: dict[str, Any]) -> tuple[int, int]:
    """Return (content chunks, usage.completion_tokens) of one SSE response."""
    body = body | {"stream": True, "stream_options": {"include_usage": True}}
    chunks, usage_tokens = 0, -1
    with httpx.stream("POST", f"{url}{endpoint}", json=body, timeout=TIMEOUT) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line.removeprefix("data: "))
            if event.get("usage"):
                usage_tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices") or []:
                piece = choice["text"] if "text" in choice else choice["delta"].get("content")
                if piece:
                    assert "<0x" not in piece
                    chunks += 1
    return chunks, usage_tokens


def test_same_seed_same_file_other_seed_differs(tmp_path: Path, tiny_model: Path) -> None:
    again = generate_model(tmp_path / "again.gguf", size="tiny", seed=1)
    other = generate_model(tmp_path / "other.gguf", size="tiny", seed=2)
    assert _sha256(again) == _sha256(tiny_model)
    assert _sha256(other) != _sha256(tiny_model)


def test_small_model_is_deterministic(tmp_path: Path, small_model: Path) -> None:
    again = generate_model(tmp_path / "small.gguf", size="small", seed=1)
    assert _sha256(again) == _sha256(small_model)
    assert 60e6 < again.stat().st_size < 80e6


def test_existing_file_kept_until_size_or_seed_changes(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    generate_model(path, size="tiny", seed=5)
    inode = path.stat().st_ino
    generate_model(path, size="tiny", seed=5)
    assert path.stat().st_ino == inode  # not rewritten
    first = _sha256(path)
    generate_model(path, size="tiny", seed=6)
    assert path.stat().st_ino != inode
    assert _sha256(path) != first
    assert list(tmp_path.iterdir()) == [path]  # no temp files left behind


def test_vocab_layout(tiny_model: Path) -> None:
    reader = gguf.GGUFReader(tiny_model)
    tokens = reader.get_field("tokenizer.ggml.tokens").contents()
    types = reader.get_field("tokenizer.ggml.token_type").contents()
    assert len(tokens) == len(set(tokens)) == 512
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert tokens[3] == "<0x00>" and tokens[258] == "<0xFF>"
    assert types[:3] == [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    assert set(types[3:259]) == {gguf.TokenType.BYTE}
    assert set(types[259:]) == {gguf.TokenType.NORMAL}
    assert reader.get_field("general.name").contents() == "flagtrial-tiny-seed1"


def test_cli_writes_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.gguf"
    main([str(out), "--size", "tiny", "--seed", "3"])
    assert str(out) in capsys.readouterr().out
    assert _sha256(out) == _sha256(generate_model(tmp_path / "ref.gguf", size="tiny", seed=3))


def test_unknown_size_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model size"):
        generate_model(tmp_path / "x.gguf", size="huge")  # type: ignore[arg-type]


def test_server_loads_tiny_and_reports_props(
    run_llama_server: StartServer, tiny_model: Path
) -> None:
    url = run_llama_server(tiny_model, *SERVER_ARGS)
    props = httpx.get(f"{url}/props", timeout=TIMEOUT).json()
    assert props["total_slots"] == 2
    assert props["model_path"] == str(tiny_model)
    assert props["default_generation_settings"]["n_ctx"] == 1024
    assert props["bos_token"] == "<s>" and props["eos_token"] == "</s>"
    assert "<|im_start|>" in props["chat_template"]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tiny_always_yields_max_tokens(
    run_llama_server: StartServer, tiny_model: Path, temperature: float
) -> None:
    url = run_llama_server(tiny_model, *SERVER_ARGS)
    for prompt in PROMPTS:
        _assert_full_completion(url, prompt, temperature)


def test_tiny_streaming_yields_max_tokens(run_llama_server: StartServer, tiny_model: Path) -> None:
    url = run_llama_server(tiny_model, *SERVER_ARGS)
    body = {"max_tokens": MAX_TOKENS, "temperature": 1.0}
    assert _stream(url, "/v1/completions", {"prompt": "Once upon a time"} | body) == (
        MAX_TOKENS,
        MAX_TOKENS,
    )
    chat = {"messages": [{"role": "user", "content": "hi"}]} | body
    assert _stream(url, "/v1/chat/completions", chat) == (MAX_TOKENS, MAX_TOKENS)


def test_small_always_yields_max_tokens(run_llama_server: StartServer, small_model: Path) -> None:
    url = run_llama_server(small_model, *SERVER_ARGS)
    assert httpx.get(f"{url}/props", timeout=TIMEOUT).json()["model_ftype"] == "F16"
    for temperature in (0.0, 1.0):
        _assert_full_completion(url, PROMPTS[1], temperature)
