"""The bound on a process's shutdown: every process of ours (the all-in-one server, the gateway
alone, a worker) exits within 30 s of SIGTERM or SIGINT (docs/deployment.md, "Stopping").

The orderly path keeps to it by itself: the gateway gives requests in flight
`GATEWAY_GRACE_S` and then cancels them (mcp_gateway/app.py; a long call lives in its episode's
workflow, so the client's retry on another replica loses nothing), and the worker cancels its
activities at once. This deadline is the backstop for whatever would still hang: past it the
process says so in its log and exits with status 1.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
from typing import NoReturn

log = logging.getLogger(__name__)

# docs/deployment.md, "Stopping": "within 30 s"; the rest is the margin for the process to be
# reaped.
SHUTDOWN_DEADLINE_S = 25.0


class ShutdownDeadline:
    def __init__(self, what: str, seconds: float = SHUTDOWN_DEADLINE_S) -> None:
        self._what = what
        self._seconds = seconds
        self._timer: threading.Timer | None = None

    def start(self) -> None:
        """Start counting (at the first signal; later calls change nothing). Safe to call from
        a signal handler."""
        if self._timer is None:
            self._timer = threading.Timer(self._seconds, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _expire(self) -> None:
        log.error("%s still stopping %g s after the signal: exiting now", self._what, self._seconds)
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stderr.flush()
        os._exit(1)


def stop_on_signals(deadline: ShutdownDeadline | None = None) -> asyncio.Event:
    """An event that SIGINT or SIGTERM sets on the running loop; the first also starts
    `deadline`."""
    stop = asyncio.Event()

    def stopping() -> None:
        if deadline is not None:
            deadline.start()
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping)
    return stop


def exit_now(status: int) -> NoReturn:
    """Flush and exit with `status` at once: the SDK can abort at interpreter exit
    (temporalio/sdk-python#300), which would replace our status."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
