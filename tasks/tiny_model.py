"""A tiny Llama-style causal LM generated on this machine: no download, no torch (DESIGN §8).

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

import json
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tasks.evaluator_kit import write_safetensors

HIDDEN = 64
INTERMEDIATE = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
MAX_POSITIONS = 256
VOCAB_TARGET = 384
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Recorded in the config as the version these keys were written for; nothing is imported.
TRANSFORMERS_VERSION = "4.46.0"
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
        second = name.startswith(f"model.layers.{LAYERS - 1}.") or not name.startswith(
            ("model.layers.", "model.embed_tokens.")
        )
        shards[int(second)][name] = (dtype, values.shape, _encode(values, dtype))
    weight_map: dict[str, str] = {}
    total = 0
    for shard_name, shard in zip(SHARD_NAMES, shards, strict=True):
        write_safetensors(folder / shard_name, shard, {"format": "pt"})
        weight_map.update(dict.fromkeys(shard, shard_name))
        total += sum(len(data) for _, _, data in shard.values())

    _write_json(
        folder / "model.safetensors.index.json",
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
    )
    _write_json(folder / "config.json", _config(vocab, ids, DTYPES[dtype]))
    _write_json(
        folder / "generation_config.json",
        {
            "_from_model_config": True,
            "bos_token_id": ids["<|im_start|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
            "transformers_version": TRANSFORMERS_VERSION,
        },
    )
    (folder / "tokenizer.json").write_text(tokenizer.to_str(pretty=True), encoding="utf-8")
    _write_json(folder / "tokenizer_config.json", _tokenizer_config(ids))
    _write_json(
        folder / "special_tokens_map.json",
        {
            "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
            "bos_token": "<|im_start|>",
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": "<|endoftext|>",
        },
    )


def tensor_shapes(vocab: int) -> dict[str, tuple[int, ...]]:
    """The standard Llama tensor names and shapes for this size (untied embeddings)."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, HIDDEN)}
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}."
        shapes |= {
            prefix + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
            prefix + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
            prefix + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
            prefix + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
            prefix + "input_layernorm.weight": (HIDDEN,),
            prefix + "post_attention_layernorm.weight": (HIDDEN,),
        }
    shapes["model.norm.weight"] = (HIDDEN,)
    shapes["lm_head.weight"] = (vocab, HIDDEN)
    return shapes


def _weights(vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for name, shape in tensor_shapes(vocab).items():
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


def _config(vocab: int, ids: dict[str, int | None], torch_dtype: str) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": ids["<|im_start|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "torch_dtype": torch_dtype,
        "transformers_version": TRANSFORMERS_VERSION,
    }


def _tokenizer_config(ids: dict[str, int | None]) -> dict[str, Any]:
    added = {
        str(ids[token]): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    return {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
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


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
