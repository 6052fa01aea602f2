"""Streamed OpenAI-compatible completions: SSE `data:` chunks shaped like each engine's.

Every request produces exactly `max_tokens` tokens (the load always sends `ignore_eos`), one
chunk per token after a fixed per-token delay, then (with `stream_options.include_usage`)
a usage chunk and `data: [DONE]`. At most `slots` requests generate at once, the others
wait their turn: the server's concurrent-request capacity is real.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from flagtrial.standin.http import Request, Response, json_response


@dataclass(frozen=True)
class ChunkShape:
    """The extra keys an engine puts in a stream choice, and what its chunks always carry."""

    owner: str  # `owned_by` / id prefix
    choice_extra: dict[str, Any]
    chunk_extra: dict[str, Any]


# sglang srt/entrypoints/openai/protocol.py:546 CompletionResponseStreamChoice (matched_stop),
# :568 CompletionStreamResponse (usage: null on every chunk), :1369 the chat choice.
SGLANG = ChunkShape("sglang", {"logprobs": None, "matched_stop": None}, {"usage": None})
# vllm entrypoints/openai/completion/protocol.py:725-746 (stop_reason), chat_completion/
# protocol.py:168-184.
VLLM = ChunkShape("vllm", {"logprobs": None, "stop_reason": None}, {})


class Generator:
    def __init__(self, shape: ChunkShape, model: str, slots: int, token_delay_s: float):
        self.shape = shape
        self.model = model
        self.slots = asyncio.Semaphore(max(slots, 1))
        self.delay = token_delay_s
        self.running = 0
        self.waiting = 0

    async def handle(self, request: Request) -> Response:
        try:
            body = request.json()
        except ValueError:
            return json_response({"error": {"message": "bad JSON", "type": "BadRequest"}}, 400)
        chat = request.path.endswith("/chat/completions")
        tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        prompt = body.get("prompt") if not chat else json.dumps(body.get("messages"))
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        stream = self._events(chat, tokens, len(str(prompt or "").split()), usage)
        if not body.get("stream"):
            return json_response({"error": {"message": "stand-in streams only"}}, 400)
        return Response(200, content_type="text/event-stream", stream=stream)

    def _chunk(self, rid: str, chat: bool, text: str, finish: str | None) -> dict[str, Any]:
        if chat:
            choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish}
        return {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{**choice, **self.shape.choice_extra}],
            **self.shape.chunk_extra,
        }

    async def _events(
        self, chat: bool, tokens: int, prompt_tokens: int, usage: bool
    ) -> AsyncIterator[bytes]:
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.waiting += 1
        async with self.slots:
            self.waiting -= 1
            self.running += 1
            try:
                for i in range(tokens):
                    await asyncio.sleep(self.delay)
                    finish = "length" if i == tokens - 1 else None
                    chunk = self._chunk(rid, chat, f" t{i}", finish)
                    yield f"data: {json.dumps(chunk)}\n\n".encode()
            finally:
                self.running -= 1
        if usage:
            last = self._chunk(rid, chat, "", None)
            last["choices"] = []
            last["usage"] = {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + tokens,
                "completion_tokens": tokens,
            }
            yield f"data: {json.dumps(last)}\n\n".encode()
        yield b"data: [DONE]\n\n"
