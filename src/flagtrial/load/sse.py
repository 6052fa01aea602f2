"""Server-sent events split from raw bytes as they arrive: no lines decoded, no event objects."""

from __future__ import annotations


class SseSplitter:
    """Feed the body's bytes in whatever pieces the socket gives; get each complete event's
    data back (its `data:` lines joined by newlines; comments, `event:` and `id:` lines and
    events without data are dropped). Line ends may be LF, CRLF or CR, split anywhere."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._pending + data if self._pending else data
        if b"\r" in buffer:
            # A CR at the very end may be the first half of a CRLF: keep it for the next piece.
            held = buffer.endswith(b"\r")
            body = buffer[:-1] if held else buffer
            buffer = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + (b"\r" if held else b"")
        *events, self._pending = buffer.split(b"\n\n")
        return [payload for event in events if (payload := _data(event)) is not None]


def _data(event: bytes) -> bytes | None:
    # The common case, one `data: ...` line, without splitting lines.
    if event.startswith(b"data: ") and b"\n" not in event:
        return event[6:]
    lines = [line for line in event.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[6:] if line.startswith(b"data: ") else line[5:] for line in lines)
