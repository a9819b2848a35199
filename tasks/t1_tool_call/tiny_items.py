"""The items of `t1_tool_call_tiny`: small function schemas and one-sentence requests, generated.

    uv run python tasks/t1_tool_call/tiny_items.py      rewrite the tiny member's three files

writes, beside this file, the tiny member's dev and hidden splits (`tiny_dev.jsonl`,
`tiny_hidden.jsonl`: one item per line, the family's item format, see evaluator.py) and its
contamination test items (`tiny_test_items.jsonl`: `{"id", "text"}`, the hidden requests). A
test checks the shipped files against this code, so they change only with it.

The distribution: eight functions (a timer, the weather, a unit conversion, a message, a
calendar event, a song, a restaurant table, a stock price), each offered with two others drawn
at random in a random order; the request is one sentence of the chosen function's phrasings
with random values (numbers, words from lists of ten), and the expected call names that
function with those values. Optional parameters are asked for in some phrasings only. About
25,500 distinct requests, most of them conversions (`request_space` counts them; some
functions have few: 10 weather requests without a unit), so the two splits never share a
request, but a script that draws many items will meet hidden requests: the reference solution
draws its training data the same way (it repeats `draw_item`; a test checks the two against
each other) and keeps it in memory, out of what the contamination check reads.

Standard library only: the reference solution and the tests import nothing else for it.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
DEV_FILE, HIDDEN_FILE, TEST_ITEMS_FILE = (
    "tiny_dev.jsonl",
    "tiny_hidden.jsonl",
    "tiny_test_items.jsonl",
)
DEV_ITEMS, HIDDEN_ITEMS = 100, 200
DEV_SEED, HIDDEN_SEED = "t1_tool_call_tiny/dev/1", "t1_tool_call_tiny/hidden/1"
TOOLS_PER_ITEM = 3

CITIES = ["paris", "tokyo", "lima", "oslo", "cairo", "delhi", "rome", "quito", "seoul", "dakar"]
NAMES = ["ana", "bob", "chen", "dara", "eli", "fay", "gus", "hana", "ivan", "jo"]
WORDS = ["hello", "thanks", "later", "yes", "no", "soon", "ok", "ready", "sorry", "bye"]
SONGS = ["blue", "rain", "home", "fire", "gold", "ocean", "dawn", "stars", "river", "snow"]
SYMBOLS = ["abc", "xyz", "qrs", "lmn", "def", "tuv", "ghi", "opq", "jkl", "wxy"]
DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
LENGTHS = ["m", "km", "mi", "ft"]
UNITS = ["celsius", "fahrenheit"]


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def _p(kind: str, description: str, enum: list[str] | None = None) -> dict[str, Any]:
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


def request(rng: random.Random, name: str) -> tuple[str, dict[str, Any]]:
    """One request for the function `name` and the arguments it asks for (optional ones only
    when the request names them)."""
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
        value: int | float = rng.randint(1, 999)
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


def request_space() -> dict[str, int]:
    """How many distinct requests each function has (the distribution's size)."""
    decimals = len({v / 10 for v in range(1, 1000)} | set(range(1, 1000)))
    pairs = len(LENGTHS) * (len(LENGTHS) - 1)
    return {
        "set_timer": 999,
        "get_weather": len(CITIES) * (1 + len(UNITS)),
        "convert_length": decimals * pairs,
        "send_message": len(NAMES) * len(WORDS),
        "add_event": len(DAYS) * 24,
        "play_song": len(SONGS) * (1 + 100),
        "book_table": 12 * len(CITIES),
        "get_stock": len(SYMBOLS) * (1 + 30),
    }


def draw_item(rng: random.Random) -> tuple[list[dict], str, str, dict[str, Any]]:
    """One item: the tools offered (the right one among TOOLS_PER_ITEM, in random order), the
    request, and the expected call's name and arguments."""
    name = rng.choice(FUNCTIONS)
    offered = [name, *rng.sample([f for f in FUNCTIONS if f != name], TOOLS_PER_ITEM - 1)]
    rng.shuffle(offered)
    text, arguments = request(rng, name)
    return [TOOLS[f] for f in offered], text, name, arguments


def as_item(item_id: str, tools: list[dict], text: str, name: str, arguments: dict) -> dict:
    """The family's item format: each expected argument is a list of its accepted values; an
    optional parameter the request does not name accepts "" (may be left out)."""
    parameters = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == name)
    expected: dict[str, list[Any]] = {}
    for parameter in parameters["properties"]:
        if parameter in arguments:
            expected[parameter] = [arguments[parameter]]
        elif parameter not in parameters["required"]:
            expected[parameter] = [""]
    return {
        "id": item_id,
        "messages": [{"role": "user", "content": text}],
        "tools": tools,
        "expected": {"name": name, "arguments": expected},
    }


def split(seed: str, count: int, avoid: frozenset[str], prefix: str) -> list[dict]:
    """`count` items with distinct requests drawn with `seed`, none of them in `avoid`."""
    rng = random.Random(seed)
    items: list[dict] = []
    seen: set[str] = set(avoid)
    while len(items) < count:
        tools, text, name, arguments = draw_item(rng)
        if text in seen:
            continue
        seen.add(text)
        items.append(as_item(f"{prefix}_{len(items)}", tools, text, name, arguments))
    return items


def splits() -> tuple[list[dict], list[dict]]:
    """The dev and hidden splits (disjoint requests)."""
    dev = split(DEV_SEED, DEV_ITEMS, frozenset(), "tiny_dev")
    hidden = split(
        HIDDEN_SEED, HIDDEN_ITEMS, frozenset(i["messages"][0]["content"] for i in dev), "tiny"
    )
    return dev, hidden


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, sort_keys=True, separators=(",", ":")) + "\n" for row in rows)


def files() -> dict[str, str]:
    """The three files' contents by name."""
    dev, hidden = splits()
    test_items = [{"id": i["id"], "text": i["messages"][0]["content"]} for i in hidden]
    return {DEV_FILE: jsonl(dev), HIDDEN_FILE: jsonl(hidden), TEST_ITEMS_FILE: jsonl(test_items)}


if __name__ == "__main__":
    for file_name, text in files().items():
        (HERE / file_name).write_text(text, encoding="utf-8")
        print(f"wrote {file_name}: {text.count(chr(10))} items", file=sys.stderr)
