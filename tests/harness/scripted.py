"""A streaming server scripted byte by byte on loopback: the pieces of an OpenAI SSE answer
(chunked framing, events, a usage chunk) and a server that writes them as a test says."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def event(payload: dict[str, object] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


def text(token: str) -> bytes:
    return event({"choices": [{"index": 0, "text": token}]})


USAGE = event({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}})
STREAM = text("a") + text("b") + text("c") + USAGE + event("[DONE]")


def chunked(body: bytes) -> bytes:
    return f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b"0\r\n\r\n"


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """Read one request (headers and its Content-Length body): its body, or None at the end
    of the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return await reader.readexactly(length)


def keep_alive(body_writes: Callable[[], list[bytes]], *, close_after: bool = False) -> Script:
    """A server answering each request on a connection with the given writes (drained one
    by one, so the client reads them as separate pieces)."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader) is not None:
            for piece in body_writes():
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.001)
            if close_after:
                break
        writer.close()

    return script
