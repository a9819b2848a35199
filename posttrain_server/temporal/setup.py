"""The search attributes our workflows upsert must exist in the namespace before any of them
runs (an upsert of an unknown attribute fails the workflow task, over and over).

- `missing_search_attributes`: what `server` and `worker` check before they start;
- `register_search_attributes`: `posttrain-env temporal setup` on a self-hosted cluster, through
  the operator service, idempotently (only the missing ones are added);
- `tcld_commands`: what to run instead on Temporal Cloud, whose operator service does not add
  search attributes.

The `tcld` syntax was checked against tcld's own source (temporalio/tcld, `app/namespace.go`
and its generated reference `app/commandsgen/tcld.yml`): `tcld namespace search-attributes
add` takes `--namespace` (the namespace id, `<name>.<account>`; required) and
`--search-attribute "name=type"`, which may be given many times (types: Keyword, Text, Int,
Double, Datetime, Bool, KeywordList). Each run is one update of the namespace (an asynchronous
operation), and it refuses the whole update when any attribute it names exists already; so
one command adds all of ours at once, and on a namespace that has some of them already the
ones it has are left out of the line by hand.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client

from workflows.operations.search_attributes import SEARCH_ATTRIBUTES, type_name

SETUP_COMMAND = "posttrain-env temporal setup"


class SearchAttributeSetupError(RuntimeError):
    """The namespace has one of our attributes with another type: a person must decide."""


@dataclass(frozen=True)
class Missing:
    names: list[str]

    def refusal(self, namespace: str, address: str) -> str:
        return (
            f"the Temporal namespace {namespace!r} at {address} lacks the search attributes "
            f"{', '.join(self.names)}, which episodes and jobs upsert for operators. Register "
            f"them once with `{SETUP_COMMAND}` (same TEMPORAL_ADDRESS and TEMPORAL_NAMESPACE), "
            "then start again."
        )


def is_cloud(address: str) -> bool:
    return ".tmprl.cloud" in address


async def _registered(client: Client) -> dict[str, int]:
    answer = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    return {name: int(kind) for name, kind in answer.custom_attributes.items()}


async def missing_search_attributes(client: Client) -> Missing:
    """Our attributes the namespace lacks. Raises SearchAttributeSetupError when one exists
    with another type."""
    registered = await _registered(client)
    _check_types(registered)
    return Missing([key.name for key in SEARCH_ATTRIBUTES if key.name not in registered])


async def register_search_attributes(client: Client) -> list[str]:
    """Add the attributes the namespace lacks; the names added ([] when all were there)."""
    missing = await missing_search_attributes(client)
    if not missing.names:
        return []
    await add_search_attributes(client, missing.names)
    return missing.names


async def add_search_attributes(client: Client, names: list[str] | None = None) -> None:
    """Add our attributes named `names` (default: all) without looking first (the
    time-skipping test server implements adding but not listing)."""
    wanted = {key.name: key for key in SEARCH_ATTRIBUTES}
    await client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=client.namespace,
            search_attributes={
                name: IndexedValueType.ValueType(int(wanted[name].indexed_value_type))
                for name in (names if names is not None else list(wanted))
            },
        )
    )


async def require_search_attributes(client: Client, address: str) -> None:
    """What `server` and `worker` check first: SystemExit(2), with a message on stderr naming
    `posttrain-env temporal setup` when the namespace lacks our attributes (every episode's
    first upsert would otherwise fail its workflow task, again and again)."""
    try:
        missing = await missing_search_attributes(client)
    except SearchAttributeSetupError as exc:
        print(f"posttrain-env: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if missing.names:
        print(f"posttrain-env: {missing.refusal(client.namespace, address)}", file=sys.stderr)
        raise SystemExit(2)


def tcld_commands(namespace: str) -> list[str]:
    """The `tcld` command that registers our attributes on a Temporal Cloud namespace, as the
    lines of one shell command (each but the last ending in a backslash), after a comment."""
    flags = [f"--search-attribute {key.name}={type_name(key)}" for key in SEARCH_ATTRIBUTES]
    parts = [f"tcld namespace search-attributes add --namespace {shlex.quote(namespace)}", *flags]
    return [
        "# one update of the namespace; tcld refuses it whole if one of these exists already:"
        " leave those out",
        *[f"  {part} \\" if n else f"{part} \\" for n, part in enumerate(parts[:-1])],
        f"  {parts[-1]}",
    ]


def _check_types(registered: dict[str, int]) -> None:
    wrong = [
        f"{key.name} is {IndexedValueType.Name(registered[key.name])} (wanted {type_name(key)})"  # type: ignore[arg-type]
        for key in SEARCH_ATTRIBUTES
        if key.name in registered and registered[key.name] != int(key.indexed_value_type)
    ]
    if wrong:
        raise SearchAttributeSetupError(
            "search attributes exist with another type: "
            + "; ".join(wrong)
            + ". Remove them (`temporal operator search-attribute remove`) or use another "
            "namespace."
        )
