"""Generate a tiny random-weight Llama in Hugging Face format that vLLM serves, with no hub.

Run with the engine's own interpreter, where torch, transformers and tokenizers are installed
(`PYTHONPATH=src VENV/bin/python -m flagtrial.hfmodelgen OUT`): flagtrial itself does not
depend on them. The tokenizer is a byte-level BPE trained here on a few hundred words, so any
prompt tokenizes; it is saved as a PreTrainedTokenizerFast with a chat template, which
`/v1/chat/completions` needs. hidden 256 with 4 heads: vLLM's CPU attention kernels reject
head_dim 16 (`Unsupported CPU attention configuration`), head_dim 64 works.
Requests keep going to max_tokens through `ignore_eos`, which flagtrial's load sends.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from flagtrial.cache import file_lock

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

# Bump when the generated content changes, so cached models are regenerated.
GENERATOR_VERSION = "1"
STAMP = ".flagtrial-hfmodel"

_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    r"{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    r"{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_TEXT = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there one all we their been has when who will "
    "more no if out so said what up its about into than them can only other new some could "
    "time these two may then do first any my now such like our over man me even most made "
    "after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see "
    "men work long get here between both life being under never day same another know while "
    "last might us great old year off come since against go came right used take three "
    "server request token model cache batch latency throughput flag trial revert keep"
)


def _tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_TEXT] * 8, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = _CHAT_TEMPLATE
    return fast


def _write(out: Path, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _tokenizer(vocab_size=512)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def generate_hf_model(out: Path, seed: int = 1) -> Path:
    """The model folder at `out`, generated unless a complete one of this version is there.
    Written in a sibling temporary folder and renamed: never a half model at `out`. Under a
    lock, so a second generator never replaces the folder a server is reading."""
    stamp = out / STAMP
    with file_lock(out.parent / f".{out.name}.lock"):
        if stamp.is_file() and stamp.read_text() == f"{GENERATOR_VERSION} {seed}":
            return out
        _generate(out, seed)
    return out


def _generate(out: Path, seed: int) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _write(work, seed)
        (work / STAMP).write_text(f"{GENERATOR_VERSION} {seed}")
        # Readable by a server run as another user (mkdtemp makes 0700, safetensors 0600).
        work.chmod(0o755)
        for path in work.iterdir():
            path.chmod(0o644)
        shutil.rmtree(out, ignore_errors=True)
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="model folder to write")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(generate_hf_model(args.out, seed=args.seed))


if __name__ == "__main__":
    main()
