"""A small HTTP/1.1 server on asyncio streams: JSON answers and chunked SSE streams.

Enough for the endpoints the engines serve and flagtrial reads (keep-alive, Content-Length
bodies, `Transfer-Encoding: chunked` for streams). Binds to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 503: "Service Unavailable"}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"{}")


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    stream: AsyncIterator[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)


def json_response(data: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(data).encode())


def text_response(text: str, status: int = 200, content_type: str = "text/plain") -> Response:
    return Response(status, text.encode(), content_type)


Handler = Callable[[Request], Awaitable[Response]]


async def _read_request(reader: asyncio.StreamReader) -> tuple[Request, bool] | None:
    line = await reader.readline()
    if not line:
        return None
    method, target, version = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (raw := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
    url = urlsplit(target)
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    keep = headers.get("connection", "").lower() != "close" and "1.1" in version
    return Request(method.upper(), url.path, query, body), keep


async def _write(writer: asyncio.StreamWriter, response: Response) -> None:
    head = [f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Status')}"]
    head.append(f"Content-Type: {response.content_type}")
    head += [f"{k}: {v}" for k, v in response.headers.items()]
    if response.stream is None:
        head.append(f"Content-Length: {len(response.body)}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + response.body)
        await writer.drain()
        return
    head.append("Transfer-Encoding: chunked")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    async for chunk in response.stream:
        writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def serve(port: int, handler: Handler) -> asyncio.Server:
    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while parsed := await _read_request(reader):
                request, keep = parsed
                await _write(writer, await handler(request))
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    return await asyncio.start_server(connection, "127.0.0.1", port)
