"""The generated tiny model: deterministic, small, and a consistent Llama-style checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from tokenizers import Tokenizer

from activities.backends.local.hub import LocalHub
from tasks.models.tiny_causal_lm import SHARD_NAMES, SIZE, SPECIAL_TOKENS, write_tiny_model

HIDDEN = SIZE.hidden

FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    *SHARD_NAMES,
}


def contents(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def bf16_to_float32(raw: bytes) -> np.ndarray:
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


def test_the_model_has_every_file_a_loader_needs_and_stays_under_one_megabyte(
    tiny_model: Path,
) -> None:
    assert {path.name for path in tiny_model.iterdir()} == FILES
    assert sum(path.stat().st_size for path in tiny_model.iterdir()) < 1_000_000


def test_the_same_seed_writes_byte_identical_files_in_another_process(
    tiny_model: Path, tmp_path: Path
) -> None:
    # Another process: the tokenizer trainer must not depend on per-process hash seeds.
    code = "import sys; from pathlib import Path; "
    code += "from tasks.models.tiny_causal_lm import write_tiny_model; "
    code += "write_tiny_model(Path(sys.argv[1]))"
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=60)
    assert contents(tmp_path) == contents(tiny_model)


def test_another_seed_changes_the_weights_and_nothing_else(
    tiny_model: Path, tmp_path: Path
) -> None:
    write_tiny_model(tmp_path, seed=1)
    ours, theirs = contents(tiny_model), contents(tmp_path)
    differing = {name for name in ours if ours[name] != theirs[name]}
    assert differing == set(SHARD_NAMES)


def test_the_shards_load_with_safetensors_and_match_the_config_and_index(tiny_model: Path) -> None:
    config = json.loads((tiny_model / "config.json").read_text())
    index = json.loads((tiny_model / "model.safetensors.index.json").read_text())
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    for shard in SHARD_NAMES:
        with safe_open(str(tiny_model / shard), framework="numpy") as weights:
            assert weights.metadata() == {"format": "pt"}
            for name in weights.keys():
                part = weights.get_slice(name)
                found[name] = (part.get_dtype(), tuple(part.get_shape()))
                assert index["weight_map"][name] == shard
    assert found == {name: ("BF16", shape) for name, shape in SIZE.tensor_shapes(384).items()}
    assert set(index["weight_map"]) == set(found)
    assert found["model.norm.weight"] == ("BF16", (HIDDEN,))
    assert config["vocab_size"] == found["model.embed_tokens.weight"][1][0]
    assert config["hidden_size"] == found["model.norm.weight"][1][0]
    heads, kv_heads, head_dim = (
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
    )
    assert found["model.layers.0.self_attn.q_proj.weight"][1] == (heads * head_dim, HIDDEN)
    assert found["model.layers.0.self_attn.k_proj.weight"][1] == (kv_heads * head_dim, HIDDEN)
    assert found["model.layers.1.mlp.down_proj.weight"][1] == (
        HIDDEN,
        config["intermediate_size"],
    )
    assert not any(f"layers.{config['num_hidden_layers']}." in name for name in found)
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["torch_dtype"] == "bfloat16"
    total = sum((tiny_model / shard).stat().st_size for shard in SHARD_NAMES)
    assert 0 < index["metadata"]["total_size"] < total


def test_bf16_weights_are_the_float32_weights_rounded(tiny_model: Path, tmp_path: Path) -> None:
    write_tiny_model(tmp_path, dtype="F32")
    with safe_open(str(tmp_path / SHARD_NAMES[1]), framework="numpy") as weights:
        exact = weights.get_tensor("model.norm.weight")
    # numpy has no bfloat16: read the BF16 bytes through the header.
    data = (tiny_model / SHARD_NAMES[1]).read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    entry = json.loads(data[8 : 8 + header_len])["model.norm.weight"]
    assert entry["dtype"] == "BF16"
    begin, end = (8 + header_len + offset for offset in entry["data_offsets"])
    np.testing.assert_allclose(bf16_to_float32(data[begin:end]), exact, rtol=2**-8)
    assert not np.all(exact == 1.0)  # a trained-looking norm, so doubling is not a constant


def test_the_tokenizer_loads_round_trips_and_knows_the_chat_tokens(tiny_model: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    config = json.loads((tiny_model / "config.json").read_text())
    tokenizer_config = json.loads((tiny_model / "tokenizer_config.json").read_text())
    assert tokenizer.get_vocab_size() == config["vocab_size"]
    text = "What is (17 + 5) * 23? ANSWER: 506 — ünïcode too"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    assert (
        config["eos_token_id"]
        == ids["<|im_end|>"]
        == tokenizer_config_id(tokenizer_config, "<|im_end|>")
    )
    assert config["bos_token_id"] == ids["<|im_start|>"]
    assert tokenizer.encode("<|im_start|>user").ids[0] == ids["<|im_start|>"]
    assert "<|im_start|>" in tokenizer_config["chat_template"]
    assert "add_generation_prompt" in tokenizer_config["chat_template"]


def tokenizer_config_id(tokenizer_config: dict, token: str) -> int:
    (found,) = [
        int(key)
        for key, entry in tokenizer_config["added_tokens_decoder"].items()
        if entry["content"] == token
    ]
    return found


def test_an_unknown_dtype_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dtype must be one of"):
        write_tiny_model(tmp_path, dtype="I8")


@pytest.mark.parametrize(
    ("name", "revision"),
    [
        ("tiny-causal-lm", "1a1955789156426d8338498f0395ea9254f36911"),
        ("tiny-arith-lm", "606008daf1cfd19bb1f590b2423991e1ce4ba8e1"),
    ],
)
def test_the_local_hub_generates_each_model_at_its_known_revision(
    name: str, revision: str, tmp_path: Path
) -> None:
    """The revision (the files' hash) names a local episode's base model: a change to a writer,
    or to what it relies on (numpy's generator, the tokenizers BPE trainer), changes it for
    every user. If it must change, change it here on purpose."""
    hub = LocalHub(tmp_path)
    hub.ensure_generated(name)
    assert hub.resolve("models", name) == revision
