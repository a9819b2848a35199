"""What the generated models share: the Llama layout's tensor names and shapes, the special
tokens, the configuration files, and how their JSON is written (every byte of it is part of a
model's revision: a change here changes both models' revisions)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAD, START, END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, START, END)
# Recorded in the configs as the version their keys were written for; nothing is imported.
TRANSFORMERS_VERSION = "4.46.0"


@dataclass(frozen=True)
class LlamaSize:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def tensor_shapes(self, vocab: int) -> dict[str, tuple[int, ...]]:
        """The standard Llama tensor names and shapes for this size (untied embeddings)."""
        hidden, head_dim = self.hidden, self.head_dim
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
        for layer in range(self.layers):
            prefix = f"model.layers.{layer}."
            shapes |= {
                prefix + "self_attn.q_proj.weight": (self.heads * head_dim, hidden),
                prefix + "self_attn.k_proj.weight": (self.kv_heads * head_dim, hidden),
                prefix + "self_attn.v_proj.weight": (self.kv_heads * head_dim, hidden),
                prefix + "self_attn.o_proj.weight": (hidden, self.heads * head_dim),
                prefix + "mlp.gate_proj.weight": (self.intermediate, hidden),
                prefix + "mlp.up_proj.weight": (self.intermediate, hidden),
                prefix + "mlp.down_proj.weight": (hidden, self.intermediate),
                prefix + "input_layernorm.weight": (hidden,),
                prefix + "post_attention_layernorm.weight": (hidden,),
            }
        shapes["model.norm.weight"] = (hidden,)
        shapes["lm_head.weight"] = (vocab, hidden)
        return shapes


def model_config(
    size: LlamaSize,
    vocab: int,
    max_positions: int,
    ids: dict[str, Any],
    torch_dtype: str,
    *,
    older_keys: bool = False,
) -> dict[str, Any]:
    """config.json for `LlamaForCausalLM`; `older_keys` adds two keys that older versions of
    transformers wrote (`rope_scaling`, `pretraining_tp`), as tiny-causal-lm has them."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": size.hidden,
        "intermediate_size": size.intermediate,
        "num_hidden_layers": size.layers,
        "num_attention_heads": size.heads,
        "num_key_value_heads": size.kv_heads,
        "head_dim": size.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        **({"rope_scaling": None} if older_keys else {}),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        **({"pretraining_tp": 1} if older_keys else {}),
        "tie_word_embeddings": False,
        "use_cache": True,
        **_token_ids(ids),
        "torch_dtype": torch_dtype,
        "transformers_version": TRANSFORMERS_VERSION,
    }


def generation_config(ids: dict[str, Any]) -> dict[str, Any]:
    """generation_config.json: the special tokens' ids."""
    return {
        "_from_model_config": True,
        **_token_ids(ids),
        "transformers_version": TRANSFORMERS_VERSION,
    }


def _token_ids(ids: dict[str, Any]) -> dict[str, Any]:
    return {"bos_token_id": ids[START], "eos_token_id": ids[END], "pad_token_id": ids[PAD]}


def added_tokens(ids: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """tokenizer_config.json's `added_tokens_decoder`: each special token by its id."""
    return {
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


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Two-space indented, keys in the order given, a final newline (the bytes are part of the
    model's revision: do not change them)."""
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
