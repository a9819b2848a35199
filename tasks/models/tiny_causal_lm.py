"""`tiny-causal-lm`: a tiny Llama-style causal LM generated on this machine, no download, no
torch (DESIGN §8); the local base model of t0_artifact.

    generate(folder) -> None                                    the hub's model (seed 0, BF16)
    write_tiny_model(folder, *, seed=0, dtype="BF16") -> None

writes a model that `transformers` would load as `LlamaForCausalLM` (hidden size 64, 2 layers,
4 heads with 2 key/value heads, a byte-level BPE vocabulary of a few hundred tokens): config.json,
generation_config.json, two weight shards with model.safetensors.index.json (so an agent's job
has to read every shard), tokenizer.json, tokenizer_config.json with a ChatML chat template and
special_tokens_map.json. About 0.3 MB in BF16. The same seed gives byte-identical files (for a
given `tokenizers` version: its BPE trainer is deterministic, checked across processes).

BF16 by default, like HuggingFaceTB/SmolLM2-135M, the Hugging Face base model of t0_artifact, so
the local and the Hugging Face form of the task ask for the same exact arithmetic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tasks.evaluator_kit import write_safetensors
from tasks.models._llama import (
    SPECIAL_TOKENS,
    LlamaSize,
    added_tokens,
    generation_config,
    model_config,
    write_json,
)

SIZE = LlamaSize(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2)
MAX_POSITIONS = 256
VOCAB_TARGET = 384
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SHARD_NAMES = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
DTYPES = {"BF16": "bfloat16", "F32": "float32", "F16": "float16"}

_CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "A tiny language model lives in a folder on this machine.",
    "What is (17 + 5) * 23? ANSWER: 506",
    "What is 12 - 40? ANSWER: -28",
    "Jobs read the base model and write their outputs.",
    "user: hello there. assistant: hello! how can I help you today?",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 256 1000",
    "The evaluator compares the checkpoint with the expected one, tensor by tensor.",
)


def generate(folder: Path) -> None:
    """The local hub's `tiny-causal-lm` (its revision is these files' hash: keep them stable)."""
    write_tiny_model(folder, seed=0)


def write_tiny_model(folder: Path, *, seed: int = 0, dtype: str = "BF16") -> None:
    """Write the tiny model's files into `folder` (created if missing; files overwritten).

    `dtype` is the weights' safetensors dtype: BF16 (default), F16 or F32. Raises ValueError for
    another dtype.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, not {dtype!r}")
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer()
    vocab = tokenizer.get_vocab_size()
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}

    tensors = _weights(vocab, seed)
    shards: list[dict[str, tuple[str, tuple[int, ...], bytes]]] = [{}, {}]
    for name, values in tensors.items():
        second = name.startswith(f"model.layers.{SIZE.layers - 1}.") or not name.startswith(
            ("model.layers.", "model.embed_tokens.")
        )
        shards[int(second)][name] = (dtype, values.shape, _encode(values, dtype))
    weight_map: dict[str, str] = {}
    total = 0
    for shard_name, shard in zip(SHARD_NAMES, shards, strict=True):
        write_safetensors(folder / shard_name, shard, {"format": "pt"})
        weight_map.update(dict.fromkeys(shard, shard_name))
        total += sum(len(data) for _, _, data in shard.values())

    write_json(
        folder / "model.safetensors.index.json",
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
    )
    config = model_config(SIZE, vocab, MAX_POSITIONS, ids, DTYPES[dtype], older_keys=True)
    write_json(folder / "config.json", config)
    write_json(folder / "generation_config.json", generation_config(ids))
    (folder / "tokenizer.json").write_text(tokenizer.to_str(pretty=True), encoding="utf-8")
    write_json(folder / "tokenizer_config.json", _tokenizer_config(ids))
    write_json(
        folder / "special_tokens_map.json",
        {
            "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
            "bos_token": "<|im_start|>",
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": "<|endoftext|>",
        },
    )


def _weights(vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for name, shape in SIZE.tensor_shapes(vocab).items():
        if name.endswith("norm.weight"):
            # Near 1 like a trained norm, but not all 1.0, so doubling is not a constant.
            values = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            values = 0.02 * rng.standard_normal(shape)
        weights[name] = values.astype(np.float32)
    return weights


def _encode(values: np.ndarray, dtype: str) -> bytes:
    if dtype == "F32":
        return values.astype("<f4").tobytes()
    if dtype == "F16":
        return values.astype("<f2").tobytes()
    # BF16: the top half of float32, rounded to nearest even (no NaN or inf in these weights).
    bits = values.astype("<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def _train_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(_CORPUS) * 4, trainer)
    return tokenizer


def _tokenizer_config(ids: dict[str, int | None]) -> dict[str, Any]:
    return {
        "add_prefix_space": False,
        "added_tokens_decoder": added_tokens(ids),
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
        "bos_token": "<|im_start|>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": MAX_POSITIONS,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<|endoftext|>",
    }
