"""How our processes reach a Temporal of your own (docs/deployment.md, "The same shape for
real"): Temporal's own environment names for its API key and TLS reach `Client.connect`, a wrong
combination or an unreadable certificate stops a process before it starts (naming the setting,
never the key), and TLS asked for really is spoken on the wire."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.client import Client
from temporalio.service import TLSConfig

from posttrain_common.settings import Settings
from posttrain_server.temporal import client as temporal_client
from posttrain_server.temporal.client import connect
from tests.gateway.production import run_to_exit
from tests.workflows.test_worker_restart import dev_server

API_KEY = "tmprl-api-key-not-a-real-one-0123456789"


@pytest.fixture(autouse=True)
def _no_temporal_settings_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TEMPORAL_"):
            monkeypatch.delenv(name)


@pytest.fixture
def pem_files(tmp_path: Path) -> dict[str, Path]:
    files = {}
    for name in ("client_pem", "client_key", "ca_pem"):
        files[name] = tmp_path / name.replace("_", ".")
        files[name].write_bytes(f"-----BEGIN {name}-----\n".encode())
    return files


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


def settings(tmp_path: Path, **env: str) -> Settings:
    return Settings(state_dir=tmp_path / "state", **env)


async def test_mtls_certificates_a_server_name_and_an_api_key_reach_client_connect(
    tmp_path: Path, pem_files: dict[str, Path], recorded: Recorded
) -> None:
    given = settings(
        tmp_path,
        TEMPORAL_ADDRESS="ns.acct.tmprl.cloud:7233",
        TEMPORAL_NAMESPACE="ns.acct",
        TEMPORAL_API_KEY=API_KEY,
        TEMPORAL_TLS_CLIENT_CERT_PATH=str(pem_files["client_pem"]),
        TEMPORAL_TLS_CLIENT_KEY_PATH=str(pem_files["client_key"]),
        TEMPORAL_TLS_SERVER_CA_CERT_PATH=str(pem_files["ca_pem"]),
        TEMPORAL_TLS_SERVER_NAME="temporal.internal",
    )
    await connect(given)
    [(address, kwargs)] = recorded.calls
    assert address == "ns.acct.tmprl.cloud:7233" and kwargs["namespace"] == "ns.acct"
    assert kwargs["api_key"] == API_KEY
    assert kwargs["tls"] == TLSConfig(
        server_root_ca_cert=pem_files["ca_pem"].read_bytes(),
        client_cert=pem_files["client_pem"].read_bytes(),
        client_private_key=pem_files["client_key"].read_bytes(),
        domain="temporal.internal",
    )
    assert API_KEY not in repr(given)


@pytest.mark.parametrize(
    ("env", "tls"),
    [
        ({}, None),  # plain, as a self-hosted cluster inside a private network may be
        ({"TEMPORAL_API_KEY": API_KEY}, None),  # the SDK turns TLS on for an API key itself
        ({"TEMPORAL_TLS": "true"}, True),  # TLS with the system's roots
        ({"TEMPORAL_TLS": "false", "TEMPORAL_API_KEY": API_KEY}, False),
    ],
)
async def test_tls_on_off_or_left_to_the_sdk_reaches_client_connect(
    tmp_path: Path, recorded: Recorded, env: dict[str, str], tls: bool | None
) -> None:
    await connect(settings(tmp_path, TEMPORAL_ADDRESS="temporal.example:7233", **env))
    [(_, kwargs)] = recorded.calls
    assert kwargs["tls"] == tls
    assert kwargs["api_key"] == env.get("TEMPORAL_API_KEY")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "TEMPORAL_API_KEY set without TEMPORAL_ADDRESS"),
        (
            {"TEMPORAL_ADDRESS": "t:7233", "TEMPORAL_TLS_CLIENT_CERT_PATH": "{client_pem}"},
            "TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH go together",
        ),
        (
            {"TEMPORAL_ADDRESS": "t:7233", "TEMPORAL_TLS_SERVER_CA_CERT_PATH": "{missing}"},
            "TEMPORAL_TLS_SERVER_CA_CERT_PATH={missing}: cannot be read",
        ),
        (
            {
                "TEMPORAL_ADDRESS": "t:7233",
                "TEMPORAL_TLS": "false",
                "TEMPORAL_TLS_SERVER_CA_CERT_PATH": "{ca_pem}",
            },
            "TEMPORAL_TLS=false contradicts TEMPORAL_TLS_SERVER_CA_CERT_PATH",
        ),
    ],
)
def test_temporal_settings_that_cannot_work_are_refused_naming_them_never_the_key(
    tmp_path: Path, pem_files: dict[str, Path], env: dict[str, str], expected: str
) -> None:
    paths = {name: str(path) for name, path in pem_files.items()} | {
        "missing": str(tmp_path / "missing.pem")
    }
    env = {name: value.format(**paths) for name, value in env.items()}
    with pytest.raises(ValidationError) as refused:
        settings(tmp_path, TEMPORAL_API_KEY=API_KEY, **env)
    assert expected.format(**paths) in str(refused.value)
    assert API_KEY not in str(refused.value)


def test_a_worker_with_an_unreadable_client_certificate_exits_2_naming_the_setting(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTTRAIN_", "TEMPORAL_"))}
    missing = tmp_path / "client.pem"
    env |= {
        "POSTTRAIN_STATE_DIR": str(tmp_path / "state"),
        "POSTTRAIN_BACKEND": "fake",
        "TEMPORAL_ADDRESS": "127.0.0.1:1",
        "TEMPORAL_TLS_CLIENT_CERT_PATH": str(missing),
        "TEMPORAL_TLS_CLIENT_KEY_PATH": str(missing),
    }
    done = run_to_exit(["worker"], env)
    assert done.returncode == 2, done.stderr
    assert f"TEMPORAL_TLS_CLIENT_CERT_PATH={missing}: cannot be read" in done.stderr
    assert "Traceback" not in done.stderr


async def test_tls_asked_for_is_spoken_on_the_wire_a_plain_server_refuses_it(
    tmp_path: Path,
) -> None:
    async with dev_server(tmp_path / "temporal.db") as (address, _client):
        plain = await connect(settings(tmp_path, TEMPORAL_ADDRESS=address))
        assert isinstance(plain, Client)
        with pytest.raises(RuntimeError):
            await connect(settings(tmp_path, TEMPORAL_ADDRESS=address, TEMPORAL_TLS="true"))
