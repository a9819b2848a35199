"""A few steps of TRL's GRPO on CPU against a running gateway, through `PostTrainTRL`.

Run by tests/training/test_trl_grpo.py with the Python of a venv that holds torch (CPU), trl and
transformers beside posttrain-env (none of them is a project dependency):

    python trl_grpo_run.py --base-url URL --task TASK --scripts SCRIPTS.json --out RESULT.json

The policy is a tiny one-layer Llama whose weights this script sets. Its vocabulary is a
byte-level BPE trained on the prompt, the chat template's special tokens, and each tool call's
body as one token. Its queries and keys are zero, so its attention is uniform: at each position
it sees the share of each kind of call among the tokens so far, beside the current token. That
picks the next token: after the assistant header `<tool_call>`; then, if no call was made,
`jobs_submit` with one of the scripts (equal odds), else the call after the last one made
(`jobs_wait` three times, then `submit`); then `</tool_call>` and the end of the turn: one call a
turn, five turns. Its chat template is TRL's own copy of Qwen3's, so TRL parses the calls with
its own Qwen3 parser. The attention, the embeddings and the MLP are frozen; GRPO trains the
head and the norms.

Writes RESULT.json: the steps the trainer ran, each scored batch (the rewards the reward function
answered, the advantages TRL computed from them), every rollout's outcome, the log history, and
the time of each step's training part (its optimizer update) beside its rollouts.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen3_chat_template

from posttrain_env.training.trl_env import PostTrainTRL

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PLAIN = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
# Logit weights on the normalized hidden state (the final RMSNorm makes a unit vector of 32
# dimensions about 5.7 long): a certain successor gets about SURE * 5.7; the first call's choice
# among the submits is FIRST ahead of the others; the share of a call made among the tokens so
# far (about 1/3000 here, times 5.7 after the norm) times HISTORY decides the next call.
SURE = 40.0
FIRST = 3.0
HISTORY = 8000.0


def body(name: str, arguments: dict[str, Any]) -> str:
    """A tool call's body, between the `<tool_call>` and `</tool_call>` control tokens."""
    return "\n" + json.dumps({"name": name, "arguments": arguments}) + "\n"


def build_policy(scripts: list[str], tools: list[Any], folder: Path) -> tuple[Any, Any]:
    """The tokenizer and the constructed Llama (module docstring)."""
    bodies = {
        "submit": [
            body("jobs_submit", {"script": s, "flavor": "cpu-basic", "timeout_minutes": 10})
            for s in scripts
        ],
        **{f"wait{n}": [body("jobs_wait", {"timeout_s": 60 + n})] for n in range(3)},
        "final": [body("submit", {})],
    }
    order = list(bodies)  # submit, wait0, wait1, wait2, final: one call a turn, in this order
    macros = [text for texts in bodies.values() for text in texts]
    tokenizer = _tokenizer(macros, tools)
    tid = tokenizer.convert_tokens_to_ids
    newline, opened, closed, end = (
        tid("\u010a"),
        tid("<tool_call>"),
        tid("</tool_call>"),
        tid("<|im_end|>"),
    )
    vocab, hidden = len(tokenizer), 32
    # Dimensions: 0..15 say which token this is (0: any other), 16.. say which calls were made.
    current = {newline: 1, opened: 2, closed: 3}
    for n, kind in enumerate(order):
        current |= {tid(text): 4 + n for text in bodies[kind]}
    made = {kind: 16 + n for n, kind in enumerate(order)}
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=end,
        pad_token_id=tid("<|endoftext|>"),
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        embed = torch.zeros(vocab, hidden)
        embed[:, 0] = 1.0
        for token, dim in current.items():
            embed[token] = 0.0
            embed[token, dim] = 1.0
        model.model.embed_tokens.weight.copy_(embed)
        layer = model.model.layers[0]
        # Queries and keys 0: every position attends evenly to all before it, so the attention
        # output is the share of each kind of call among the tokens so far.
        layer.self_attn.q_proj.weight.zero_()
        layer.self_attn.k_proj.weight.zero_()
        value = torch.zeros(hidden, hidden)
        for n, kind in enumerate(order):
            value[made[kind], 4 + n] = 1.0
        layer.self_attn.v_proj.weight.copy_(value)
        layer.self_attn.o_proj.weight.copy_(torch.eye(hidden))
        layer.mlp.down_proj.weight.zero_()
        head = torch.zeros(vocab, hidden)
        head[opened, 1] = SURE  # after the assistant header's newline: open a tool call
        head[closed, 4 : 4 + len(order)] = SURE  # after a call's body: close it
        head[end, 3] = SURE  # after the close: end the turn
        head[end, 0] = SURE  # anything else: end the turn
        for n, kind in enumerate(order):
            for text in bodies[kind]:
                head[tid(text), 2] = SURE + (FIRST if kind == "submit" else 0.0)
                if n > 0:  # the next call once the one before it was made
                    head[tid(text), made[order[n - 1]]] += HISTORY
                head[tid(text), made[kind]] -= HISTORY  # never the same call twice
        model.lm_head.weight.copy_(head)
    # The attention that counts the calls made, the embeddings and the MLP are frozen: an
    # optimizer step moves every weight by about the learning rate, which would drown the
    # history signal (a share of about 1/3000). GRPO trains the head and the norms.
    for module in (model.model.embed_tokens, layer.self_attn, layer.mlp):
        module.requires_grad_(False)
    model.generation_config.eos_token_id = end
    model.generation_config.pad_token_id = tid("<|endoftext|>")
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder)
    return model, tokenizer


def _tokenizer(macros: list[str], tools: list[Any]) -> Any:
    """A byte-level BPE trained on the prompt the chat template renders with these tools (so
    that the prompt is a few hundred tokens, not thousands), with the chat template's special
    tokens and each macro (a whole tool call) as one token."""

    def build(core: Tokenizer) -> Any:
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        core.decoder = decoders.ByteLevel()
        core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
        core.add_tokens([AddedToken(t, special=False, normalized=False) for t in PLAIN + macros])
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=core,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            padding_side="left",
        )
        tokenizer.chat_template = qwen3_chat_template
        return tokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    bytes_only = build(
        Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    )
    messages = [{"role": "user", "content": "Post-train the model."}]
    text = bytes_only.apply_chat_template(messages, tools=tools, tokenize=False)
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=2000, initial_alphabet=alphabet, special_tokens=SPECIAL, show_progress=False
    )
    core.train_from_iterator([text] * 4, trainer=trainer)
    return build(core)


class StepClock(TrainerCallback):
    """Each optimizer step's wall time, from the start of the step to its end."""

    def __init__(self) -> None:
        self.started = 0.0
        self.steps: list[float] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps.append(time.perf_counter() - self.started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--scripts", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--group", type=int, default=6)
    args = parser.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    scripts: list[str] = json.loads(args.scripts.read_text())
    updates: list[dict[str, Any]] = []

    class RecordingSampler:
        """An RFC 013 sampler that keeps every update it is given."""

        def update(self, task: Any, rewards: Any, costs: Any = None) -> None:
            updates.append({"task": task, "rewards": list(rewards), "costs": list(costs or [])})

    posttrain = PostTrainTRL(args.base_url, sampler=RecordingSampler(), message_timeout_s=300)
    probe = posttrain.environment()  # its tools, as TRL will list them
    tools = [
        getattr(probe, name)
        for name, _ in inspect.getmembers(type(probe), predicate=inspect.isfunction)
        if not name.startswith("_") and name != "reset"
    ]
    model, tokenizer = build_policy(scripts, tools, args.work / "policy")
    rows = args.steps
    dataset = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": "Post-train the model."}]] * rows,
            "task_id": [args.task] * rows,
        }
    )
    clock = StepClock()
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=posttrain.reward,
        train_dataset=dataset,
        environment_factory=posttrain.environment,
        callbacks=[clock],
        args=GRPOConfig(
            output_dir=str(args.work / "out"),
            max_steps=args.steps,
            per_device_train_batch_size=args.group,
            num_generations=args.group,
            max_completion_length=8192,
            max_tool_calling_iterations=5,
            learning_rate=1e-4,
            beta=0.0,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            seed=0,
            chat_template_kwargs={"enable_thinking": False},
        ),
    )
    batches: list[dict[str, Any]] = []
    score = trainer._generate_and_score_completions

    def scored(inputs: Any) -> Any:
        first = len(posttrain.outcomes)
        started = time.perf_counter()
        output = score(inputs)
        batches.append(
            {
                "rewards": [o.reward for o in posttrain.outcomes[first:]],
                "advantages": output["advantages"].tolist(),
                "seconds": time.perf_counter() - started,
            }
        )
        return output

    trainer._generate_and_score_completions = scored  # type: ignore[method-assign]
    trainer.train()
    posttrain.close()
    outcomes = [o.model_dump(mode="json") for o in posttrain.outcomes]
    result = {
        "global_step": trainer.state.global_step,
        "batches": batches,
        "sampler_updates": updates,
        "outcomes": outcomes,
        "log_history": trainer.state.log_history,
        "step_s": clock.steps,
        "scale_rewards": trainer.scale_rewards,
        "num_generations": trainer.num_generations,
    }
    args.out.write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
