"""HTTP/1.1 keep-alive connections for the load client: asyncio protocols parsed by httptools
(llhttp, the parser of Node.js and uvicorn), the body handed on as the socket gives it.

A response's bytes reach its `Receiver` inside `data_received`, with the time of that read:
no queue, task or per-chunk object between the socket and the timestamps. A pooled
connection the server has closed is never reused; one that the server closes after the
request was written but before any response byte is reported as `StaleConnection`, so the
caller can send again on a fresh connection (the server cannot have acted on it: seen with
llama-server, which closes idle keep-alive connections).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools


class StaleConnection(Exception):
    """A reused connection closed before any byte of the response came back."""


class BadResponse(Exception):
    """The server's bytes are not an HTTP/1.1 response."""


class Receiver(Protocol):
    """What one request does with its response, called from the connection's protocol."""

    def status(self, code: int) -> None: ...
    def body(self, data: bytes, at: float) -> None: ...
    def complete(self) -> None: ...
    def lost(self, exc: BaseException) -> None: ...


class Connection(asyncio.Protocol):
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.receiver: Receiver | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.reused = False
        self.answered = False  # a byte of the current response came back
        self.open = True
        self.read_at = 0.0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without deriving from it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.read_at = time.perf_counter()
        if self.parser is None:  # bytes while idle: the connection is out of step
            self.close()
            return
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(str(exc)))

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self.pool.forget(self)
        if self.receiver is not None:
            stale = self.reused and not self.answered
            self._fail(StaleConnection() if stale else (exc or ConnectionResetError("closed")))

    # httptools callbacks
    def on_headers_complete(self) -> None:
        if self.receiver is not None and self.parser is not None:
            self.receiver.status(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        if self.receiver is not None:
            self.receiver.body(body, self.read_at)

    def on_message_complete(self) -> None:
        receiver, parser = self.receiver, self.parser
        self.receiver, self.parser = None, None
        if parser is not None and parser.should_keep_alive():
            self.pool.release(self)
        else:
            self.close()
        if receiver is not None:
            receiver.complete()

    def send(self, request: bytes, receiver: Receiver) -> None:
        assert self.transport is not None
        self.receiver = receiver
        self.parser = httptools.HttpResponseParser(self)
        self.answered = False
        self.transport.write(request)

    def close(self) -> None:
        """Drop the connection (also the way to abandon a request in flight on it)."""
        self.receiver, self.parser = None, None
        self.open = False
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: BaseException) -> None:
        receiver = self.receiver
        self.close()
        if receiver is not None:
            receiver.lost(exc)


class Pool:
    """Keep-alive connections to one server; a connection serves one request at a time."""

    def __init__(self, base_url: str) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if url.scheme == "https" else None
        self.prefix = url.path.rstrip("/")
        default_port = (url.scheme == "https" and self.port == 443) or self.port == 80
        self.authority = (url.netloc.rpartition("@")[2] if not default_port else self.host).encode()
        self.opened = 0  # connections made so far
        self._idle: list[Connection] = []
        self._all: set[Connection] = set()

    def post(self, path: str, body: bytes) -> bytes:
        """The request's bytes: built once, written as one piece."""
        head = (
            b"POST " + (self.prefix + path).encode() + b" HTTP/1.1\r\nHost: " + self.authority
            + b"\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
            + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        )  # fmt: skip
        return head + body

    async def connection(self) -> Connection:
        """An idle open connection, else a new one (raises OSError when connecting fails)."""
        while self._idle:
            conn = self._idle.pop()
            if conn.open:
                conn.reused = True
                return conn
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            lambda: Connection(self), self.host, self.port, ssl=self.ssl
        )
        self.opened += 1
        self._all.add(conn)
        return conn

    def release(self, conn: Connection) -> None:
        self._idle.append(conn)

    def forget(self, conn: Connection) -> None:
        if conn in self._idle:
            self._idle.remove(conn)
        self._all.discard(conn)

    def close(self) -> None:
        for conn in list(self._all):
            conn.close()
