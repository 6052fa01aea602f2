"""Streaming client for OpenAI-compatible servers: one request in, one `RequestRecord` out."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import httpx

from flagtrial.load.workload import Workload

# Plain English words: tokenizers of every real model split them into few tokens each.
_WORD_TEXT = """
    the of and to in is was for on that with as by at from his her they this had not are but
    one all were when we there can an your which their said if do will each about how up out
    them then she many some so these would other into has more two like him see time could no
    make than first been its who now people my made over did down only way find use may water
    long little very after words called just where most know get through back much before go
    good new write our used me man too any day same right look think also around another came
    come work three word must because does part even place well such here take why things help
    put years different away again off went old number great tell men say small every found
    still between name should home big give air line set own under read last never us left end
    along while might next sound below saw something thought both few those always looked show
    large often together asked house world going want school important until form food keep
    children feet land side without boy once animals life enough took sometimes four head above
    kind began almost live page got earth need far hand high year mother light parts country
    father let night following picture being study second eyes soon times story boys since white
    days paper hard near sentence better best across during today others however sure means
    knew try told young miles sun ways thing whole hear example heard several change answer room
    sea against top turned learn point city play toward five using himself usually
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


def build_prompt(index: int, n_words: int, seed: int = 0) -> str:
    """The prompt of request `index`: `n_words` words, deterministic in (seed, index).

    The first word is the request index and the rest are drawn from an RNG seeded by
    (seed, index), so no two prompts share a prefix a server's prompt cache could reuse.
    Give each run its own seed when one server is measured more than once.
    """
    rng = random.Random(f"{seed}:{index}")
    return " ".join([str(index), *rng.choices(WORDS, k=n_words - 1)])


@dataclass
class RequestRecord:
    """What happened to one request; times are `time.perf_counter()` seconds."""

    ok: bool
    error: str | None
    status: int | None  # HTTP status; None when no response arrived
    start: float
    end: float
    ttft_s: float | None  # to the first chunk carrying non-empty text
    itl_s: list[float] = field(default_factory=list)  # gaps between successive text chunks
    output_tokens: int = 0  # usage.completion_tokens, else the number of text chunks
    prompt_tokens: int | None = None


class _RequestError(Exception):
    """A request failed; the message is the short error recorded for it."""


def request_body(workload: Workload, prompt: str) -> dict[str, Any]:
    """The JSON body for one streamed request of `workload` with `prompt`."""
    body: dict[str, Any] = {
        "max_tokens": workload.max_tokens,
        "temperature": workload.temperature,
        "ignore_eos": workload.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if workload.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if workload.model is not None:
        body["model"] = workload.model
    return body


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


def _refused(exc: BaseException) -> bool:
    """Whether a connect error comes from a refused connection (anyio wraps the OS error)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


async def send_request(
    client: httpx.AsyncClient,
    workload: Workload,
    prompt: str,
    *,
    run_deadline: float | None = None,
) -> RequestRecord:
    """Stream one request and record it; never raises for server or network failures.

    `run_deadline` (event-loop time) is the run's wall bound: a request still in flight then is
    cancelled and recorded as "cancelled at run bound", distinct from its own "timeout".
    """
    loop = asyncio.get_running_loop()
    request_deadline = loop.time() + workload.request_timeout_s
    deadline = request_deadline if run_deadline is None else min(run_deadline, request_deadline)
    run_bound_first = deadline != request_deadline

    start = time.perf_counter()
    status: int | None = None
    seen = _Stream()
    error: str | None = None
    try:
        async with asyncio.timeout_at(deadline):
            async with client.stream(
                "POST", endpoint(workload), json=request_body(workload, prompt)
            ) as response:
                status = response.status_code
                await _check_status(response)
                await _read_stream(response, seen)
    except _RequestError as exc:
        error = str(exc)
    except TimeoutError:
        error = "cancelled at run bound" if run_bound_first else "timeout"
    except httpx.TimeoutException:
        error = "timeout"
    except httpx.ConnectError as exc:
        error = "connection refused" if _refused(exc) else "connect error"
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
        # The server closed or reset the connection mid-request, e.g. it crashed.
        error = "connection lost"
    except httpx.HTTPError as exc:
        error = type(exc).__name__
    end = time.perf_counter()

    text_times = seen.text_times
    return RequestRecord(
        ok=error is None,
        error=error,
        status=status,
        start=start,
        end=end,
        ttft_s=text_times[0] - start if text_times else None,
        itl_s=[b - a for a, b in pairwise(text_times)],
        output_tokens=int(seen.usage.get("completion_tokens", len(text_times))),
        prompt_tokens=seen.usage.get("prompt_tokens"),
    )


@dataclass
class _Stream:
    """What a response's stream carried so far: kept when the stream breaks off."""

    text_times: list[float] = field(default_factory=list)  # when each text chunk arrived
    usage: dict[str, Any] = field(default_factory=dict)


async def _check_status(response: httpx.Response) -> None:
    """A response other than 200 is a failed request, named by its error body."""
    status = response.status_code
    if status == 200:
        return
    body = await response.aread()
    try:
        name = _error_name(json.loads(body))
    except ValueError:
        name = body.decode(errors="replace").strip()[:120]
    raise _RequestError(f"HTTP {status}: {name}" if name else f"HTTP {status}")


async def _read_stream(response: httpx.Response, seen: _Stream) -> None:
    """Read the server-sent events up to `[DONE]` into `seen`."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, comments, `event:` lines
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise _RequestError("bad stream data") from None
        if "error" in chunk:
            raise _RequestError(f"stream error: {_error_name(chunk)}")
        if _chunk_text(chunk):
            seen.text_times.append(time.perf_counter())
        if chunk.get("usage"):
            seen.usage = chunk["usage"]
    raise _RequestError("stream ended early")
