"""What each request of a run asks: its prompt (synthetic words, with an optional prefix shared
by every request, or a line of the user's own JSONL traffic) and its output length (fixed, or
drawn from a distribution). Deterministic in (seed, index); the lengths depend on the index
only, so both arms of a trial ask for the same lengths in the same order."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from flagtrial.load.workload import Lengths, Workload

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


def shared_prefix(n_words: int) -> str:
    """The prefix every prompt of a shared-prefix workload starts with (the same in every run
    and arm: what a prefix cache can reuse)."""
    return " ".join(random.Random("shared-prefix").choices(WORDS, k=n_words))


def draw_length(lengths: Lengths | None, cap: int, index: int, salt: str) -> int:
    """Request `index`'s length: `cap` when fixed, else drawn (by index alone) and clipped to
    [1, cap]."""
    if lengths is None:
        return cap
    rng = random.Random(f"{salt}:{index}")
    mean = lengths.mean or 1.0  # set for normal and lognormal (the model checks)
    if lengths.distribution == "uniform":
        value = rng.uniform(lengths.low, cap)
    elif lengths.distribution == "normal":
        value = rng.gauss(mean, lengths.spread)
    else:
        value = rng.lognormvariate(math.log(mean), lengths.spread)
    return max(1, min(cap, round(value)))


@dataclass(frozen=True)
class Request:
    """One request's body fields: the prompt (or chat messages) and its max_tokens."""

    prompt: str | None
    messages: list[dict[str, Any]] | None
    max_tokens: int


@cache
def _replayed(path: Path) -> tuple[dict[str, Any], ...]:
    """The traffic file as this process first read it: one fixed workload for every run (no
    file access per request, and an edit mid-trial changes neither arm)."""
    return read_traffic(path)


def read_traffic(path: Path) -> tuple[dict[str, Any], ...]:
    """The user's traffic file: one JSON object a line with `prompt` (a string) or `messages`
    (chat messages), and optionally `max_tokens`. Raises ValueError naming the bad line."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{number}: not JSON: {e}") from None
        if not isinstance(row, dict) or not (
            isinstance(row.get("prompt"), str) or isinstance(row.get("messages"), list)
        ):
            raise ValueError(f"{path}:{number}: needs a `prompt` string or a `messages` list")
        if "max_tokens" in row and not (
            isinstance(row["max_tokens"], int) and row["max_tokens"] > 0
        ):
            raise ValueError(f"{path}:{number}: max_tokens must be a positive integer")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no requests in it")
    return tuple(rows)


def plan_request(workload: Workload, index: int, seed: int) -> Request:
    """What request `index` of a run with `seed` asks."""
    max_tokens = draw_length(workload.output_lengths, workload.max_tokens, index, "output")
    if workload.prompts_file is not None:
        rows = _replayed(workload.prompts_file)
        row = rows[index % len(rows)]
        asked = min(int(row.get("max_tokens", max_tokens)), workload.max_tokens)
        return Request(row.get("prompt"), row.get("messages"), asked)
    words = draw_length(workload.prompt_lengths, workload.prompt_words, index, "prompt")
    prefix = workload.shared_prefix_words
    if prefix:
        unique = build_prompt(index, max(1, words - prefix), seed)
        return Request(f"{shared_prefix(prefix)} {unique}", None, max_tokens)
    return Request(build_prompt(index, words, seed), None, max_tokens)
