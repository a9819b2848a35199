"""The base model of `t0_arithmetic_format_tiny`, generated on this machine (no download).

    write_tiny_arith_model(folder, *, seed=0) -> None

A Llama-style causal LM that `transformers` loads as `LlamaForCausalLM`, made so that the task can
be learned on two CPU cores in minutes: a character-level tokenizer (every printable ASCII
character is one token, so digits are never merged), hidden size 128, 2 layers, F32 weights
(~0.3 M parameters), and a short chat template: `<|im_start|>{question}<|im_end|>`, after which
the model answers and ends its reply with `<|im_end|>`. Untrained: random weights, so the base
model answers nothing in the required format (its score is 0).

The same seed gives byte-identical files. `tiny-causal-lm` (tasks/tiny_model.py) is the other
generated model, for t0_artifact; the two do not share weights or tokenizers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models

from tasks.evaluator_kit import write_safetensors

HIDDEN = 128
INTERMEDIATE = 256
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
MAX_POSITIONS = 128
PAD, START, END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, START, END)
CHARACTERS = (*(chr(code) for code in range(32, 127)), "\n")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['content'] + '<|im_end|>' }}"
    "{% endfor %}"
)
TRANSFORMERS_VERSION = "4.46.0"  # recorded in the config as the keys' version; nothing imported
WEIGHTS = "model.safetensors"


def write_tiny_arith_model(folder: Path, *, seed: int = 0) -> None:
    """Write the model's files into `folder` (created if missing; files overwritten)."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {token: n for n, token in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}
    ids = {token: vocab[token] for token in SPECIAL_TOKENS}
    rng = np.random.default_rng(seed)
    tensors = {
        name: ("F32", shape, _values(name, shape, rng).astype("<f4").tobytes())
        for name, shape in tensor_shapes(len(vocab)).items()
    }
    write_safetensors(folder / WEIGHTS, tensors, {"format": "pt"})
    _write_json(folder / "config.json", _config(len(vocab), ids))
    _write_json(
        folder / "generation_config.json",
        {
            "_from_model_config": True,
            "bos_token_id": ids[START],
            "eos_token_id": ids[END],
            "pad_token_id": ids[PAD],
            "transformers_version": TRANSFORMERS_VERSION,
        },
    )
    (folder / "tokenizer.json").write_text(_tokenizer(vocab).to_str(pretty=True), encoding="utf-8")
    _write_json(
        folder / "tokenizer_config.json",
        {
            "added_tokens_decoder": {
                str(ids[token]): {
                    "content": token,
                    "lstrip": False,
                    "normalized": False,
                    "rstrip": False,
                    "single_word": False,
                    "special": True,
                }
                for token in SPECIAL_TOKENS
            },
            "bos_token": START,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": END,
            "model_max_length": MAX_POSITIONS,
            "pad_token": PAD,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": PAD,
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


def _config(vocab: int, ids: dict[str, int]) -> dict[str, Any]:
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
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": ids[START],
        "eos_token_id": ids[END],
        "pad_token_id": ids[PAD],
        "torch_dtype": "float32",
        "transformers_version": TRANSFORMERS_VERSION,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
