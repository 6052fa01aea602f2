"""Generate random-weight llama GGUF models that llama-server loads and that never stop early.

The models exist so that trials can run a real llama-server without downloading weights, and so
that every request yields exactly ``max_tokens`` tokens: throughput and latency then compare
like with like across runs.

How generation is kept away from EOS and byte tokens: residual dimension 0 holds the same
constant for every token (``token_embd``), and no layer writes to it (``attn_output`` and
``ffn_down`` have a zero output row 0), so after the final RMSNorm dimension 0 is always large
and positive. ``output.weight`` gives the special and byte tokens a large negative weight on
dimension 0 and every normal token zero there, so their logits sit hundreds below any normal
token's (measured: ~800 below for tiny, ~600 for small), negligible at any sane temperature.
"""

from __future__ import annotations

import argparse
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import gguf
import numpy as np

ModelSize = Literal["tiny", "small"]

# Bump when the generated content changes, so cached files are regenerated.
_GENERATOR_VERSION = "1"

# Dimension 0 of every token embedding; other dimensions are normal(0, _WEIGHT_STD).
_DIM0_CONSTANT = 4.0
# Output weight on dimension 0 for special and byte tokens.
_BANNED_WEIGHT = -100.0
_WEIGHT_STD = 0.02

_N_SPECIAL = 3  # <unk>, <s>, </s>
_N_BYTE = 256

_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    r"{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    r"{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_COMMON_WORDS = (
    "the of and to in a is that for it as was with be by on not he i this are or his from at "
    "which but have an they you were her she there one all we their been has when who will more "
    "no if out so said what up its about into than them can only other new some could time these "
    "two may then do first any my now such like our over man me even most made after also did "
    "many before must through back years where much your way well down should because each just "
    "those people how too little state good very make world still own see men work long get here "
    "between both life being under never day same another know while last might us great old "
    "year off come since against go came right used take three"
)
_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


@dataclass(frozen=True)
class _Shape:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_ff: int
    n_ctx: int
    dtype: type[np.floating]
    file_type: gguf.LlamaFileType


_SHAPES: dict[ModelSize, _Shape] = {
    "tiny": _Shape(512, 64, 2, 4, 256, 4096, np.float32, gguf.LlamaFileType.ALL_F32),
    "small": _Shape(8192, 512, 8, 8, 1536, 8192, np.float16, gguf.LlamaFileType.MOSTLY_F16),
}


def _model_name(size: ModelSize, seed: int) -> str:
    return f"flagtrial-{size}-seed{seed}"


def _vocab(n_vocab: int) -> list[str]:
    """SPM pieces: specials, bytes, then word pieces with every prefix present so words merge."""
    pieces: dict[str, None] = {}  # ordered set
    for code in range(33, 127):
        pieces[chr(code)] = None
    pieces["▁"] = None
    for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ":
        pieces["▁" + c] = None
    for word in _COMMON_WORDS.split():
        for end in range(2, len(word) + 1):
            pieces["▁" + word[:end]] = None
    # Synthetic words, built breadth-first so each one's prefixes come before it.
    level = ["▁" + c for c in _CONSONANTS]
    for letters in (_VOWELS, _CONSONANTS, _VOWELS, _CONSONANTS):
        level = [p + c for p in level for c in letters]
        for p in level:
            pieces[p] = None
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(_N_BYTE)]
    tokens = specials + byte_tokens + list(pieces)
    if len(tokens) < n_vocab:
        raise ValueError(f"vocabulary generator yields {len(tokens)} tokens, need {n_vocab}")
    return tokens[:n_vocab]


def _token_types(n_vocab: int) -> list[gguf.TokenType]:
    return (
        [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
        + [gguf.TokenType.BYTE] * _N_BYTE
        + [gguf.TokenType.NORMAL] * (n_vocab - _N_SPECIAL - _N_BYTE)
    )


def _tensors(shape: _Shape, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.Generator(np.random.PCG64(seed))

    def normal(*dims: int) -> np.ndarray:
        return rng.standard_normal(dims, dtype=np.float32) * np.float32(_WEIGHT_STD)

    def ones() -> np.ndarray:
        return np.ones(shape.n_embd, dtype=np.float32)  # norms stay f32, as llama.cpp expects

    e, ff = shape.n_embd, shape.n_ff
    embd = normal(shape.n_vocab, e)
    embd[:, 0] = _DIM0_CONSTANT
    out = normal(shape.n_vocab, e)
    out[:, 0] = 0.0
    out[: _N_SPECIAL + _N_BYTE, 0] = _BANNED_WEIGHT
    tensors = {"token_embd.weight": embd}
    for i in range(shape.n_layer):
        attn_out = normal(e, e)
        attn_out[0, :] = 0.0  # (n_out, n_in): nothing writes residual dim 0
        ffn_down = normal(e, ff)
        ffn_down[0, :] = 0.0
        tensors |= {
            f"blk.{i}.attn_norm.weight": ones(),
            f"blk.{i}.attn_q.weight": normal(e, e),
            f"blk.{i}.attn_k.weight": normal(e, e),
            f"blk.{i}.attn_v.weight": normal(e, e),
            f"blk.{i}.attn_output.weight": attn_out,
            f"blk.{i}.ffn_norm.weight": ones(),
            f"blk.{i}.ffn_gate.weight": normal(ff, e),
            f"blk.{i}.ffn_up.weight": normal(ff, e),
            f"blk.{i}.ffn_down.weight": ffn_down,
        }
    tensors |= {"output_norm.weight": ones(), "output.weight": out}
    return {
        name: t if t.ndim == 1 else t.astype(shape.dtype, copy=False) for name, t in tensors.items()
    }


def _is_current(path: Path, name: str) -> bool:
    try:
        reader = gguf.GGUFReader(path, "r")
    except (OSError, ValueError):
        return False
    fields = [reader.get_field(k) for k in ("general.name", "general.version")]
    return [f.contents() if f is not None else None for f in fields] == [name, _GENERATOR_VERSION]


def _write(path: Path, shape: _Shape, name: str, seed: int) -> None:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(name)
    writer.add_version(_GENERATOR_VERSION)
    writer.add_file_type(shape.file_type)
    writer.add_vocab_size(shape.n_vocab)
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head)
    writer.add_rope_dimension_count(shape.n_embd // shape.n_head)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)

    tokens = _vocab(shape.n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_types(_token_types(shape.n_vocab))
    writer.add_token_scores([-float(i) for i in range(shape.n_vocab)])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(_CHAT_TEMPLATE)

    for tensor_name, tensor in _tensors(shape, seed).items():
        writer.add_tensor(tensor_name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def generate_model(path: Path, size: ModelSize = "small", seed: int = 0) -> Path:
    """Write a deterministic random llama GGUF for (size, seed) to ``path``; return ``path``.

    An existing file generated for the same size, seed and generator version is kept as is.
    """
    if size not in _SHAPES:
        raise ValueError(f"unknown model size {size!r}; expected one of {list(_SHAPES)}")
    path = Path(path)
    name = _model_name(size, seed)
    if path.exists() and _is_current(path, name):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    # Same-directory temp file + os.replace: readers never see a partial model. Not mkstemp:
    # its 0600 mode would stick to the model; the writer's open() honours the umask.
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        _write(tmp, _SHAPES[size], name, seed)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m flagtrial.modelgen",
        description="Write a random-weight llama GGUF that never emits EOS.",
    )
    parser.add_argument("out", type=Path, help="output .gguf path")
    parser.add_argument("--size", choices=get_args(ModelSize), default="small")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    path = generate_model(args.out, size=args.size, seed=args.seed)
    elapsed = time.perf_counter() - start
    print(f"{path} ({path.stat().st_size / 1e6:.1f} MB, {elapsed:.2f}s)")


if __name__ == "__main__":
    main()
