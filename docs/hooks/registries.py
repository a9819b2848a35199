"""MkDocs hook: fills the pages' generated parts from the project's registries at build time.

A page marks where a part goes with an HTML comment (`<!-- generated: tools -->`), which GitHub
shows as nothing; the built site shows the registry's content there. The tools reference comes
from `posttrain_env/tools.py` (`TOOLS`, the registry every path lists and validates from), the
error types and gateway codes from `posttrain_env/errors.py` (`ErrorType`, `GatewayCode`), the
backends from `activities/backends/registry.py` (`BACKENDS`). So a tool or a backend added to
its registry is documented by the next build, and no page counts them by hand.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `mkdocs build` from anywhere still finds the project's packages
    sys.path.insert(0, str(ROOT))


def prose(text: str) -> str:
    """Registry text as Markdown: `<repo_id>` outside code spans is text, not an HTML tag."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def cell(text: str) -> str:
    """Registry text that fits in one cell of a Markdown table."""
    return prose(text).replace("|", "\\|").replace("\n", " ")


def type_of(schema: dict[str, Any]) -> str:
    if "anyOf" in schema:
        return " or ".join(type_of(option) for option in schema["anyOf"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {type_of(schema.get('items', {}))}"
    return {"null": "null", "integer": "integer", "string": "string"}.get(kind, kind)


def bounds_of(schema: dict[str, Any]) -> list[str]:
    """The constraints JSON Schema states on a value (and on its items or options)."""
    found = []
    for key, word in (
        ("minimum", "≥ {}"),
        ("exclusiveMinimum", "> {}"),
        ("maximum", "≤ {}"),
        ("exclusiveMaximum", "< {}"),
        ("maxLength", "at most {} characters"),
        ("maxItems", "at most {} items"),
    ):
        if key in schema:
            found.append(word.format(schema[key]))
    if "items" in schema:
        found += [f"each {bound}" for bound in bounds_of(schema["items"])]
    for option in schema.get("anyOf", []):
        found += bounds_of(option)
    return found


def tools_reference() -> str:
    from posttrain_env.tools import TOOLS

    lines = [f"The registry holds {len(TOOLS)} tools: " + ", ".join(f"`{n}`" for n in TOOLS) + "."]
    for tool in TOOLS.values():
        schema = tool.args.model_json_schema()
        lines += ["", f"## `{tool.name}`", "", prose(tool.description), ""]
        properties: dict[str, Any] = schema.get("properties", {})
        if not properties:
            lines.append("No arguments.")
            continue
        required = set(schema.get("required", []))
        lines += [
            "| argument | type | required | default | what it is |",
            "|---|---|---|---|---|",
        ]
        for name, field in properties.items():
            default = json.dumps(field["default"]) if "default" in field else ""
            what = field.get("description", "")
            bounds = bounds_of(field)
            if bounds:
                what = f"{what} ({'; '.join(bounds)})" if what else "; ".join(bounds)
            lines.append(
                f"| `{name}` | {type_of(field)} | {'yes' if name in required else 'no'} "
                f"| {f'`{default}`' if default else ''} | {cell(what)} |"
            )
        if schema.get("additionalProperties") is False:
            lines += ["", "Any other argument is refused (`invalid_argument`, naming it)."]
    return "\n".join(lines)


def error_types() -> str:
    from posttrain_env.errors import ErrorType

    return ", ".join(f"`{error.value}`" for error in ErrorType) + "."


def gateway_codes() -> str:
    from posttrain_env.errors import GatewayCode

    return ", ".join(f"`{code.value}`" for code in GatewayCode) + "."


def backends() -> str:
    from activities.backends.registry import BACKENDS

    lines = [
        "| `POSTTRAIN_BACKEND` | what it is | spends money | watcher looks every | reaps orphans |",
        "|---|---|---|---|---|",
    ]
    for info in BACKENDS.values():
        caps = info.capabilities
        lines.append(
            f"| `{info.name}` | {cell(info.summary)} | {'yes' if caps.spends_money else 'no'} "
            f"| {caps.watch_interval_s:g} s | {'yes' if caps.reaps_orphans else 'no'} |"
        )
    return "\n".join(lines)


PARTS: dict[str, Callable[[], str]] = {
    "tools": tools_reference,
    "error-types": error_types,
    "gateway-codes": gateway_codes,
    "backends": backends,
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for name, make in PARTS.items():
        marker = f"<!-- generated: {name} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    if "<!-- generated:" in markdown:
        raise PluginError(f"{page.file.src_uri}: a generated part that no registry fills")
    return markdown
