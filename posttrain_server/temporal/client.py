"""How every process of ours connects to Temporal: one runtime per process, the pydantic data
converter, the SDK core's own log forwarded to Python logging, and, for a Temporal of your own,
its TLS and API key (docs/deployment.md, "Production shape")."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)
from temporalio.service import TLSConfig

from posttrain_common.settings import Settings

CORE_LOGGER = "temporalio.core"


@functools.cache
def core_runtime(metrics_address: str | None = None) -> Runtime:
    """The process's Temporal runtime (one per process), forwarding the SDK core's own log to
    Python logging as `temporalio.core`. That log is where a payload over Temporal's limit
    shows (`TMPRL1103` at ERROR: the workflow task then fails in a loop), so the server's log
    and the tests see it. `metrics_address` (`host:port`): where the SDK core serves its own
    Prometheus metrics (`temporal_*`: polls, task latencies, schedule-to-start; see Temporal's
    SDK metrics reference); None: they are not collected."""
    return Runtime(
        telemetry=TelemetryConfig(
            metrics=None
            if metrics_address is None
            else PrometheusConfig(metrics_address, durations_as_seconds=True),
            logging=LoggingConfig(
                filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
                forwarding=LogForwardingConfig(
                    logger=logging.getLogger(CORE_LOGGER), append_target_to_name=False
                ),
            ),
        )
    )


def tls_config(settings: Settings) -> bool | TLSConfig | None:
    """What `Client.connect` takes as `tls`: None (plain, or TLS when an API key is given: the
    SDK's own default), False (TEMPORAL_TLS=false), True (TLS with the system's roots), or a
    TLSConfig with the certificates read now (they may have been rotated since the start)."""

    def read(path: Path | None) -> bytes | None:
        return path.read_bytes() if path is not None else None

    ca = read(settings.temporal_tls_server_ca_cert_path)
    cert = read(settings.temporal_tls_client_cert_path)
    key = read(settings.temporal_tls_client_key_path)
    if settings.temporal_tls is False:
        return False
    if ca or cert or key or settings.temporal_tls_server_name:
        return TLSConfig(
            server_root_ca_cert=ca,
            client_cert=cert,
            client_private_key=key,
            domain=settings.temporal_tls_server_name,
        )
    return settings.temporal_tls


def sdk_metrics_address(settings: Settings) -> str | None:
    """`host:port` of the SDK's own metrics (POSTTRAIN_TEMPORAL_METRICS_PORT), or None."""
    port = settings.temporal_metrics_port
    return None if port is None else f"{settings.metrics_host}:{port}"


async def connect(settings: Settings, *, serve_sdk_metrics: bool = False) -> Client:
    """A client of `settings`' Temporal. `serve_sdk_metrics`: the SDK core serves its own
    metrics where POSTTRAIN_TEMPORAL_METRICS_PORT says; only the long-running processes ask for
    it (`server`, `worker`, `agent-worker`). A one-shot command never does: an operator's shell
    holds the deployment's settings, and that port is the running processes' (a command that
    tried would fail on it, "Address already in use"). Raises SystemExit when the port cannot be
    served."""
    api_key = settings.temporal_api_key
    address = sdk_metrics_address(settings) if serve_sdk_metrics else None
    # Called without an argument when there is none: bench/_probe.py swaps in its own runtime.
    try:
        runtime = core_runtime() if address is None else core_runtime(address)
    except ValueError as exc:  # the SDK's word for a port it cannot bind
        raise SystemExit(
            f"cannot serve the Temporal SDK's metrics on {address} "
            f"(POSTTRAIN_TEMPORAL_METRICS_PORT, POSTTRAIN_METRICS_HOST): {exc}"
        ) from None
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        api_key=api_key.get_secret_value() if api_key is not None else None,
        tls=tls_config(settings),
        data_converter=pydantic_data_converter,
        runtime=runtime,
    )
