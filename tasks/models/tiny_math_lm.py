"""`tiny-math-lm`: the base model of `math_word_problems_tiny`, generated on this machine (no
download).

    generate(folder) -> None     the hub's model (seed 1)

The tiny arithmetic model's recipe (tasks/models/tiny_arith_lm.py: a Llama-style causal LM with
one token per printable ASCII character and the `<|im_start|>{question}<|im_end|>` chat
template), one layer deeper, since a word problem's numbers sit anywhere in a sentence of up to
about 75 characters: hidden size 128, 3 layers, F32 weights (~0.5 M parameters), 128 positions.
Untrained: random weights, so the base model never ends a reply with `#### <number>` (its score
is 0). The same seed gives byte-identical files.
"""

from __future__ import annotations

from pathlib import Path

from tasks.models._llama import LlamaSize
from tasks.models.tiny_arith_lm import write_tiny_arith_model

SIZE = LlamaSize(hidden=128, intermediate=256, layers=3, heads=4, kv_heads=2)
MAX_POSITIONS = 128


def generate(folder: Path) -> None:
    """The local hub's `tiny-math-lm` (its revision is these files' hash: keep them stable)."""
    write_tiny_arith_model(folder, seed=1, size=SIZE, max_positions=MAX_POSITIONS)
