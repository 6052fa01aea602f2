"""The ceiling's server: nginx (Debian's) serving pre-rendered OpenAI SSE streams from memory
on its own core, so that it is never the bottleneck of a client's run."""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from pathlib import Path

from flagtrial.demo import free_port

HERE = Path(__file__).parent
CLIENT_CORE, SERVER_CORE = "1", "0"


def render_stream(tokens: int, chat: bool = False) -> bytes:
    """A /v1/completions (or chat) stream as vLLM sends it: one text chunk per token, the
    finish chunk, the usage chunk (empty choices), [DONE]."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    head = f'{{"id":"cmpl-0","object":"{kind}","created":0,"model":"tiny","choices":'

    def choice(token: str, finish: str) -> str:
        text = f'"delta":{{"content":"{token}"}}' if chat else f'"text":"{token}"'
        return f'[{{"index":0,{text},"logprobs":null,"finish_reason":{finish}}}]}}'

    events = [f"data: {head}{choice(f' w{i % 10}', 'null')}" for i in range(tokens)]
    events.append(f"data: {head}{choice('', chr(34) + 'length' + chr(34))}")
    events.append(
        f'data: {head}[],"usage":{{"prompt_tokens":8,"completion_tokens":{tokens},'
        f'"total_tokens":{tokens + 8}}}}}'
    )
    events.append("data: [DONE]")
    return ("\n\n".join(events) + "\n\n").encode()


def start_nginx(root: Path, lengths: list[int]) -> tuple[subprocess.Popen[bytes], int]:
    for n in lengths:
        completions = root / f"s{n}" / "v1" / "completions"
        (completions.parent / "chat").mkdir(parents=True)
        completions.write_bytes(render_stream(n))
        (completions.parent / "chat" / "completions").write_bytes(render_stream(n, chat=True))
    port = free_port()
    conf = root / "nginx.conf"
    conf.write_text(
        textwrap.dedent(f"""
        # workers as the user who started it (as root: root), so they can read `root`
        user {"root" if os.geteuid() == 0 else "nobody"};
        worker_processes 1;
        daemon off;
        pid {root}/nginx.pid;
        error_log {root}/error.log;
        events {{ worker_connections 4096; }}
        http {{
          access_log off;
          keepalive_requests 1000000;
          client_body_temp_path {root}/body;
          server {{
            listen 127.0.0.1:{port} backlog=4096;
            root {root};
            default_type text/event-stream;
            # POST to a static file: served as for GET
            error_page 405 =200 $uri;
          }}
        }}
        """)
    )
    server = subprocess.Popen(
        ["taskset", "-c", SERVER_CORE, "nginx", "-c", str(conf), "-p", str(root)]
    )
    for _ in range(100):
        try:
            import socket

            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return server, port
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("nginx did not start")
