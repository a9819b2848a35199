"""`tiny-arith-lm`: the base model of `t0_arithmetic_format_tiny`, generated on this machine (no
download).

    generate(folder) -> None                            the hub's model (seed 0)
    write_tiny_arith_model(folder, *, seed=0) -> None

A Llama-style causal LM that `transformers` loads as `LlamaForCausalLM`, made so that the task can
be learned on two CPU cores in minutes: a character-level tokenizer (every printable ASCII
character is one token, so digits are never merged), hidden size 128, 2 layers, F32 weights
(~0.3 M parameters), and a short chat template: `<|im_start|>{question}<|im_end|>`, after which
the model answers and ends its reply with `<|im_end|>`. Untrained: random weights, so the base
model answers nothing in the required format (its score is 0).

The same seed gives byte-identical files. `tiny-causal-lm` (tasks/models/tiny_causal_lm.py) is
the other generated model, for t0_artifact; the two do not share weights or tokenizers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models

from tasks.evaluator_kit import write_safetensors
from tasks.models._llama import (
    END,
    PAD,
    SPECIAL_TOKENS,
    START,
    LlamaSize,
    added_tokens,
    generation_config,
    model_config,
    write_json,
)

SIZE = LlamaSize(hidden=128, intermediate=256, layers=2, heads=4, kv_heads=2)
MAX_POSITIONS = 128
CHARACTERS = (*(chr(code) for code in range(32, 127)), "\n")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['content'] + '<|im_end|>' }}"
    "{% endfor %}"
)
WEIGHTS = "model.safetensors"


def generate(folder: Path) -> None:
    """The local hub's `tiny-arith-lm` (its revision is these files' hash: keep them stable)."""
    write_tiny_arith_model(folder, seed=0)


def write_tiny_arith_model(
    folder: Path, *, seed: int = 0, size: LlamaSize = SIZE, max_positions: int = MAX_POSITIONS
) -> None:
    """Write the model's files into `folder` (created if missing; files overwritten). `size` and
    `max_positions` serve the other character-level models (tasks/models/tiny_math_lm.py)."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {token: n for n, token in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}
    ids = {token: vocab[token] for token in SPECIAL_TOKENS}
    rng = np.random.default_rng(seed)
    tensors = {
        name: ("F32", shape, _values(name, shape, rng).astype("<f4").tobytes())
        for name, shape in size.tensor_shapes(len(vocab)).items()
    }
    write_safetensors(folder / WEIGHTS, tensors, {"format": "pt"})
    write_json(
        folder / "config.json", model_config(size, len(vocab), max_positions, ids, "float32")
    )
    write_json(folder / "generation_config.json", generation_config(ids))
    (folder / "tokenizer.json").write_text(_tokenizer(vocab).to_str(pretty=True), encoding="utf-8")
    write_json(
        folder / "tokenizer_config.json",
        {
            "added_tokens_decoder": added_tokens(ids),
            "bos_token": START,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": END,
            "model_max_length": max_positions,
            "pad_token": PAD,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": PAD,
        },
    )


def _values(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if name.endswith("norm.weight"):
        return np.ones(shape)
    return 0.02 * rng.standard_normal(shape)


def _tokenizer(vocab: dict[str, int]) -> Tokenizer:
    """One token per character: BPE over the characters with no merges; the specials whole."""
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=PAD))
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.decoder = decoders.Fuse()
    return tokenizer
