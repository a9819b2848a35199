"""`posttrain-env temporal dev-server`: the Temporal dev server on its own, for the production
shape on one machine (gateways `server --no-worker`, workers, the agent worker, each started
with TEMPORAL_ADDRESS pointing here; docs/operations.md, "The Temporal server").

    posttrain-env temporal dev-server [--state-dir DIR] [--port 7233] [--ui-port 8233 | --no-ui]
                                      [--metrics-port N] [--no-restart]

The server is the one `server` embeds and `cluster-local` runs (`start_dev_command`: file-backed
SQLite in WAL mode, bound to 127.0.0.1, the search attributes registered at every start),
run in the foreground. A server that exits is reported (its status and the end of its log) and
started again on the same database after a pause (1 s, doubling to `MAX_BACKOFF_S` while it
keeps exiting within `STEADY_S`; `--no-restart`: the command exits 1 instead), so running
workflows resume where its database left them. SIGINT or SIGTERM stops it (exit 0). A port
held by anything else stops the command at once (exit 1): it never talks to someone else's
server.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TextIO

from posttrain_server.temporal.dev_server import (
    EmbeddedTemporal,
    EmbeddedTemporalConfig,
    EmbeddedTemporalError,
    start_excerpt,
)

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
# A server that stayed up this long before it exited is started again after the first pause.
STEADY_S = 60.0
WATCH_EVERY_S = 0.5


@dataclass(frozen=True)
class Supervision:
    restart: bool = True
    first_backoff_s: float = FIRST_BACKOFF_S


def describe(temporal: EmbeddedTemporal) -> str:
    """The line printed at each start: where it serves, its pid, its state."""
    cfg = temporal.config
    parts = [f"Temporal dev server at {cfg.address} (pid {temporal.pid})"]
    parts.append(f"UI {cfg.ui_url}" if cfg.ui_url else "no UI")
    if cfg.metrics_port is not None:
        parts.append(f"metrics http://127.0.0.1:{cfg.metrics_port}/metrics")
    parts.append(f"database {cfg.state_dir / 'temporal.db'}")
    parts.append(f"log {temporal.log_file}")
    return "; ".join(parts)


async def _stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def serve_dev_server(
    config: EmbeddedTemporalConfig,
    stop: asyncio.Event,
    out: TextIO,
    supervision: Supervision | None = None,
) -> int:
    """Run the server until `stop` is set (0), restarting it when it exits; 1 when it cannot
    start at first, or exits with `restart` off."""
    how = supervision or Supervision()
    temporal = EmbeddedTemporal(config)
    backoff = how.first_backoff_s
    starts = 0
    while not stop.is_set():
        try:
            await temporal.start()
        except EmbeddedTemporalError as err:
            temporal.stop()
            if starts == 0 or not how.restart:
                print(f"posttrain-env temporal dev-server: {err}", file=out, flush=True)
                return 1
            print(f"the server did not start again: {err}", file=out, flush=True)
        else:
            starts += 1
            verb = "started" if starts == 1 else "started again"
            print(f"{verb}: {describe(temporal)}", file=out, flush=True)
            up_since = time.monotonic()
            while temporal.exit_status() is None:
                if await _stopped_within(stop, WATCH_EVERY_S):
                    temporal.stop()
                    print("stopped", file=out, flush=True)
                    return 0
            written = start_excerpt(temporal.written_since_start(), keep=1000)
            print(
                f"the server exited with status {temporal.exit_status()}; the end of its log:\n"
                f"{written.strip() or '(nothing)'}",
                file=out,
                flush=True,
            )
            temporal.stop()  # removes its pid file
            if not how.restart:
                return 1
            if time.monotonic() - up_since >= STEADY_S:
                backoff = how.first_backoff_s
        print(f"starting it again in {backoff:.0f} s", file=out, flush=True)
        if await _stopped_within(stop, backoff):
            break
        backoff = min(backoff * 2, MAX_BACKOFF_S)
    print("stopped", file=out, flush=True)
    return 0
