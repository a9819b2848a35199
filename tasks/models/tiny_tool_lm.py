"""`tiny-tool-lm`: the base model of `t1_tool_call_tiny`, generated on this machine (no download).

    generate(folder) -> None                           the hub's model (seed 0)
    write_tiny_tool_model(folder, *, seed=0) -> None

A Llama-style causal LM that `transformers` loads as `LlamaForCausalLM`, the size of
`tiny-arith-lm` (hidden size 128, 2 layers, F32, one token per printable ASCII character) with
room for longer prompts (384 positions), and a chat template that renders the `tools` it is
given, as the real member's base model (Qwen2.5-Instruct) does, only much shorter (every
character is a token and a position the model must learn across): each tool as its name and
its parameters' names, `name(param,...)`, a required parameter marked `!`, all of them in one
turn before the conversation:

    <|im_start|>set_timer(minutes!);get_stock(symbol!,days)<|im_end|>
    <|im_start|>price of abc stock<|im_end|>

after which the model answers (a call is `{"name": ..., "arguments": {...}}`) and ends its
reply with `<|im_end|>`. The evaluator passes each item's tools to this template, so what the
model sees of them is what the template renders. Untrained: random weights, so the base model
emits no call (its score is 0). The same seed gives byte-identical files.
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.models import tiny_arith_lm
from tasks.models._llama import SPECIAL_TOKENS, generation_config, model_config, write_json

SIZE = tiny_arith_lm.SIZE
MAX_POSITIONS = 384
CHAT_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>' }}"
    "{%- for tool in tools %}"
    "{%- set f = tool.function if tool.function is defined else tool %}"
    "{{- f.name + '(' }}"
    "{%- for name, p in f.parameters.properties.items() %}"
    "{{- name }}{% if name in f.parameters.get('required', []) %}!{% endif %}"
    "{%- if not loop.last %},{% endif %}"
    "{%- endfor %}"
    "{{- ')' }}{% if not loop.last %};{% endif %}"
    "{%- endfor %}"
    "{{- '<|im_end|>' }}{% endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['content'] + '<|im_end|>' }}"
    "{%- endfor %}"
)


def generate(folder: Path) -> None:
    """The local hub's `tiny-tool-lm` (its revision is these files' hash: keep them stable)."""
    write_tiny_tool_model(folder, seed=0)


def write_tiny_tool_model(folder: Path, *, seed: int = 0) -> None:
    """Write the model's files into `folder` (created if missing; files overwritten): the tiny
    arithmetic model's weights and tokenizer (same seed, same layout), its own positions and
    chat template."""
    tiny_arith_lm.write_tiny_arith_model(folder, seed=seed)
    vocab_size = len(SPECIAL_TOKENS) + len(tiny_arith_lm.CHARACTERS)
    ids = {token: n for n, token in enumerate(SPECIAL_TOKENS)}
    write_json(
        folder / "config.json", model_config(SIZE, vocab_size, MAX_POSITIONS, ids, "float32")
    )
    write_json(folder / "generation_config.json", generation_config(ids))
    config_path = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text(encoding="utf-8"))
    tokenizer_config |= {"chat_template": CHAT_TEMPLATE, "model_max_length": MAX_POSITIONS}
    write_json(config_path, tokenizer_config)
