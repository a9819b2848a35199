"""deploy/'s example env files (docs/deployment.md, "Temporal Cloud"), loaded as our processes
load them, through `Settings`: Temporal Cloud with an API key or with a client certificate
reaches `Client.connect` as TLS with that key or certificate, the API key's TLS is really spoken
(a plain dev server refuses it), and every name in the files is a setting our code reads or a
variable the Compose files use."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from temporalio.service import TLSConfig

from posttrain_common.settings import Settings
from posttrain_server.temporal import client as temporal_client
from posttrain_server.temporal.client import connect
from posttrain_server.temporal.setup import is_cloud
from tests.deploy.compose import (
    CLOUD_API_KEY_ENV,
    CLOUD_MTLS_ENV,
    COMPOSE_FILES,
    EXAMPLE_ENV,
    env_file,
    settings_read,
    variables,
)
from tests.workflows.test_worker_restart import dev_server

# What an operator puts in place of the examples' <placeholders> (none of these is real).
PLACEHOLDERS = {"<ns>": "posttrain", "<account>": "a1b2c", "<api key>": "not-a-real-api-key"}
NAMESPACE = "posttrain.a1b2c"
ADDRESS = "posttrain.a1b2c.tmprl.cloud:7233"


@pytest.fixture(autouse=True)
def _no_settings_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("TEMPORAL_", "POSTTRAIN_")):
            monkeypatch.delenv(name)


def filled(path: Path) -> dict[str, str]:
    env = env_file(path)
    for name, value in env.items():
        for placeholder, real in PLACEHOLDERS.items():
            value = value.replace(placeholder, real)
        env[name] = value
    assert not any("<" in value for value in env.values()), env
    return env


def load_settings(env: dict[str, str], tmp_path: Path) -> Settings:
    # Settings reads the environment by its aliases: give it the file's lines as environment.
    read = settings_read()
    return Settings(
        state_dir=tmp_path / "state",
        **{name: value for name, value in env.items() if name in read},  # pyright: ignore[reportArgumentType]
    )


class Recorded:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def connect(self, target_host: str, **kwargs: Any) -> str:
        self.calls.append((target_host, kwargs))
        return "a client"


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Recorded:
    recorder = Recorded()
    monkeypatch.setattr(temporal_client.Client, "connect", recorder.connect)
    return recorder


@pytest.mark.parametrize("path", [EXAMPLE_ENV, CLOUD_API_KEY_ENV, CLOUD_MTLS_ENV])
def test_every_name_in_an_example_is_read_by_our_code_or_by_compose(path: Path) -> None:
    used_by_compose = set().union(*(variables(f) for f in COMPOSE_FILES))
    unknown = set(env_file(path)) - settings_read() - used_by_compose
    assert unknown == set(), f"{path.name} sets {sorted(unknown)}, which nothing reads"


async def test_temporal_cloud_with_an_api_key_reaches_client_connect(
    tmp_path: Path, recorded: Recorded
) -> None:
    settings = load_settings(filled(CLOUD_API_KEY_ENV), tmp_path)
    assert settings.temporal_is_external and is_cloud(settings.temporal_address)
    await connect(settings)
    [(address, kwargs)] = recorded.calls
    assert (address, kwargs["namespace"]) == (ADDRESS, NAMESPACE)
    assert kwargs["api_key"] == PLACEHOLDERS["<api key>"]
    assert kwargs["tls"] is None  # the SDK turns TLS on for an API key (checked on the wire below)
    assert PLACEHOLDERS["<api key>"] not in repr(settings)


def with_certificates(env: dict[str, str], certificates: Path) -> dict[str, str]:
    """The example's paths are inside the container; here the same files in a folder of ours."""
    certificates.mkdir()
    for name in ("TEMPORAL_TLS_CLIENT_CERT_PATH", "TEMPORAL_TLS_CLIENT_KEY_PATH"):
        assert env[name].startswith("/etc/temporal-tls/")  # where compose.mtls.yaml mounts them
        env[name] = str(certificates / Path(env[name]).name)
        Path(env[name]).write_bytes(f"-----BEGIN {name}-----\n".encode())
    return env


async def test_temporal_cloud_with_a_client_certificate_reaches_client_connect(
    tmp_path: Path, recorded: Recorded
) -> None:
    certificates = tmp_path / "temporal-tls"
    env = with_certificates(filled(CLOUD_MTLS_ENV), certificates)
    settings = load_settings(env, tmp_path)
    await connect(settings)
    [(address, kwargs)] = recorded.calls
    assert (address, kwargs["namespace"]) == (ADDRESS, NAMESPACE)
    assert kwargs["api_key"] is None
    assert kwargs["tls"] == TLSConfig(
        client_cert=(certificates / "client.pem").read_bytes(),
        client_private_key=(certificates / "client.key").read_bytes(),
    )


def test_the_mtls_example_without_its_certificates_stops_a_process_naming_the_setting(
    tmp_path: Path,
) -> None:
    with pytest.raises(ValueError, match="TEMPORAL_TLS_CLIENT_CERT_PATH=/etc/temporal-tls/"):
        load_settings(filled(CLOUD_MTLS_ENV), tmp_path)


async def test_the_api_key_examples_tls_is_spoken_on_the_wire(tmp_path: Path) -> None:
    """The Cloud example's settings against a plain server of ours: the TLS handshake fails,
    where the same address without the API key connects."""
    async with dev_server(tmp_path / "temporal.db") as (address, _client):
        env = filled(CLOUD_API_KEY_ENV) | {"TEMPORAL_ADDRESS": address}
        with pytest.raises(RuntimeError):
            await connect(load_settings(env, tmp_path))
        env.pop("TEMPORAL_API_KEY")
        plain = await connect(load_settings(env, tmp_path))
        assert plain.namespace == NAMESPACE
