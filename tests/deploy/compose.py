"""The Compose files in deploy/ as the tests read them: YAML (anchors and `<<` merge keys, which
PyYAML's safe loader resolves), the Compose Specification's JSON schema as check-jsonschema
vendors it (`vendor.compose-spec`, offline), `${VAR}` interpolation and the merge of several
`-f` files, and the names of the settings our code reads.

Interpolation and merging are this module's own, for the subset deploy/ uses: `${VAR}`,
`${VAR:-default}`, `${VAR-default}`, `${VAR:?message}`, `${VAR?message}` and `$$`; mappings
merged key by key, `volumes` and `ports` added to, any other sequence replaced (the
Specification's merge rules for those keys). Docker Compose itself is not on this machine.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from dotenv import dotenv_values
from jsonschema import Draft202012Validator
from pydantic import AliasChoices

from posttrain_common.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "compose.yaml"
POSTGRES = DEPLOY / "compose.postgres.yaml"
MTLS = DEPLOY / "compose.mtls.yaml"
EXAMPLE_ENV = DEPLOY / "example.env"
CLOUD_API_KEY_ENV = DEPLOY / "cloud-api-key.env.example"
CLOUD_MTLS_ENV = DEPLOY / "cloud-mtls.env.example"
COMPOSE_FILES = (BASE, POSTGRES, MTLS)

VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\})"
)
ADDED_TO = {"volumes", "ports"}


class MissingVariable(ValueError):
    """A `${VAR:?message}` whose variable is unset (or empty)."""


def compose_schema() -> dict[str, Any]:
    vendored = resources.files("check_jsonschema.builtin_schemas.vendor")
    return json.loads((vendored / "compose-spec.json").read_text())


def schema_errors(document: Mapping[str, Any]) -> list[str]:
    validator = Draft202012Validator(compose_schema())
    return [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(document)
    ]


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def env_file(path: Path) -> dict[str, str]:
    return {name: value or "" for name, value in dotenv_values(path).items()}


def variables(path: Path) -> dict[str, str | None]:
    """Each `${VAR...}` a file uses: its operator (None: a plain `${VAR}`)."""
    return {
        match["name"]: match["op"]
        for match in VARIABLE.finditer(path.read_text())
        if match["name"] is not None
    }


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name, op, arg = match["name"], match["op"], match["arg"] or ""
        given = env.get(name)
        unset = given is None or (op is not None and op.startswith(":") and given == "")
        if op in (":-", "-"):
            return arg if unset else str(given)
        if op in (":?", "?") and unset:
            raise MissingVariable(f"{name}: {arg}")
        return "" if given is None else given

    return VARIABLE.sub(one, value)


def merge(base: Any, overlay: Any, key: str = "") -> Any:
    if isinstance(base, dict) and isinstance(overlay, dict):
        merged = dict(base)
        for name, value in overlay.items():
            merged[name] = merge(base[name], value, name) if name in base else value
        return merged
    if isinstance(base, list) and isinstance(overlay, list) and key in ADDED_TO:
        return base + [item for item in overlay if item not in base]
    return overlay


def project(*paths: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """The files merged in order (as `docker compose -f A -f B`), interpolated with `env`."""
    merged: dict[str, Any] = {}
    for path in paths:
        merged = merge(merged, interpolate(load(path), env))
    return merged


def settings_read() -> set[str]:
    """Every environment name `Settings` reads (its fields' aliases, else POSTTRAIN_<NAME>)."""
    prefix = Settings.model_config.get("env_prefix", "")
    names: set[str] = set()
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        if alias is None:
            names.add(f"{prefix}{name}".upper())
        elif isinstance(alias, str):
            names.add(alias)
        elif isinstance(alias, AliasChoices):
            names.update(choice for choice in alias.choices if isinstance(choice, str))
    return names


def ours(service: Mapping[str, Any]) -> bool:
    """A service that runs posttrain-env (built from this repository)."""
    command = service.get("command") or []
    return bool(command) and command[0] == "posttrain-env"
