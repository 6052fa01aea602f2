"""Workloads users ask for: lengths from distributions, a prefix shared by every prompt (the
server's cache hits read from its own stream), their own traffic from a JSONL file, and
open-loop arrivals at a rate with a concurrency cap."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
from pathlib import Path

import pytest

from flagtrial.errors import ProjectError
from flagtrial.facts import request_tokens
from flagtrial.load.prompts import plan_request
from flagtrial.load.runner import RunResult, arrival_offsets, run_level
from flagtrial.load.workload import Lengths, Workload
from flagtrial.settings import parse_project
from harness.cli import cli
from harness.scripted import HEAD, STREAM, USAGE, chunked, event, read_request

LOGNORMAL = Lengths(distribution="lognormal", mean=24, spread=0.6)


def test_lengths_are_drawn_by_index_alone_within_the_caps() -> None:
    w = Workload(prompt_words=64, max_tokens=32, prompt_lengths=LOGNORMAL,
                 output_lengths=Lengths(distribution="uniform", low=4))  # fmt: skip
    one = [plan_request(w, i, seed=1) for i in range(300)]
    other = [plan_request(w, i, seed=2) for i in range(300)]
    # Both arms (their own seeds) ask the same lengths in the same order, with other words.
    assert [r.max_tokens for r in one] == [r.max_tokens for r in other]
    assert [len(r.prompt.split()) for r in one] == [len(r.prompt.split()) for r in other]  # type: ignore[union-attr]
    assert all(a.prompt != b.prompt for a, b in zip(one, other, strict=True))
    outputs = [r.max_tokens for r in one]
    words = [len(r.prompt.split()) for r in one]  # type: ignore[union-attr]
    assert min(outputs) >= 4 and max(outputs) <= 32 and len(set(outputs)) > 20
    assert min(words) >= 1 and max(words) <= 64 and 20 <= statistics.median(words) <= 28


def test_a_distribution_without_its_mean_is_refused() -> None:
    with pytest.raises(ValueError, match="a normal distribution needs `mean`"):
        Lengths(distribution="normal", spread=3)


@pytest.mark.slow
def test_each_request_asks_its_drawn_length(run_llama_server, tiny_model: Path) -> None:  # type: ignore[no-untyped-def]
    url = run_llama_server(tiny_model, "-t", "1", "-c", "2048", "-np", "2")
    w = Workload(
        prompt_words=16, max_tokens=24, output_lengths=Lengths(distribution="uniform", low=2)
    )
    result = asyncio.run(run_level(url, w, 2, n_requests=8, warmup=False, seed=5))
    asked = sorted(plan_request(w, i, 5).max_tokens for i in range(8))
    assert sorted(r.output_tokens for r in result.records) == asked
    assert all(r.max_tokens == r.output_tokens for r in result.records)
    assert (result.summary.n_ok, result.summary.n_short, result.summary.output_tokens) == (
        8,
        0,
        sum(asked),
    )


@pytest.mark.slow
def test_a_shared_prefix_is_served_from_the_servers_cache(
    run_llama_server, tiny_model: Path
) -> None:  # type: ignore[no-untyped-def]
    url = run_llama_server(tiny_model, "-t", "1", "-c", "2048", "-np", "1")
    unique = Workload(prompt_words=64, max_tokens=4)
    shared = unique.model_copy(update={"shared_prefix_words": 56})
    cold = asyncio.run(run_level(url, unique, 1, n_requests=6, warmup=False, seed=1)).summary
    warm = asyncio.run(run_level(url, shared, 1, n_requests=6, warmup=False, seed=2)).summary
    # llama-server's usage.prompt_tokens_details.cached_tokens: the 56 shared words come from
    # its cache after the first request; unique prompts share only their template tokens.
    assert cold.cached_prompt_share is not None and warm.cached_prompt_share is not None
    assert warm.cached_prompt_share > 0.6 > 0.2 > cold.cached_prompt_share


def test_traffic_is_replayed_in_order_with_its_lengths_capped(tmp_path: Path) -> None:
    rows = [
        {"prompt": "hello there", "max_tokens": 500},
        {"messages": [{"role": "user", "content": "hi"}]},
    ]
    (tmp_path / "traffic.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    text = 'unit = "x.service"\n[workload]\nprompts_file = "traffic.jsonl"\nmax_tokens = 64\n'
    w = parse_project(text, tmp_path / "flagtrial.toml").workload
    assert w.prompts_file == tmp_path / "traffic.jsonl"
    asked = [plan_request(w, i, seed=0) for i in range(3)]
    assert [(r.prompt, r.max_tokens) for r in asked] == [
        ("hello there", 64),
        (None, 64),
        ("hello there", 64),
    ]
    assert asked[1].messages == rows[1]["messages"]


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ('{"prompt": "ok"}\n{"prompt": 3}\n', "traffic.jsonl:2: needs a `prompt` string"),
        ('{"prompt": "ok"}\nnot json\n', "traffic.jsonl:2: not JSON"),
        ('{"prompt": "ok", "max_tokens": 0}\n', "traffic.jsonl:1: max_tokens must be a positive"),
        ("\n", "traffic.jsonl: no requests in it"),
        (None, "No such file"),
    ],
)
def test_a_bad_traffic_file_is_one_project_error(
    tmp_path: Path, content: str | None, error: str
) -> None:
    if content is not None:
        (tmp_path / "traffic.jsonl").write_text(content)
    text = 'unit = "x.service"\n[workload]\nprompts_file = "traffic.jsonl"\n'
    with pytest.raises(ProjectError, match=r"workload\.prompts_file: ") as raised:
        parse_project(text, tmp_path / "flagtrial.toml")
    assert error in str(raised.value)


def test_the_cli_refuses_a_bad_traffic_file_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "traffic.jsonl").write_text('{"prompt": 3}\n')
    project = tmp_path / "flagtrial.toml"
    project.write_text('unit = "x.service"\n[workload]\nprompts_file = "traffic.jsonl"\n')
    done = cli(project, "history", timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "traffic.jsonl:1: needs a `prompt` string" in done.stderr


def test_open_loop_arrivals_keep_their_rate_and_are_the_same_for_both_arms() -> None:
    poisson = Workload(concurrency=[4], request_rate=[20.0])
    offsets = arrival_offsets(poisson, 20.0, range(4000))
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert statistics.mean(gaps) == pytest.approx(1 / 20, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(1 / 20, rel=0.1)  # exponential: sd = mean
    assert arrival_offsets(poisson, 20.0, range(50)) == offsets[:50]
    even = arrival_offsets(poisson.model_copy(update={"arrival": "constant"}), 20.0, range(5))
    assert even == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])


def test_a_rate_the_cap_cannot_carry_is_reported_delayed() -> None:
    # Each answer takes 30 ms; 200 requests/s with at most 2 in flight cannot be offered:
    # the requests that found both slots taken are counted.
    async def server_script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader) is not None:
            await asyncio.sleep(0.03)
            writer.write(HEAD + chunked(STREAM) + chunked(b""))
        writer.close()

    async def offered(rate: float) -> tuple[int, int]:
        server = await asyncio.start_server(server_script, "127.0.0.1", 0)
        try:
            url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            w = Workload(concurrency=[2], request_rate=[rate], max_tokens=3, arrival="constant")
            result = await run_level(url, w, 2, n_requests=20, warmup=False)
            return result.summary.n_ok, result.summary.n_delayed
        finally:
            server.close()

    ok, delayed = asyncio.run(offered(200.0))
    assert ok == 20 and delayed > 0
    assert asyncio.run(offered(5.0)) == (20, 0)


def test_a_request_rate_needs_one_rate_per_level() -> None:
    with pytest.raises(ValueError, match="one rate per concurrency level"):
        Workload(concurrency=[1, 4], request_rate=[2.0])


def test_two_client_processes_send_one_run_on_one_clock() -> None:
    # Evenly spaced arrivals dealt to two processes: the server sees the requests in the
    # order of their indices (each prompt's first word), so both kept one schedule.
    seen: list[int] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (body := await read_request(reader)) is not None:
            seen.append(int(json.loads(body)["prompt"].split()[0]))
            writer.write(HEAD + chunked(STREAM) + chunked(b""))
        writer.close()

    async def measure(w: Workload) -> tuple[int, int]:
        server = await asyncio.start_server(script, "127.0.0.1", 0)
        try:
            url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            result = await run_level(url, w, 4, n_requests=24, warmup=False)
            return result.summary.n_ok, result.summary.output_tokens
        finally:
            server.close()

    paced = Workload(concurrency=[4], request_rate=[20.0], arrival="constant", max_tokens=3,
                     client_processes=2)  # fmt: skip
    assert asyncio.run(measure(paced)) == (24, 72)
    assert seen == list(range(24))
    seen.clear()
    closed = Workload(concurrency=[4], max_tokens=3, client_processes=2)
    assert asyncio.run(measure(closed)) == (24, 72)
    assert sorted(seen) == list(range(24))


def chat_text(token: str) -> bytes:
    return event({"choices": [{"index": 0, "delta": {"content": token}}]})


def test_chat_turns_send_the_conversation_so_far_with_the_servers_answers() -> None:
    # The server answers each turn with words naming it, in two pieces; the request of turn
    # 500 fails. Each later turn must carry every earlier user turn and answer, as streamed.
    seen: list[list[dict[str, str]]] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (body := await read_request(reader)) is not None:
            messages = json.loads(body)["messages"]
            seen.append(messages)
            index = messages[-1]["content"].split()[0]
            if index == "7":
                writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
                continue
            stream = chat_text("answer ") + chat_text(f"to {index}") + USAGE + event("[DONE]")
            writer.write(HEAD + chunked(stream) + chunked(b""))
        writer.close()

    async def measure(w: Workload, concurrency: int) -> RunResult:
        server = await asyncio.start_server(script, "127.0.0.1", 0)
        try:
            url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            return await run_level(url, w, concurrency, n_requests=11, warmup=False, seed=3)
        finally:
            server.close()

    w = Workload(api="chat", turns=3, prompt_words=6, max_tokens=2)
    result = asyncio.run(measure(w, 2))
    # conversations 0-2, 3-5, 6-8 (turn 7 fails: 8 is never sent), 9-10 (cut short)
    assert sorted(int(m[-1]["content"].split()[0]) for m in seen) == [0, 1, 2, 3, 4, 5, 6, 7, 9, 10]
    for messages in seen:
        index = int(messages[-1]["content"].split()[0])
        first = index - index % 3
        asked = [plan_request(w, i, 3).prompt for i in range(first, index + 1)]
        answers = [f"answer to {i}" for i in range(first, index)]
        assert messages == [
            *({"role": role, "content": text} for pair in zip(asked, answers, strict=False)
              for role, text in zip(("user", "assistant"), pair, strict=True)),
            {"role": "user", "content": asked[-1]},
        ]  # fmt: skip
    s = result.summary
    assert (s.n_requests, s.n_ok, s.errors, s.turns) == (10, 9, {"HTTP 500": 1}, 3)
    # open loop from two processes: whole conversations dealt out, arriving at the rate,
    # their turns still one after another with their own answers
    paced = w.model_copy(update={"concurrency": [4], "request_rate": [50.0], "client_processes": 2})
    seen.clear()
    assert asyncio.run(measure(paced, 4)).summary.n_requests == 10
    assert all(
        m[1::2]
        == [
            {"role": "assistant", "content": f"answer to {int(u['content'].split()[0])}"}
            for u in m[:-1:2]
        ]
        for m in seen
    )


def test_turns_need_the_chat_api() -> None:
    with pytest.raises(ValueError, match='turns above 1 need api = "chat"'):
        Workload(turns=2)


@pytest.mark.slow
def test_chat_turns_are_served_from_the_servers_prefix_cache(
    run_llama_server, tiny_model: Path
) -> None:  # type: ignore[no-untyped-def]
    url = run_llama_server(tiny_model, "-t", "1", "-c", "4096", "-np", "2")
    w = Workload(api="chat", turns=3, prompt_words=24, max_tokens=16)
    result = asyncio.run(run_level(url, w, 2, n_requests=6, warmup=False, seed=4))
    assert (result.summary.n_ok, result.summary.turns) == (6, 3)
    records = result.records
    for first in (0, 3):  # each conversation's records in turn order
        turns = records[first : first + 3]
        prompts = [r.prompt_tokens or 0 for r in turns]
        # every turn re-sends the ones before with their answers: the prompt grows by more
        # than the answer, and the server's cache serves at least the last turn's prompt
        assert all(
            b > a + r.output_tokens
            for (a, b), r in zip(itertools.pairwise(prompts), turns[:2], strict=True)
        )
        assert all((r.cached_tokens or 0) >= a for a, r in zip(prompts[:2], turns[1:], strict=True))
    assert result.summary.cached_prompt_share is not None
    assert result.summary.cached_prompt_share > 0.4


def test_a_chats_request_holds_its_last_turn_with_every_answer_at_full_length() -> None:
    # A server that counts words as tokens and answers one word: the probe's last turn had
    # one-word answers; a run's has max_tokens-long ones.
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (body := await read_request(reader)) is not None:
            words = sum(len(m["content"].split()) for m in json.loads(body)["messages"])
            usage = event(
                {"choices": [], "usage": {"prompt_tokens": words, "completion_tokens": 1}}
            )
            writer.write(HEAD + chunked(chat_text("x") + usage + event("[DONE]")) + chunked(b""))
        writer.close()

    async def measure(w: Workload) -> float | None:
        server = await asyncio.start_server(script, "127.0.0.1", 0)
        try:
            return await request_tokens(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", w)
        finally:
            server.close()

    chat = Workload(api="chat", prompt_words=6, max_tokens=10)
    assert asyncio.run(measure(chat)) == 6 + 10
    # the 5th turn: 5 user turns of 6 words and 4 answers of 10, then its own 10
    assert asyncio.run(measure(chat.model_copy(update={"turns": 5}))) == 5 * 6 + 4 * 10 + 10
