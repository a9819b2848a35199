"""How every process of ours connects to Temporal: one runtime per process, the pydantic data
converter, the SDK core's own log forwarded to Python logging."""

from __future__ import annotations

import functools
import logging

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

from posttrain_env.settings import Settings

CORE_LOGGER = "temporalio.core"


@functools.cache
def core_runtime() -> Runtime:
    """The process's Temporal runtime (one per process), forwarding the SDK core's own log to
    Python logging as `temporalio.core`. That log is where a payload over Temporal's limit
    shows (`TMPRL1103` at ERROR: the workflow task then fails in a loop), so the server's log
    and the tests see it."""
    return Runtime(
        telemetry=TelemetryConfig(
            logging=LoggingConfig(
                filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
                forwarding=LogForwardingConfig(
                    logger=logging.getLogger(CORE_LOGGER), append_target_to_name=False
                ),
            )
        )
    )


async def connect(settings: Settings) -> Client:
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
        runtime=core_runtime(),
    )
