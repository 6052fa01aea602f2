"""An OpenAI-style streaming server with a known schedule: after the whole request is read,
the first token after T ms, then one every I ms, each token its own chunk and its own
write (TCP_NODELAY), `max_tokens` of them, then the usage chunk and [DONE].

    python benchmarks/load/scheduled.py PORT TTFT_MS ITL_MS

The schedule is what the server intends; `wire_truth` reads what actually crossed loopback
from a tcpdump capture, which is the truth the clients are held to.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunk(body: bytes) -> bytes:
    return f"{len(body):x}\r\n".encode() + body + b"\r\n"


def _event(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


async def _serve(
    ttft_s: float, itl_s: float, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    loop = asyncio.get_running_loop()
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            break
        found = re.search(rb"(?i)content-length:\s*(\d+)", head)
        if not found:  # a GET (a client's /v1/models or /server_info): nothing here
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            continue
        body = json.loads(await reader.readexactly(int(found.group(1))))
        tokens = int(body.get("max_tokens", 16))
        start = loop.time()
        writer.write(HEAD)
        for i in range(tokens):
            await asyncio.sleep(max(0.0, start + ttft_s + i * itl_s - loop.time()))
            # text for completions parsers, delta for chat ones, object for those that check it
            token = f" w{i % 10}"
            choice = {"index": 0, "text": token, "delta": {"content": token}}
            writer.write(_chunk(_event({"object": "text_completion", "choices": [choice]})))
        tail = _event({"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": tokens}})
        writer.write(_chunk(tail + b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
    writer.close()


async def _main(port: int, ttft_s: float, itl_s: float) -> None:
    server = await asyncio.start_server(
        lambda r, w: _serve(ttft_s, itl_s, r, w), "127.0.0.1", port, backlog=4096
    )
    async with server:
        await server.serve_forever()


@dataclass
class WireTruth:
    """Per request, as captured on loopback: the request's last byte to the first token's
    packet, and the gaps between token packets."""

    ttft_s: list[float]
    itl_s: list[float]


_LINE = re.compile(r"^(\d+\.\d+) IP 127\.0\.0\.1\.(\d+) > 127\.0\.0\.1\.(\d+):.* length (\d+)")


def wire_truth(pcap: Path, server_port: int) -> WireTruth:
    """Requests and token packets per client connection from `tcpdump -r` (with -A, so a
    token packet is told from the response head and the tail by its `data:` text)."""
    out = subprocess.run(
        ["tcpdump", "-r", str(pcap), "-tt", "-n", "-A", "tcp"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ttft: list[float] = []
    itl: list[float] = []
    requested: dict[int, float] = {}
    last_token: dict[int, float] = {}
    packet: tuple[float, int, bool, int] | None = None  # time, client port, to server, length

    def close(text: str) -> None:
        if packet is None or packet[3] == 0:
            return
        at, client, to_server, _ = packet
        if to_server:
            requested[client] = at
            last_token.pop(client, None)
        elif '"text"' in text and client in requested:
            if client in last_token:
                itl.append(at - last_token[client])
            else:
                ttft.append(at - requested[client])
            last_token[client] = at

    text: list[str] = []
    for line in out.splitlines():
        m = _LINE.match(line)
        if m:
            close("".join(text))
            at, src, dst, length = float(m[1]), int(m[2]), int(m[3]), int(m[4])
            to_server = dst == server_port
            packet = (at, src if to_server else dst, to_server, length)
            text = []
        else:
            text.append(line)
    close("".join(text))
    return WireTruth(ttft, itl)


if __name__ == "__main__":
    asyncio.run(_main(int(sys.argv[1]), float(sys.argv[2]) / 1000, float(sys.argv[3]) / 1000))
