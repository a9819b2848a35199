#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "torch==2.13.0",
#     "transformers==5.23.0",
#     "safetensors==0.8.0",
# ]
# ///
# torch and transformers live in the job's venv, not the server's: nothing to check them with.
# pyright: reportMissingImports=false
"""Reference solution of the tool-calling family's tiny member (`t1_tool_call_tiny`):
supervised fine-tuning on generated calls.

The job script a good agent submits: it reads the base model from /base_model, draws items of
the task's distribution (tools, a request, the expected call; the job has no network), renders
each request with its tools through the base model's own chat template, exactly as the
evaluator does, trains the model to reply with the call as one compact JSON object
`{"name": ..., "arguments": {...}}` and the end of turn (the arguments' values weighing more
in the loss than the format), and writes the weights as safetensors
to /data/outputs in the base model's dtype and tensor names. Its training data stays in memory:
nothing of it is written where the contamination check reads.

    python reference_solution.py [BASE_DIR [OUTPUTS_DIR]]    defaults: /base_model /data/outputs

It repeats the tiny items generator (tasks/t1_tool_call/tiny_items.py; an agent's script is one
file); a test checks the two against each other. It never reads the dev or hidden items. The
Hugging Face member (`t1_tool_call`) is not served by this script: its distribution is BFCL's,
whose training data an agent brings as a mounted dataset (the task's prompt says so).
"""

import json
import math
import os
import random
import sys
import time
from pathlib import Path

STEPS = 1000
BATCH_SIZE = 32
LEARNING_RATE = 3e-3
# How much more an argument's value counts in the loss than the call's format.
VALUE_WEIGHT = 4.0
# The time the training loop may take whatever the step (the job's own timeout is longer);
# the learning-rate schedule ends with it.
MAX_TRAIN_SECONDS = float(os.environ.get("MAX_TRAIN_SECONDS", 20 * 60))
WARMUP = 0.1

# -- the distribution (as tasks/t1_tool_call/tiny_items.py draws it) -----------------------------

TOOLS_PER_ITEM = 3
CITIES = ["paris", "tokyo", "lima", "oslo", "cairo", "delhi", "rome", "quito", "seoul", "dakar"]
NAMES = ["ana", "bob", "chen", "dara", "eli", "fay", "gus", "hana", "ivan", "jo"]
WORDS = ["hello", "thanks", "later", "yes", "no", "soon", "ok", "ready", "sorry", "bye"]
SONGS = ["blue", "rain", "home", "fire", "gold", "ocean", "dawn", "stars", "river", "snow"]
SYMBOLS = ["abc", "xyz", "qrs", "lmn", "def", "tuv", "ghi", "opq", "jkl", "wxy"]
DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
LENGTHS = ["m", "km", "mi", "ft"]
UNITS = ["celsius", "fahrenheit"]


def _function(name: str, description: str, properties: dict, required: list) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def _p(kind: str, description: str, enum: list | None = None) -> dict:
    return {"type": kind, "description": description, **({"enum": enum} if enum else {})}


TOOLS = {
    "set_timer": _function(
        "set_timer", "Start a timer.", {"minutes": _p("integer", "length")}, ["minutes"]
    ),
    "get_weather": _function(
        "get_weather",
        "The weather in a city.",
        {"city": _p("string", "city"), "unit": _p("string", "unit", UNITS)},
        ["city"],
    ),
    "convert_length": _function(
        "convert_length",
        "Convert a length.",
        {
            "value": _p("number", "amount"),
            "source": _p("string", "from", LENGTHS),
            "target": _p("string", "to", LENGTHS),
        },
        ["value", "source", "target"],
    ),
    "send_message": _function(
        "send_message",
        "Send a text.",
        {"to": _p("string", "who"), "text": _p("string", "what")},
        ["to", "text"],
    ),
    "add_event": _function(
        "add_event",
        "Add a calendar event.",
        {"day": _p("string", "day", DAYS), "hour": _p("integer", "hour")},
        ["day", "hour"],
    ),
    "play_song": _function(
        "play_song",
        "Play a song.",
        {"title": _p("string", "title"), "volume": _p("integer", "volume")},
        ["title"],
    ),
    "book_table": _function(
        "book_table",
        "Book a restaurant table.",
        {"people": _p("integer", "guests"), "city": _p("string", "city")},
        ["people", "city"],
    ),
    "get_stock": _function(
        "get_stock",
        "A stock's price.",
        {"symbol": _p("string", "ticker"), "days": _p("integer", "history")},
        ["symbol"],
    ),
}
FUNCTIONS = sorted(TOOLS)


def request(rng: random.Random, name: str) -> tuple:
    """One request for the function `name` and the arguments it asks for."""
    if name == "set_timer":
        minutes = rng.randint(1, 999)
        return f"set a timer for {minutes} minutes", {"minutes": minutes}
    if name == "get_weather":
        city = rng.choice(CITIES)
        if rng.random() < 0.5:
            return f"what is the weather in {city}", {"city": city}
        unit = rng.choice(UNITS)
        return f"weather in {city} in {unit}", {"city": city, "unit": unit}
    if name == "convert_length":
        value = rng.randint(1, 999)
        if rng.random() < 0.3:
            value = value / 10
        source, target = rng.sample(LENGTHS, 2)
        return f"convert {value} {source} to {target}", {
            "value": value,
            "source": source,
            "target": target,
        }
    if name == "send_message":
        to, text = rng.choice(NAMES), rng.choice(WORDS)
        return f"text {to} saying {text}", {"to": to, "text": text}
    if name == "add_event":
        day, hour = rng.choice(DAYS), rng.randint(0, 23)
        return f"add an event on {day} at {hour}", {"day": day, "hour": hour}
    if name == "play_song":
        title = rng.choice(SONGS)
        if rng.random() < 0.5:
            return f"play the song {title}", {"title": title}
        volume = rng.randint(1, 100)
        return f"play {title} at volume {volume}", {"title": title, "volume": volume}
    if name == "book_table":
        people, city = rng.randint(1, 12), rng.choice(CITIES)
        return f"book a table for {people} in {city}", {"people": people, "city": city}
    if name == "get_stock":
        symbol = rng.choice(SYMBOLS)
        if rng.random() < 0.5:
            return f"price of {symbol} stock", {"symbol": symbol}
        days = rng.randint(1, 30)
        return f"price of {symbol} over {days} days", {"symbol": symbol, "days": days}
    raise ValueError(f"unknown function {name!r}")


def draw_item(rng: random.Random) -> tuple:
    """The tools offered, the request, the expected call's name and arguments."""
    name = rng.choice(FUNCTIONS)
    offered = [name, *rng.sample([f for f in FUNCTIONS if f != name], TOOLS_PER_ITEM - 1)]
    rng.shuffle(offered)
    text, arguments = request(rng, name)
    return [TOOLS[f] for f in offered], text, name, arguments


# -- training -----------------------------------------------------------------------------------


def learning_rate_factor(progress: float) -> float:
    """A linear warm-up from 1/25 over the first tenth, then a cosine decay to zero."""
    if progress < WARMUP:
        return 0.04 + 0.96 * progress / WARMUP
    return 0.5 * (1.0 + math.cos(math.pi * (progress - WARMUP) / (1.0 - WARMUP)))


def call_segments(name: str, arguments: dict) -> list:
    """The call as compact JSON, in (text, weight) pieces: each argument's value weighs
    VALUE_WEIGHT in the loss, the rest 1 (the format is learned in a few steps; copying the
    request's values is what takes long)."""
    segments = [('{"name":' + json.dumps(name) + ',"arguments":{', 1.0)]
    for n, (key, value) in enumerate(arguments.items()):
        segments.append((("," if n else "") + json.dumps(key) + ":", 1.0))
        segments.append((json.dumps(value), VALUE_WEIGHT))
    segments.append(("}}", 1.0))
    return segments


def examples(tokenizer, rng: random.Random, count: int) -> list:
    """(input ids, loss weights) pairs: the prompt as the evaluator builds it (the request with
    its tools, through the chat template), then the call and the end of turn; the loss is on
    the call only (weight 0 on the prompt)."""
    end = tokenizer.eos_token or ""
    pairs = []
    for _ in range(count):
        tools, text, name, arguments = draw_item(rng)
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            tools=tools,
            tokenize=False,
            add_generation_prompt=True,
        )
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        weights = [0.0] * len(ids)
        for piece, weight in [*call_segments(name, arguments), (end, 1.0)]:
            piece_ids = tokenizer(piece, add_special_tokens=False)["input_ids"]
            ids, weights = ids + piece_ids, weights + [weight] * len(piece_ids)
        pairs.append((ids, weights))
    return pairs


def weighted_loss(model, inputs: dict):
    """Next-token cross-entropy, each target token weighted (0 on the prompt and padding)."""
    import torch

    logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    targets, weights = inputs["input_ids"][:, 1:], inputs["weights"][:, 1:]
    losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="none"
    )
    return (losses * weights.reshape(-1)).sum() / weights.sum()


def batch(pairs: list, pad_id: int, device: str) -> dict:
    import torch

    width = max(len(ids) for ids, _ in pairs)
    ids = [ids + [pad_id] * (width - len(ids)) for ids, _ in pairs]
    weights = [w + [0.0] * (width - len(w)) for _, w in pairs]
    mask = [[1] * len(i) + [0] * (width - len(i)) for i, _ in pairs]
    return {
        "input_ids": torch.tensor(ids, device=device),
        "weights": torch.tensor(weights, device=device),
        "attention_mask": torch.tensor(mask, device=device),
    }


def main(base_dir: Path, outputs: Path) -> None:
    # Imported here, so that the generator above loads without them (a test compares it with
    # tiny_items.py's).
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    if device == "cpu":
        # A model this small: a second intra-op thread costs more in synchronisation than it
        # gains on a busy 2-core machine (as in the arithmetic family's reference solution).
        torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto")
    saved_dtype = model.dtype
    model.to(device=device, dtype=torch.float32).train()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    rng = random.Random(20261204)
    started = time.monotonic()
    for step in range(STEPS):
        # Whichever runs out first, steps or time, ends the schedule.
        progress = max(step / STEPS, (time.monotonic() - started) / MAX_TRAIN_SECONDS)
        if progress >= 1.0:
            print(f"stopping after {step} steps: the time budget is spent", flush=True)
            break
        for group in optimizer.param_groups:
            group["lr"] = LEARNING_RATE * learning_rate_factor(progress)
        inputs = batch(examples(tokenizer, rng, BATCH_SIZE), pad_id, device)
        loss = weighted_loss(model, inputs)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == STEPS - 1:
            print(
                f"step {step} loss {loss.item():.4f} ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
        if not math.isfinite(loss.item()):
            raise SystemExit("the loss is not finite; stopping")
    model.to(dtype=saved_dtype).eval()
    outputs.mkdir(parents=True, exist_ok=True)
    # Only safetensors weights count; the base model's names, dtypes and shapes are kept.
    model.save_pretrained(outputs, safe_serialization=True)
    print(f"wrote {sorted(p.name for p in outputs.iterdir())}", flush=True)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(
        Path(arguments[0]) if arguments else Path("/base_model"),
        Path(arguments[1]) if len(arguments) > 1 else Path("/data/outputs"),
    )
