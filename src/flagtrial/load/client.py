"""Streaming client for OpenAI-compatible servers: one request in, one `RequestRecord` out."""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from flagtrial.load.http import BadResponse, Connection, Pool, StaleConnection
from flagtrial.load.prompts import Request
from flagtrial.load.sse import SseSplitter
from flagtrial.load.workload import Workload


@dataclass
class RequestRecord:
    """What happened to one request; times are `time.perf_counter()` seconds."""

    ok: bool
    error: str | None
    status: int | None  # HTTP status; None when no response arrived
    start: float
    end: float
    ttft_s: float | None  # from writing the request to the first chunk with text in it
    itl_s: list[float] = field(default_factory=list)  # gaps between successive text chunks
    output_tokens: int = 0  # usage.completion_tokens, else the number of text chunks
    prompt_tokens: int | None = None
    max_tokens: int | None = None  # what the request asked for
    cached_tokens: int | None = None  # prompt tokens the server served from its cache
    answer: str | None = None  # the streamed answer's text, kept only for a chat's next turn


class _RequestError(Exception):
    """A request failed; the message is the short error recorded for it."""


def request_body(workload: Workload, request: Request) -> dict[str, Any]:
    """The JSON body for one streamed request of `workload`."""
    body: dict[str, Any] = {
        "max_tokens": request.max_tokens,
        "temperature": workload.temperature,
        "ignore_eos": workload.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if workload.api == "chat":
        body["messages"] = request.messages or [{"role": "user", "content": request.prompt}]
    else:
        body["prompt"] = request.prompt
    if workload.model is not None:
        body["model"] = workload.model
    return body


def cached_tokens(chunk: dict[str, Any]) -> int | None:
    """Prompt tokens served from the server's cache, where its stream says: vLLM and SGLang in
    usage.prompt_tokens_details, llama-server in its final chunk's timings."""
    details = (chunk.get("usage") or {}).get("prompt_tokens_details") or {}
    if isinstance(details.get("cached_tokens"), int):
        return int(details["cached_tokens"])
    timings = chunk.get("timings") or {}
    return int(timings["cache_n"]) if isinstance(timings.get("cache_n"), int) else None


def endpoint(workload: Workload) -> str:
    return "/v1/chat/completions" if workload.api == "chat" else "/v1/completions"


def _error_name(payload: Any) -> str:
    """Short name of an OpenAI-style error body: its type (stable across requests), else message."""
    err = payload.get("error", payload) if isinstance(payload, dict) else payload
    if isinstance(err, dict):
        name = err.get("type") or err.get("message")
        if name:
            return str(name)[:120]
    return str(err)[:120]


def _answer_text(chunk: dict[str, Any]) -> str:
    """The answer's text in one chat stream chunk, as a chat client sends it back in the next
    turn (reasoning text is not)."""
    choices = chunk.get("choices") or []
    return ((choices[0].get("delta") or {}).get("content") or "") if choices else ""


def _chunk_text(chunk: dict[str, Any]) -> str:
    """Generated text in one stream chunk (reasoning text counts: it is output too)."""
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "text" in choice:
        return choice["text"] or ""
    delta = choice.get("delta") or {}
    return delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or ""


class _Stream:
    """One streamed completion as its bytes arrive (a `load.http.Receiver`): the time of each
    read that carried text, the usage chunk, and how it ended."""

    def __init__(self, loop: asyncio.AbstractEventLoop, keep_answer: bool = False) -> None:
        self.ended: asyncio.Future[None] = loop.create_future()
        self.code: int | None = None
        self.error_body = bytearray()
        self.events = SseSplitter()
        self.text_times = array("d")
        self.usage: dict[str, Any] = {}
        self.done = False  # [DONE] came
        self.sent_at = 0.0
        self.cached: int | None = None
        # only a multi-turn chat keeps the text: no per-token objects otherwise
        self.answer: list[str] | None = [] if keep_answer else None

    def status(self, code: int) -> None:
        self.code = code

    def body(self, data: bytes, at: float) -> None:
        if self.ended.done():  # failed already: the rest is dropped with the connection
            return
        if self.code != 200:
            self.error_body += data
            return
        for payload in self.events.feed(data):
            if self.done:
                return
            if payload == b"[DONE]":
                self.done = True
                continue
            try:
                chunk = orjson.loads(payload)
            except orjson.JSONDecodeError:
                return self._end(_RequestError("bad stream data"))
            if not isinstance(chunk, dict):
                return self._end(_RequestError("bad stream data"))
            if "error" in chunk:
                return self._end(_RequestError(f"stream error: {_error_name(chunk)}"))
            if _chunk_text(chunk):
                self.text_times.append(at)
            if self.answer is not None:
                self.answer.append(_answer_text(chunk))
            if chunk.get("usage"):
                self.usage = chunk["usage"]
            if "usage" in chunk or "timings" in chunk:
                self.cached = cached_tokens(chunk)

    def complete(self) -> None:
        if self.code != 200:
            try:
                name = _error_name(orjson.loads(self.error_body))
            except orjson.JSONDecodeError:
                name = self.error_body.decode(errors="replace").strip()[:120]
            status = f"HTTP {self.code}"
            self._end(_RequestError(f"{status}: {name}" if name else status))
        elif not self.done:
            self._end(_RequestError("stream ended early"))
        else:
            self._end(None)

    def lost(self, exc: BaseException) -> None:
        if isinstance(exc, StaleConnection):
            self._end(exc)
        elif self.done:  # a body delimited by the connection's close
            self._end(None)
        elif isinstance(exc, BadResponse):
            self._end(_RequestError("bad HTTP response"))
        else:
            # The server closed or reset the connection mid-request, e.g. it crashed.
            self._end(_RequestError("connection lost"))

    def _end(self, exc: BaseException | None) -> None:
        if self.ended.done():
            return
        if exc is None:
            self.ended.set_result(None)
        else:
            self.ended.set_exception(exc)


async def _connect(pool: Pool) -> Connection:
    try:
        return await pool.connection()
    except ConnectionRefusedError:
        raise _RequestError("connection refused") from None
    except OSError:
        raise _RequestError("connect error") from None


async def _exchange(pool: Pool, request: bytes, stream_of: Callable[[], _Stream]) -> _Stream:
    """Send `request` and wait for its whole response; again on a fresh connection when a
    pooled one turns out closed before answering (each stale one is dropped, so this ends)."""
    while True:
        conn = await _connect(pool)
        stream = stream_of()
        # TTFT counts from here: a connect, or a retry after a stale connection, is the
        # client's own time, not the server's.
        stream.sent_at = time.perf_counter()
        conn.send(request, stream)
        try:
            await stream.ended
            return stream
        except StaleConnection:
            continue
        finally:
            if conn.receiver is stream:  # abandoned mid-response: the rest is of no use
                conn.close()


async def send_request(
    pool: Pool,
    workload: Workload,
    request: Request,
    *,
    run_deadline: float | None = None,
    keep_answer: bool = False,
) -> RequestRecord:
    """Stream one request and record it; never raises for server or network failures.

    `run_deadline` (event-loop time) is the run's wall bound: a request still in flight then is
    cancelled and recorded as "cancelled at run bound", distinct from its own "timeout".
    `keep_answer`: the record keeps the answer's text (a chat's next turn sends it back).
    """
    loop = asyncio.get_running_loop()
    request_deadline = loop.time() + workload.request_timeout_s
    deadline = request_deadline if run_deadline is None else min(run_deadline, request_deadline)
    run_bound_first = deadline != request_deadline
    wire = pool.post(endpoint(workload), orjson.dumps(request_body(workload, request)))

    start = time.perf_counter()
    streams: list[_Stream] = []

    def stream_of() -> _Stream:
        streams.append(_Stream(loop, keep_answer))
        return streams[-1]

    error: str | None = None
    try:
        async with asyncio.timeout_at(deadline):
            await _exchange(pool, wire, stream_of)
    except _RequestError as exc:
        error = str(exc)
    except TimeoutError:
        error = "cancelled at run bound" if run_bound_first else "timeout"
    end = time.perf_counter()

    stream = streams[-1] if streams else None
    times = np.frombuffer(stream.text_times, dtype=np.float64) if stream else np.empty(0)
    usage = stream.usage if stream else {}
    return RequestRecord(
        ok=error is None,
        error=error,
        status=stream.code if stream else None,
        start=start,
        end=end,
        ttft_s=float(times[0]) - stream.sent_at if stream and len(times) else None,
        itl_s=np.diff(times).tolist(),
        output_tokens=int(usage.get("completion_tokens", len(times))),
        prompt_tokens=usage.get("prompt_tokens"),
        max_tokens=request.max_tokens,
        cached_tokens=stream.cached if stream else None,
        answer="".join(stream.answer) if stream and stream.answer is not None else None,
    )
