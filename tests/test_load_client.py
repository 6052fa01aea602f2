"""The streaming client against servers that misbehave in the ways real ones do: a small HTTP
server of our own on loopback writes each response byte by byte as a test scripts it, and
nginx (Debian's) serves pre-rendered streams. Every failure is counted with its kind."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import pytest

from flagtrial.hygiene import CLIENT_BUSY_MAX_SHARE, client_bound
from flagtrial.load.client import RequestRecord, send_request
from flagtrial.load.http import Pool
from flagtrial.load.prompts import Request
from flagtrial.load.runner import RunResult, run_level
from flagtrial.load.sse import SseSplitter
from flagtrial.load.workload import Workload
from harness.scripted import (
    HEAD,
    STREAM,
    USAGE,
    Script,
    chunked,
    event,
    keep_alive,
    read_request,
    text,
)

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks" / "load"))
import ceiling  # the benchmark's nginx server and stream renderer

WORKLOAD = Workload(max_tokens=3, prompt_words=4, request_timeout_s=5.0)
PROMPT = Request("a prompt", None, WORKLOAD.max_tokens)


async def serve_and_send(
    script: Script, n: int = 1, workload: Workload = WORKLOAD
) -> list[RequestRecord]:
    """Start `script` as a loopback server and send it `n` requests, one after another."""
    server = await asyncio.start_server(script, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = Pool(f"http://127.0.0.1:{port}")
    try:
        return [await send_request(pool, workload, PROMPT) for _ in range(n)]
    finally:
        pool.close()
        server.close()


def run(script: Script, n: int = 1, workload: Workload = WORKLOAD) -> list[RequestRecord]:
    return asyncio.run(serve_and_send(script, n, workload))


def test_events_split_anywhere_are_read_whole() -> None:
    # Every byte its own write, inside chunked framing: the client sees the same 3 tokens.
    body = chunked(STREAM) + chunked(b"")
    (record,) = run(keep_alive(lambda: [HEAD, *(body[i : i + 1] for i in range(len(body)))]))
    assert (record.ok, record.output_tokens, len(record.itl_s)) == (True, 3, 2)
    assert record.ttft_s is not None and record.ttft_s > 0


def test_comments_event_lines_and_crlf_are_not_tokens() -> None:
    first = b": keep-alive\r\n\r\nevent: message\r\n" + text("a").replace(b"\n", b"\r\n")
    crlf = first + b":ping\n\n" + text("b") + text("") + text("c") + USAGE + event("[DONE]")
    (record,) = run(keep_alive(lambda: [HEAD, chunked(crlf), chunked(b"")]))
    assert (record.ok, record.output_tokens, len(record.itl_s)) == (True, 3, 2)


def test_a_cr_split_from_its_lf_is_one_line_end() -> None:
    splitter = SseSplitter()
    assert splitter.feed(b"data: 1\r") == []
    assert splitter.feed(b"\n\r") == []  # the CR of CRLF came with the next piece
    assert splitter.feed(b"\ndata: 2\n\n") == [b"1", b"2"]


def test_a_usage_chunk_with_empty_choices_gives_the_token_count() -> None:
    # Two text chunks, but the usage says 3 (one chunk carried two tokens): usage wins.
    body = text("a") + text("bc") + USAGE + event("[DONE]")
    (record,) = run(keep_alive(lambda: [HEAD, chunked(body), chunked(b"")]))
    assert (record.ok, record.output_tokens, record.prompt_tokens, len(record.itl_s)) == (
        True,
        3,
        4,
        1,
    )


def test_reasoning_content_counts_as_output() -> None:
    delta = [
        {"choices": [{"index": 0, "delta": {key: "x"}}]} for key in ("reasoning_content", "content")
    ]
    body = event(delta[0]) + event(delta[1]) + event("[DONE]")
    chat = WORKLOAD.model_copy(update={"api": "chat"})
    (record,) = run(keep_alive(lambda: [HEAD, chunked(body), chunked(b"")]), workload=chat)
    assert (record.ok, record.output_tokens) == (True, 2)


def test_a_stream_without_done_ended_early() -> None:
    body = text("a") + text("b")
    (record,) = run(keep_alive(lambda: [HEAD, chunked(body), chunked(b"")]))
    assert (record.ok, record.error) == (False, "stream ended early")


def test_a_body_closed_by_the_connection_after_done_is_whole() -> None:
    # HTTP/1.0 style: no length, no chunks; the body ends when the server closes.
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    (record,) = run(keep_alive(lambda: [head, STREAM], close_after=True))
    assert (record.ok, record.output_tokens) == (True, 3)


def test_the_server_closing_mid_stream_is_a_lost_connection() -> None:
    (record,) = run(keep_alive(lambda: [HEAD, chunked(text("a"))], close_after=True))
    assert (record.ok, record.error, record.status) == (False, "connection lost", 200)


def test_http_errors_are_named_by_their_type() -> None:
    body = json.dumps({"error": {"type": "overloaded", "message": "try later"}}).encode()
    error = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    ok = [HEAD, chunked(STREAM), chunked(b"")]
    answers = iter([ok, [error], ok])
    records = run(keep_alive(lambda: next(answers)), n=3)
    assert [(r.ok, r.error, r.status) for r in records] == [
        (True, None, 200), (False, "HTTP 503: overloaded", 503), (True, None, 200)
    ]  # fmt: skip


def test_an_error_inside_the_stream_is_counted() -> None:
    body = text("a") + event({"error": {"type": "InternalServerError", "message": "boom"}})
    (record,) = run(keep_alive(lambda: [HEAD, chunked(body), chunked(b"")]))
    assert (record.ok, record.error) == (False, "stream error: InternalServerError")


def test_bad_stream_data_is_counted() -> None:
    (record,) = run(keep_alive(lambda: [HEAD, chunked(b"data: {not json\n\n"), chunked(b"")]))
    assert (record.ok, record.error) == (False, "bad stream data")


def test_a_stalled_stream_hits_the_request_timeout() -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(HEAD + chunked(text("a")))
        await asyncio.sleep(30)

    short = WORKLOAD.model_copy(update={"request_timeout_s": 0.5})
    (record,) = run(stall, workload=short)
    assert (record.ok, record.error) == (False, "timeout")


def test_a_keep_alive_connection_the_server_closed_is_never_an_error() -> None:
    # As llama-server does: no `Connection: close`, yet it closes after each response. The
    # next request finds its pooled connection closed (or closing) and goes out on a new one.
    records = run(keep_alive(lambda: [HEAD, chunked(STREAM), chunked(b"")], close_after=True), n=5)
    assert [(r.ok, r.error) for r in records] == [(True, None)] * 5


def test_a_connection_closed_after_the_request_was_written_is_retried_once() -> None:
    # The server reads the second request on a connection, then closes without a byte: the
    # client cannot tell it from an idle close, and sends it again on a fresh connection.
    served: list[int] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader) is not None:
            served.append(1)
            if len(served) == 2:
                break
            writer.write(HEAD + chunked(STREAM) + chunked(b""))
            await writer.drain()
        writer.close()

    records = run(script, n=2)
    assert [(r.ok, r.error) for r in records] == [(True, None)] * 2
    assert len(served) == 3


def test_a_refused_connection_is_counted_as_refused() -> None:
    async def closed_port() -> int:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = int(server.sockets[0].getsockname()[1])
        server.close()
        await server.wait_closed()
        return port

    async def send() -> RequestRecord:
        pool = Pool(f"http://127.0.0.1:{await closed_port()}")
        return await send_request(pool, WORKLOAD, PROMPT)

    record = asyncio.run(send())
    assert (record.ok, record.error, record.status) == (False, "connection refused", None)


@pytest.fixture(scope="module")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> object:
    assert shutil.which("nginx"), "nginx is missing (scripts/install-system-deps.sh installs it)"
    root = tmp_path_factory.mktemp("nginx")
    server, port = ceiling.start_nginx(root, [16, 256])
    yield port
    server.terminate()
    server.wait()


def test_nginx_streams_count_exactly_over_kept_alive_connections(nginx: int) -> None:
    w = Workload(max_tokens=256, prompt_words=8)
    result = asyncio.run(
        run_level(f"http://127.0.0.1:{nginx}/s256", w, 8, n_requests=64, warmup=False)
    )
    assert (result.summary.n_ok, result.summary.output_tokens) == (64, 64 * 256)
    assert all(len(r.itl_s) == 255 for r in result.records)

    async def eight_workers(pool: Pool) -> list[RequestRecord]:
        async def worker() -> list[RequestRecord]:
            return [
                await send_request(pool, w, Request("a prompt", None, w.max_tokens))
                for _ in range(8)
            ]

        return [r for rs in await asyncio.gather(*(worker() for _ in range(8))) for r in rs]

    pool = Pool(f"http://127.0.0.1:{nginx}/s256")
    records = asyncio.run(eight_workers(pool))
    # 64 requests on the 8 connections the workers opened: nginx keeps them alive.
    assert (sum(r.ok for r in records), pool.opened) == (64, 8)


def test_a_run_the_client_could_not_keep_up_with_is_set_aside(nginx: int) -> None:
    # nginx answers from memory: the one event loop is the bottleneck the whole run.
    w = Workload(max_tokens=16, prompt_words=8)
    flood = asyncio.run(
        run_level(f"http://127.0.0.1:{nginx}/s16", w, 64, n_requests=3000, warmup=False)
    )
    why = client_bound(flood.summary)
    assert why is not None and why.startswith("client-bound: the load client was busy")
    assert flood.summary.client_lag_p99_s is not None


def test_a_run_paced_by_the_server_is_not_client_bound() -> None:
    # A token every 20 ms: the client waits on the server nearly all the time.
    paced = [HEAD, *(chunked(text("a")) for _ in range(3)), chunked(USAGE + event("[DONE]"))]

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader) is not None:
            for piece in [*paced, chunked(b"")]:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.02)
        writer.close()

    async def measure() -> RunResult:
        server = await asyncio.start_server(script, "127.0.0.1", 0)
        try:
            url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            return await run_level(url, WORKLOAD, 2, n_requests=8, warmup=False)
        finally:
            server.close()

    result = asyncio.run(measure())
    assert result.summary.n_ok == 8
    assert client_bound(result.summary) is None
    assert 0 < result.summary.client_busy_share < CLIENT_BUSY_MAX_SHARE
