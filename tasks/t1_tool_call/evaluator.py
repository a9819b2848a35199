#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "torch==2.13.0",
#     "transformers==5.23.0",
#     "safetensors==0.8.0",
# ]
# [tool.uv]
# exclude-newer = "2026-11-30T00:00:00Z"
# ///
# torch and transformers live in the job's venv, not the server's: nothing to check them with.
# pyright: reportMissingImports=false
"""The evaluator of the tool-calling task family (`t1_tool_call` and its `_tiny` member): how
often the post-trained model answers a request with the right function call, BFCL-style.

Its parameters come from the task's `[evaluation]` table (POSTTRAIN_TASK_PARAMS, JSON):
`source`, where the splits come from, and the generation settings of tasks/generation_kit.py
(`max_new_tokens`, `batch_size`, `engine`, `gpu_memory_utilization`):

    "files"  `dev_file` and `hidden_file`, JSON Lines files of the family's folder in the item
             format below, embedded into this script by tasks.registry.evaluator_script
             (which fills EMBEDDED_FILES from the `files` list): the tiny member
    "bfcl"   the Berkeley Function Calling Leaderboard's own files, as the `bfcl-eval` wheel
             ships them (`posttrain-env tasks fetch t1_tool_call` extracts them into the family's
             folder; tasks/t1_tool_call/fetch.py), embedded the same way: the hidden split is
             the category `hidden_file` names ("simple_python", with its `possible_answer/`
             twin), the dev split `dev_items` items of the category `dev_file` names
             ("live_simple") drawn with `dev_seed`; converted to the item format by `bfcl_item`

Inputs as every evaluator's (tasks/evaluator_kit.py, `grader_inputs`): /base_model
(everything but the weights), /model (only its checked `*.safetensors`), POSTTRAIN_NONCE, and
POSTTRAIN_HIDDEN_SPLIT_SEED, whose presence makes this a grading of the hidden split (both
splits are public data; the seed is not used).

An item is one JSON object per line:

    {"id": str, "messages": [{"role": "user", "content": str}, ...],
     "tools": [{"type": "function", "function": {"name", "description",
                "parameters": {"type": "object", "properties": {...}, "required": [...]}}}],
     "expected": {"name": str, "arguments": {param: [accepted value, ...]}},
     "function": {...}}  # optional: the expected function as BFCL describes it (its own type
                         # names), which the scoring checks against; else the offered schema

Generation. Each item's messages go through the base model's chat template with the item's
`tools` (`apply_chat_template(messages, tools=...)`: the template decides how the model sees
them), and the model replies greedily, at most `max_new_tokens` tokens (the generation kit:
transformers on the CPU, vLLM on a GPU, one setting). No item, reply or call is ever printed:
the log holds counts only.

Scoring, one item at a time: BFCL's AST check for one call (`simple_function_checker` of
bfcl_eval/eval_checker/ast_eval/ast_checker.py in bfcl-eval 2026.3.23, for Python), ported
rule for rule in `call_matches`, after the reply is read as a call:

1. The reply, stripped of surrounding whitespace and of one enclosing `<tool_call>` ...
   `</tool_call>` pair if there is one (the tags Qwen2.5's template asks for), must be exactly
   one JSON object `{"name": <string>, "arguments": <object>}` and nothing else (no other key,
   no text before or after, no NaN or Infinity). Otherwise it is unparsed (BFCL: a decoding
   failure or a wrong number of calls).
2. `name` must equal the expected function's name exactly.
3. Every parameter the function lists as required must be in `arguments`, and every key of
   `arguments` must be a parameter of the function that the expected call lists.
4. Types, as BFCL's `type_checker`: the value's Python type must be exactly the one its schema
   type names (`string` str, `integer` int, `float` float, `boolean` bool, `array` and `tuple`
   list, `dict` dict, `any` str; JSON Schema's `number` and `object` read as `float` and
   `dict`), an int given for a `float` counting as that float; an array's elements checked
   against its `items` type, one level deep. A value of another type still passes when it has
   the type of the accepted values (BFCL's "variable": an answer given as a name), and is then
   compared exactly.
5. Values: a string after BFCL's `standardize_string` (lowercased; spaces and `, . / - _ * ^`
   removed; `'` read as `"`) among the accepted strings so standardized; a list the same way
   element by element, in order; a dict key by key against each accepted dict (every key one
   it lists, each value among that key's accepted values, every key it requires given); a
   list of dicts dict by dict; anything else equal (Python's `==`) to an accepted value.
6. A parameter the expected call lists but the reply leaves out fails unless its accepted
   values include "" (an optional parameter that may be omitted).

score = correct / n on the split; the score line also counts `parsed` (step 1 passed) and
`name_ok` (steps 1-2 passed).

Faults: the generation kit's. The artifact is checked (headers, then values, in isolated
children capped by the base model's size) before any model code: a bad artifact scores 0 with
`artifact_valid: false` and the reason; a fault not the artifact's (malformed parameters or
items, a model run failing after the checks passed) is the grader's: no score line, exit 2.

Output: exactly one `POSTTRAIN_SCORE <nonce> {json}` line with `score`, `n`, `parsed`,
`name_ok`, `correct`, `split`, `artifact_valid` and the generation's engine, device and token
count.
"""

import base64
import json
import lzma
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

from tasks.evaluator_kit import GraderFault, final_line, grader_inputs, run_grader
from tasks.generation_kit import GENERATION_KEYS, generate, settings_from

PARAMS_ENV = "POSTTRAIN_TASK_PARAMS"
# Filled by tasks.registry.evaluator_script with the `[evaluation] files` (LZMA, then base85);
# empty when this file runs from the repository, which reads them beside it.
EMBEDDED_FILES: dict[str, str] = {}
PARAM_KEYS = (
    "source",
    "files",
    "dev_file",
    "hidden_file",
    "dev_items",
    "dev_seed",
    "data_dependencies",  # read by tasks/registry.py (added to this header), never here
    *GENERATION_KEYS,
)
SOURCES = ("files", "bfcl")
# Where BFCL keeps a category's accepted answers: a folder of that name beside its questions.
BFCL_ANSWERS = "possible_answer"
# BFCL's Python type names, as JSON Schema's ("any" has none: the type is dropped).
BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
# What each schema type must be in Python: BFCL's PYTHON_TYPE_MAPPING, and JSON Schema's names
# for the same types (the tiny member's schemas use them).
PYTHON_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
    "number": float,
    "object": dict,
}
# The types whose elements are checked (one level), as BFCL's PYTHON_NESTED_TYPE_CHECK_LIST.
NESTED_TYPES = ("array", "tuple")
# More items than any split here has; a file beyond it is the task's mistake.
MAX_ITEMS = 10_000
# The tags Qwen2.5's chat template asks a tool call to be wrapped in.
TOOL_CALL_TAGS = ("<tool_call>", "</tool_call>")
# BFCL's string normalisation (its `standardize_string`): these characters are removed.
_IGNORED_CHARACTERS = re.compile(r"[ \,\.\/\-\_\*\^]")


# -- the parameters and the items -----------------------------------------------------------------


def task_params(raw: str | None) -> dict[str, Any]:
    """The task's parameters. Raises GraderFault if they are malformed (they come from the
    task's spec, never from the agent)."""
    try:
        params = json.loads(raw) if raw else {}
    except ValueError:
        raise GraderFault(f"{PARAMS_ENV} is not JSON") from None
    if not isinstance(params, dict) or not set(params) <= set(PARAM_KEYS):
        raise GraderFault(f"{PARAMS_ENV} must be an object with keys among {sorted(PARAM_KEYS)}")
    source = params.setdefault("source", "files")
    if source not in SOURCES:
        raise GraderFault(f"{PARAMS_ENV}: source must be one of {', '.join(SOURCES)}")
    for key in ("dev_file", "hidden_file"):
        if not isinstance(params.get(key), str) or params[key] not in params.get("files", []):
            raise GraderFault(f"{PARAMS_ENV}: {key} must name one of `files`")
    if source == "bfcl":
        count, seed = params.get("dev_items"), params.get("dev_seed")
        if not isinstance(seed, str):
            raise GraderFault(f"{PARAMS_ENV}: source 'bfcl' needs dev_seed")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise GraderFault(f"{PARAMS_ENV}: dev_items must be a positive integer")
        for key in ("dev_file", "hidden_file"):
            if answers_file(params[key]) not in params["files"]:
                raise GraderFault(
                    f"{PARAMS_ENV}: `files` must hold {key}'s answers, {answers_file(params[key])}"
                )
    settings_from(params)  # checked now: a malformed setting fails before any work
    return params


def file_text(name: str) -> str:
    """An items file: embedded in this script, or beside it (run from the repository)."""
    if EMBEDDED_FILES:
        if name not in EMBEDDED_FILES:
            raise GraderFault(f"the items file {name!r} is not embedded in this evaluator")
        return lzma.decompress(base64.b85decode(EMBEDDED_FILES[name])).decode("utf-8")
    path = Path(__file__).parent / name
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise GraderFault(f"the items file {name!r} cannot be read: {exc}") from None


def answers_file(questions: str) -> str:
    """Where BFCL keeps the accepted answers of a category's questions file."""
    folder, _, name = questions.rpartition("/")
    return f"{folder}/{BFCL_ANSWERS}/{name}" if folder else f"{BFCL_ANSWERS}/{name}"


def load_items(text: str) -> list[dict[str, Any]]:
    """The items of a JSON Lines text. Raises GraderFault for a malformed one (the task's data)."""
    items = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise GraderFault(f"items line {number} is not JSON") from None
        problem = item_problem(item)
        if problem:
            raise GraderFault(f"items line {number}: {problem}")
        items.append(item)
        if len(items) > MAX_ITEMS:
            raise GraderFault(f"more than {MAX_ITEMS} items")
    if not items:
        raise GraderFault("the split has no items")
    return items


def item_problem(item: Any) -> str:
    """Why `item` is not in the family's format ("" if it is)."""
    if not isinstance(item, dict) or not {"id", "messages", "tools", "expected"} <= set(item):
        return "an item needs id, messages, tools and expected"
    messages, tools, expected = item["messages"], item["tools"], item["expected"]
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list"
    if not isinstance(tools, list) or not all(_function_of(tool) for tool in tools):
        return "tools must be a list of function schemas"
    if not isinstance(expected, dict) or not isinstance(expected.get("name"), str):
        return "expected needs a name"
    arguments = expected.get("arguments")
    if not isinstance(arguments, dict) or not all(isinstance(v, list) for v in arguments.values()):
        return "expected arguments must map each parameter to its accepted values"
    if schema_of(tools, expected["name"]) is None:
        return "the expected function is not among the tools"
    function = item.get("function")
    if function is not None and (
        _function_of(function) is None or function["name"] != expected["name"]
    ):
        return "function must be the expected function's description"
    return ""


def _function_of(tool: Any) -> dict[str, Any] | None:
    """A tool's function schema: `{"type": "function", "function": {...}}` or the bare one."""
    function = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return None
    parameters = function.get("parameters", {})
    if not isinstance(parameters, dict) or not isinstance(parameters.get("properties", {}), dict):
        return None
    return function


def schema_of(tools: list[Any], name: str) -> dict[str, Any] | None:
    """The parameters schema of the offered function `name`, or None."""
    for tool in tools:
        function = _function_of(tool)
        if function is not None and function["name"] == name:
            return function.get("parameters", {})
    return None


def split_items(params: dict[str, Any], *, hidden: bool) -> list[dict[str, Any]]:
    """The dev or the hidden split, from the source the parameters name."""
    name = params["hidden_file" if hidden else "dev_file"]
    if params["source"] == "files":
        return load_items(file_text(name))
    items = bfcl_items(file_text(name), file_text(answers_file(name)), name)
    if hidden:
        return items
    chosen = random.Random(params["dev_seed"]).sample(
        range(len(items)), min(params["dev_items"], len(items))
    )
    return [items[n] for n in sorted(chosen)]


def bfcl_items(questions: str, answers: str, name: str) -> list[dict[str, Any]]:
    """A BFCL category's items in the family's format (single-call items only), from its
    question file's text and its answers' twin, each one JSON object per line. Raises
    GraderFault when they are malformed (the data is the grader's)."""
    items = []
    try:
        pairs = zip(
            (json.loads(q) for q in questions.splitlines() if q.strip()),
            (json.loads(a) for a in answers.splitlines() if a.strip()),
            strict=True,
        )
        for question, answer in pairs:
            item = bfcl_item(question, answer)
            if item is not None:
                items.append(item)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise GraderFault(f"BFCL's {name} is not in the expected format: {exc}") from None
    problems = [problem for problem in map(item_problem, items) if problem]
    if problems or not items:
        raise GraderFault(f"BFCL's {name}: {problems[0] if problems else 'no single-call item'}")
    if len(items) > MAX_ITEMS:
        raise GraderFault(f"BFCL's {name}: more than {MAX_ITEMS} items")
    return items


def bfcl_item(question: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any] | None:
    """One BFCL item and its answer in the family's format, or None for an answer of more than
    one call. BFCL: `{"id", "question": [[message, ...]], "function": [schema, ...]}` and
    `{"id", "ground_truth": [{name: {param: [accepted values]}}]}` ("" among a parameter's
    values: it may be left out). The first turn's messages, each function wrapped as a tool
    (`{"type": "function", "function": ...}`, what chat templates expect) with JSON Schema's
    type names, and the single call as `{"name", "arguments"}`."""
    if question["id"] != answer["id"]:
        raise ValueError(f"question {question['id']!r} is paired with answer {answer['id']!r}")
    calls = answer["ground_truth"]
    if len(calls) != 1 or len(calls[0]) != 1:
        return None
    ((name, arguments),) = calls[0].items()
    tools = [
        {"type": "function", "function": {**f, "parameters": json_schema(f["parameters"])}}
        for f in question["function"]
    ]
    messages = list(question["question"][0])
    (function,) = [f for f in question["function"] if f["name"] == name] or [None]
    return {
        "id": question["id"],
        "messages": messages,
        "tools": tools,
        "expected": {"name": name, "arguments": arguments},
        # BFCL's own description of the expected function: its type names are what the
        # scoring checks (JSON Schema's, in `tools`, lose "any" and "tuple").
        "function": function,
    }


def json_schema(schema: Any) -> Any:
    """A BFCL parameter schema with JSON Schema's type names, recursively."""
    if not isinstance(schema, dict):
        return schema
    converted = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            if value != "any":
                converted[key] = BFCL_TYPES.get(value, value)
        elif key == "properties" and isinstance(value, dict):
            converted[key] = {name: json_schema(entry) for name, entry in value.items()}
        elif key in ("items", "additionalProperties"):
            converted[key] = json_schema(value)
        else:
            converted[key] = value
    return converted


# -- the scoring (BFCL's AST check; the rules are in the module's docstring) ------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_call(reply: str) -> dict[str, Any] | None:
    """The call in a reply (rule 1), or None."""
    text = reply.strip()
    opening, closing = TOOL_CALL_TAGS
    if text.startswith(opening) and text.endswith(closing):
        text = text[len(opening) : -len(closing)].strip()
    try:
        call = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None
    if (
        not isinstance(call, dict)
        or set(call) != {"name", "arguments"}
        or not isinstance(call["name"], str)
        or not isinstance(call["arguments"], dict)
    ):
        return None
    return call


def standardized(text: str) -> str:
    """BFCL's `standardize_string`."""
    return _IGNORED_CHARACTERS.sub("", text).lower().replace("'", '"')


def _answer_type(accepted: list[Any]) -> type | None:
    """The type of the accepted values (BFCL's `get_possible_answer_type`), "" aside."""
    for answer in accepted:
        if answer != "":
            return type(answer)
    return None


def type_check(
    value: Any, accepted: list[Any], expected: type | None, nested: type | None
) -> tuple[bool, bool]:
    """Rule 4, BFCL's `type_checker`: (the value passes, it is a "variable"). A variable is a
    value of the accepted values' type where the schema names another: compared exactly."""
    answer_type = _answer_type(accepted)
    is_variable = answer_type is not None and answer_type != expected
    valid = True
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        for answer in accepted:
            if type(answer) is not list or all(
                type_check(element, answer, nested, None)[0] for element in value
            ):
                return True, is_variable
        valid = False  # and, as BFCL does, a variable of the answers' type still returns
    if answer_type is not None and type(value) is answer_type:
        return valid, True
    return False, is_variable


def _standardized_value(value: Any) -> Any:
    return standardized(value) if type(value) is str else value


def string_matches(value: str, accepted: list[Any]) -> bool:
    """BFCL's `string_checker`."""
    return standardized(value) in [standardized(a) for a in accepted if type(a) is str]


def list_matches(value: list[Any], accepted: list[Any]) -> bool:
    """BFCL's `list_checker`: element by element, strings standardized (an accepted "" reads
    as the empty list, as BFCL's loop over its characters makes it)."""
    got = [_standardized_value(v) for v in value]
    wanted = [
        [_standardized_value(v) for v in answer]
        for answer in accepted
        if type(answer) in (list, str)
    ]
    return got in wanted


def dict_matches(value: dict[str, Any], accepted: list[Any]) -> bool:
    """BFCL's `dict_checker`: against each accepted dict (each key's value a list of accepted
    values; "" among them: the key may be left out)."""
    for answer in accepted:
        if answer == "" or not isinstance(answer, dict):
            continue
        ok = all(
            key in answer
            and _standardized_value(v) in [_standardized_value(a) for a in answer[key]]
            for key, v in value.items()
        )
        if ok and all(key in value or "" in values for key, values in answer.items()):
            return True
    return False


def list_of_dicts_matches(value: list[Any], accepted: list[Any]) -> bool:
    """BFCL's `list_dict_checker`: the dicts in order, against each accepted list."""
    for answer in accepted:
        if not isinstance(answer, list) or len(value) != len(answer):
            continue
        if all(
            isinstance(v, dict) and dict_matches(v, [a]) for v, a in zip(value, answer, strict=True)
        ):
            return True
    return False


def checked_function(item: dict[str, Any]) -> dict[str, Any]:
    """The expected function as the scoring checks it: BFCL's description when the item has
    it, else the offered tool's schema."""
    if item.get("function"):
        return item["function"]
    for tool in item["tools"]:
        function = _function_of(tool)
        if function is not None and function["name"] == item["expected"]["name"]:
            return function
    raise GraderFault(f"item {item['id']!r}: the expected function is not among its tools")


def call_matches(call: dict[str, Any], item: dict[str, Any]) -> bool:
    """Rules 2-6: the parsed call is the item's expected call (BFCL's
    `simple_function_checker`, Python)."""
    expected = item["expected"]
    if call["name"] != expected["name"]:
        return False
    parameters = checked_function(item).get("parameters", {})
    properties: dict[str, Any] = parameters.get("properties", {})
    accepted: dict[str, list[Any]] = expected["arguments"]
    arguments: dict[str, Any] = call["arguments"]
    if any(name not in arguments for name in parameters.get("required", [])):
        return False
    for name, given in arguments.items():
        value: Any = given
        if name not in properties or name not in accepted:
            return False
        schema = properties[name] if isinstance(properties[name], dict) else {}
        kind = schema.get("type")
        wanted = PYTHON_TYPES.get(kind) if isinstance(kind, str) else None
        nested = None
        if kind in NESTED_TYPES:
            items = schema.get("items")
            inner = items.get("type") if isinstance(items, dict) else None
            nested = PYTHON_TYPES.get(inner) if isinstance(inner, str) else None
        if wanted is float and type(value) is int:
            value = float(value)  # BFCL: Python's own int-to-float
        if wanted is None:
            # A type Python's checker has no entry for (BFCL itself fails on it): only a
            # value equal to an accepted one passes.
            if value not in accepted[name]:
                return False
            continue
        valid, is_variable = type_check(value, accepted[name], wanted, nested)
        if not valid:
            return False
        if not is_variable:
            if wanted is dict:
                ok = dict_matches(value, accepted[name])
            elif wanted is list and nested is dict:
                ok = list_of_dicts_matches(value, accepted[name])
            elif wanted is str:
                ok = string_matches(value, accepted[name])
            elif wanted is list:
                ok = list_matches(value, accepted[name])
            else:
                ok = value in accepted[name]
            if not ok:
                return False
            continue
        if value not in accepted[name]:
            return False
    return all(name in arguments or "" in values for name, values in accepted.items())


def score_replies(items: list[dict[str, Any]], replies: list[str]) -> dict[str, int]:
    """The counts over a split: parsed, name_ok, correct."""
    parsed = name_ok = correct = 0
    for item, reply in zip(items, replies, strict=True):
        call = parse_call(reply)
        if call is None:
            continue
        parsed += 1
        name_ok += call["name"] == item["expected"]["name"]
        correct += call_matches(call, item)
    return {"parsed": parsed, "name_ok": name_ok, "correct": correct}


# -- the job ------------------------------------------------------------------------------------


def evaluate(environ: dict[str, str]) -> str:
    """The score line for this job's artifact; raises GraderFault for faults not the artifact's."""
    job = grader_inputs(environ)
    params = task_params(environ.get(PARAMS_ENV))
    if not (job.base_dir / "config.json").is_file():
        raise GraderFault(f"the base model in {job.base_dir} has no config.json")
    items = split_items(params, hidden=job.hidden_seed is not None)
    started = time.monotonic()
    n = len(items)
    payload: dict[str, Any] = {"n": n, "parsed": 0, "name_ok": 0, "correct": 0}
    generation = generate(
        job,
        [item["messages"] for item in items],
        settings_from(params),
        tools=[item["tools"] for item in items],
    )
    if not generation.artifact_valid:
        payload |= {"score": 0.0, "artifact_valid": False, "reason": generation.reason}
        return final_line(job, payload, started)
    counts = score_replies(items, generation.texts)
    payload |= counts | {
        "score": counts["correct"] / n,
        "artifact_valid": True,
        "engine": generation.engine,
        "device": generation.device,
        "generated_tokens": generation.generated_tokens,
        "generation_s": generation.generation_s,
        "files": list(generation.files),
        "reason": "" if counts["correct"] == n else f"{n - counts['correct']} of {n} not right",
    }
    if generation.engine_note:
        payload["engine_note"] = generation.engine_note
    return final_line(job, payload, started)


if __name__ == "__main__":
    sys.exit(run_grader(evaluate, "tool-calling evaluator"))
