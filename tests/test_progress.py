"""Minute-long starts: each engine names its start phases from its own log lines; while a
restart runs the readiness wait reports elapsed time, phase and the server's last log line,
shown as one live line on a terminal and as a line per phase elsewhere."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import termios
from pathlib import Path

import pytest
from rich.console import Console

from flagtrial.demo import free_port
from flagtrial.engines.base import Phase, PhaseName, StartProgress, phase_entries
from flagtrial.engines.llamacpp import START_PHASES as LLAMACPP
from flagtrial.engines.sglang import START_PHASES as SGLANG
from flagtrial.engines.vllm import START_PHASES as VLLM
from flagtrial.errors import ServerNotReadyError
from flagtrial.launch.execwords import literal_word, quote_word
from flagtrial.settings import load_project
from flagtrial.targets import make_target
from flagtrial.ui import UNWRAPPED, RestartProgress
from harness.cli import cli, command
from harness.project import write_project_file
from harness.session import session_for

# What it asserts rests on the server's facts, crashes, bounds and files, never on a
# measured difference: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

LOGS = Path(__file__).parent / "fixtures" / "logs"
# What the real llama-server logs at `-lv 4` (tests/fixtures/logs/llamacpp-start-verbose.log):
# the model's metadata, the memory fit, the tensors, the KV cache, the warm-up, the listener.
LLAMACPP_VERBOSE = [
    "loading weights",
    "profiling",
    "loading weights",
    "KV allocation",
    "warming up",
    "ready",
]


def phases_seen(phases: tuple[Phase, ...], log: str) -> list[PhaseName]:
    return [name for name, _ in phase_entries(phases, log)]


def test_llamacpp_phases_from_its_own_log() -> None:
    default = (LOGS / "llamacpp-start.log").read_text()
    assert phases_seen(LLAMACPP, default) == ["loading weights", "ready"]
    verbose = (LOGS / "llamacpp-start-verbose.log").read_text()
    assert phases_seen(LLAMACPP, verbose) == LLAMACPP_VERBOSE
    # older builds' lines (a 2025 CPU build's log): KV self size, `server is listening on`
    older = (
        "0.00.043.951 I llama_new_context_with_model: KV self size  =    9.00 MiB, K (f16):"
        "    4.50 MiB, V (f16):    4.50 MiB\n"
        "main: HTTP server is listening, hostname: 127.0.0.1, port: 8080, http threads: 3\n"
        "main: server is listening on http://127.0.0.1:8080 - starting the main loop\n"
    )
    assert phases_seen(LLAMACPP, older) == ["KV allocation", "ready"]


def test_vllm_phases_from_a_real_cpu_start() -> None:
    log = (LOGS / "vllm-0.32-cpu-start.log").read_text()
    assert phases_seen(VLLM, log) == [
        "loading weights",
        "compiling",
        "KV allocation",
        "ready",
    ]


def test_sglang_phases_from_a_real_cpu_start() -> None:
    log = (LOGS / "sglang-0.5.23-cpu-start.log").read_text()
    assert phases_seen(SGLANG, log) == [
        "loading weights",
        "KV allocation",
        "warming up",
        "ready",
    ]


def dedup(phases: list[str]) -> list[str]:
    return [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]


def write_llama_project(root: Path, server: Path, model: Path, port: int, *extra: str) -> Path:
    """A project whose unit runs the real llama-server at `-lv 4` (every start phase logged)."""
    server_word, model_word = (quote_word(literal_word(str(p))) for p in (server, model))
    (root / "llama.service").write_text(
        "[Service]\n"
        "Environment=LLAMA_LOG_COLORS=off\n"
        f"ExecStart={server_word} --model {model_word} \\\n"
        f"    --host 127.0.0.1 --port {port} --threads 1 --parallel 2 -lv 4 {' '.join(extra)}\n"
    )
    return write_project_file(
        root / "flagtrial.toml",
        f'unit = "llama.service"\nendpoint = "http://127.0.0.1:{port}"\nready_timeout_s = 60\n',
    )


@pytest.fixture
def llama_project(tmp_path: Path, llama_server_bin: Path, small_model: Path):
    project = write_llama_project(tmp_path, llama_server_bin, small_model, free_port())
    yield project
    target = make_target(load_project(project))
    asyncio.run(target.stop())  # type: ignore[attr-defined]


def test_a_real_restart_reports_its_phases_in_order_ending_ready(llama_project: Path) -> None:
    reports: list[StartProgress] = []
    session = session_for(llama_project, progress=reports.append)

    async def restart() -> None:
        await session.restart_and_read()
        await session.target.aclose()

    asyncio.run(restart())
    phases = dedup([r.phase for r in reports])
    # every phase the server logged, in its order, whatever moment the log was read at
    assert phases in (LLAMACPP_VERBOSE, ["starting", *LLAMACPP_VERBOSE])
    assert [r.done for r in reports].index(True) == len(reports) - 1  # told once, at the end
    assert reports[-1].phase == "ready"
    # the server's own last line (llama-server's `0.00.284.980 I srv  ...`)
    assert re.match(r"\d+\.\d\d\.\d{3}\.\d{3} [IWE] ", reports[-1].last_line), reports[-1]
    elapsed = [r.elapsed_s for r in reports]
    assert elapsed == sorted(elapsed)


def test_a_crash_at_start_ends_the_progress_without_ready(
    tmp_path: Path, llama_server_bin: Path
) -> None:
    project = write_llama_project(
        tmp_path, llama_server_bin, tmp_path / "missing.gguf", free_port()
    )
    reports: list[StartProgress] = []
    session = session_for(project, progress=reports.append)
    with pytest.raises(ServerNotReadyError, match="crashed at start"):
        asyncio.run(session.restart_and_read())
    assert reports[-1].done and reports[-1].phase != "ready"  # the live line goes all the same
    assert not any(r.done for r in reports[:-1])


def test_piped_output_has_a_line_per_phase(llama_project: Path) -> None:
    result = cli(llama_project, "facts", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "\r" not in result.stdout and "\x1b" not in result.stdout
    # the state column of each progress line (`10:30:47 KV allocation      0.0s  ...`)
    states = re.findall(r"^\d\d:\d\d:\d\d (.{18}) ", result.stdout, re.MULTILINE)
    # one line per phase the log entered, then the session's own ready line
    assert [s.strip() for s in states if s.strip() in LLAMACPP_VERBOSE] == LLAMACPP_VERBOSE
    assert {s.strip() for s in states} == {"baseline", *LLAMACPP_VERBOSE}  # nothing else
    ready = next(line for line in result.stdout.splitlines() if " ready " in line)
    assert "server ready in" in ready


def test_json_mode_keeps_progress_on_stderr(llama_project: Path) -> None:
    result = cli(llama_project, "facts", "--json", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["generation"] == 1  # nothing but the document
    assert re.search(r"KV allocation +\d+\.\ds  .*llama_kv_cache", result.stderr), result.stderr


def screen(raw: str) -> list[str]:
    """The lines a terminal shows after `raw`: enough of a VT100 for Rich's live display
    (carriage return, erase line, cursor up/down, colours and cursor visibility ignored)."""
    lines: list[list[str]] = [[]]
    row = col = 0
    for m in re.finditer(r"\x1b\[([0-9;?]*)([A-Za-z])|\r|\n|[^\x1b\r\n]", raw):
        token = m.group(0)
        if token == "\r":
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
            lines += [[] for _ in range(row + 1 - len(lines))]
        elif m.group(2) == "K":
            lines[row] = lines[row][:col] if m.group(1) in ("", "0") else []
        elif m.group(2) in ("A", "B"):
            step = int(m.group(1) or 1)
            row = max(0, row - step) if m.group(2) == "A" else row + step
            lines += [[] for _ in range(row + 1 - len(lines))]
        elif m.group(2) is None:
            cells = lines[row]
            cells += [" "] * (col + 1 - len(cells))
            cells[col] = token
            col += 1
    return ["".join(cells).rstrip() for cells in lines]


def run_in_terminal(argv: list[str], columns: int = 100) -> str:
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns)}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(argv, stdin=child, stdout=child, stderr=child, env=env)
    os.close(child)
    out = bytearray()
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    assert proc.wait(timeout=120) == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


def test_a_terminal_gets_one_live_line_drawn_and_cleared(llama_project: Path) -> None:
    raw = run_in_terminal(command(llama_project, ("facts",)))
    plain = re.sub(r"\x1b\[[0-9;]*m", "", raw)
    drawn = re.findall(r"restarting \d+\.\ds  ([a-zA-Z ]+?)  ", plain)
    assert drawn, raw  # the live line was drawn, with a phase
    assert set(drawn) <= {"starting", *LLAMACPP_VERBOSE}
    # one line high: Rich moves up a line per line of the live display to redraw or clear it
    assert "\x1b[2K\x1b[1A" not in raw and "\x1b[1A\x1b[2K\x1b[1A" not in raw
    shown = screen(raw)
    assert not any("restarting" in line for line in shown), shown  # and cleared when ready
    assert any("server ready in" in line for line in shown)
    # no phase line on a terminal: the live line said it
    assert not any(re.search(r"\d\d:\d\d:\d\d KV allocation", line) for line in shown)


@pytest.mark.parametrize("key", ["['sk-live-0123456789']", "'sk-live-0123456789'"])
@pytest.mark.parametrize("terminal", [True, False])
def test_the_shown_log_line_is_redacted(key: str, terminal: bool) -> None:
    """vLLM before 0.32 logged `--api-key` in its `non-default args` line (a list since the
    key became repeatable, a string before); 0.32 writes `***` itself. The real 0.32 line,
    with the key as an older release wrote it."""
    real = next(
        line
        for line in (LOGS / "vllm-0.32-cpu-start.log").read_text().splitlines()
        if "non-default args" in line
    )
    line = real.replace("{'host'", f"{{'api_key': {key}, 'host'")
    width = 200 if terminal else UNWRAPPED
    out = Console(force_terminal=terminal, width=width, record=True, color_system=None)
    show = RestartProgress(out)
    show(StartProgress(3.0, "starting", "\x1b[2K" + line))
    show(StartProgress(4.0, "loading weights", line))
    show(StartProgress(5.0, "ready", line, done=True))
    text = out.export_text()
    assert "sk-live-0123456789" not in text
    assert re.search(r"'api_key': '?<redacted>", text), text
    if not terminal:  # the phase line, once
        assert text.count("\n") == 1 and "loading weights" in text and "\x1b" not in text
