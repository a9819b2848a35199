"""`uv run server` (also `posttrain-env server`): the gateway, a worker and, unless
`TEMPORAL_ADDRESS` is set, the embedded file-backed Temporal dev server, in one process.

Shutdown on SIGINT/SIGTERM is orderly and bounded (30 s, `shutdown.py`): uvicorn stops taking
requests and gives those in flight a few seconds (a long call is cancelled: it lives in its
episode's workflow), the worker stops, the embedded Temporal server stops. The process then
exits with its real status through `os._exit`, because the SDK can abort at interpreter exit
(temporalio/sdk-python#300).

A server key that is missing, bad, or not the deployment's (`deployment_key.py`) stops it
before it serves, with status 2 and the setting to fix.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING

from pydantic import ValidationError

from posttrain_server.shutdown import exit_now

if TYPE_CHECKING:
    from posttrain_common.settings import Settings

log = logging.getLogger("posttrain_server.server")


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="bind port (default 8000)")
    parser.add_argument(
        "--no-worker",
        action="store_true",
        help="serve the gateway only; workers run elsewhere (`posttrain-env worker`)",
    )


async def serve(host: str, port: int, *, with_worker: bool) -> None:
    from activities.backends.registry import backend_info
    from mcp_gateway.auth import start_refusal
    from posttrain_common.settings import Settings
    from posttrain_server.deployment_key import check_deployment, resolve_server_key
    from posttrain_server.shutdown import ShutdownDeadline
    from posttrain_server.temporal.client import connect
    from posttrain_server.temporal.dev_server import EmbeddedTemporal, EmbeddedTemporalConfig
    from posttrain_server.temporal.setup import require_search_attributes

    settings = Settings()
    # The backend's declaration only: without a worker, none of its code is loaded.
    capabilities = backend_info(settings.backend).capabilities
    key = resolve_server_key(settings)  # before anything starts: the settings' last check
    backend = None
    if with_worker:  # without one, no activity or backend code is loaded into the gateway
        from posttrain_server.wiring import make_backend

        backend = make_backend(settings, key.key)
    refusal = start_refusal(
        host,
        settings.api_key_list,
        backend=settings.backend,
        spends_money=capabilities.spends_money,
    )
    if refusal is not None:  # DESIGN §6 item 6: checked before anything starts
        print(f"posttrain-env: {refusal}", file=sys.stderr)
        raise SystemExit(2)
    # Imported once the settings are known to be usable (openenv's server side pulls in gradio).
    import uvicorn

    from mcp_gateway.app import create_app, uvicorn_config

    embedded: EmbeddedTemporal | None = None
    async with contextlib.AsyncExitStack() as stack:
        if not settings.temporal_is_external:
            embedded = EmbeddedTemporal(
                EmbeddedTemporalConfig(
                    state_dir=settings.state_dir,
                    port=settings.temporal_port,
                    ui_port=settings.temporal_ui_port,
                )
            )
            await embedded.start()
            stack.callback(embedded.stop)
            settings = settings.model_copy(update={"temporal_address": embedded.config.address})
            log.info(
                "embedded Temporal at %s (state in %s)",
                settings.temporal_address,
                settings.state_dir,
            )
            if embedded.config.ui_url:
                log.info("Temporal UI: %s", embedded.config.ui_url)
        client = await connect(settings, serve_sdk_metrics=True)
        await require_search_attributes(client, settings.temporal_address)
        await check_deployment(client, settings.task_queue, key)
        log.info("server key %s (fingerprint %s)", key.source, key.fingerprint)
        if backend is not None:
            from posttrain_server.full_collections import full_collections_every
            from posttrain_server.worker import build_worker
            from posttrain_server.worker_metrics import serving_worker_metrics

            worker = build_worker(client, settings, backend, key=key.key)
            every_s = settings.worker_full_collection_every_s
            await stack.enter_async_context(full_collections_every(every_s))
            # Its series are served with the gateway's, on /metrics.
            await stack.enter_async_context(
                serving_worker_metrics(settings, client, backend.name, storage=backend.storage())
            )
            await stack.enter_async_context(worker)
            log.info("worker on task queue %r (backend %s)", settings.task_queue, backend.name)
        deadline = ShutdownDeadline("the server")

        class Gateway(uvicorn.Server):
            """uvicorn's server; the signal that stops it starts the shutdown deadline."""

            def handle_exit(self, sig: int, frame: FrameType | None) -> None:
                deadline.start()
                super().handle_exit(sig, frame)

        server = Gateway(uvicorn_config(create_app(settings, client, key.key), host, port))
        # uvicorn re-raises the signal that stopped it once it has shut down; with the default
        # handlers that would kill us before the worker and Temporal stop. Ours ignore it (a
        # signal after uvicorn stopped still starts the deadline).
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda _sig, _frame: deadline.start())
        log.info("gateway on http://%s:%d (OpenEnv /ws, /mcp; MCP /episodes/<id>/mcp)", host, port)
        log_metrics(settings, host, port, with_worker=backend is not None)
        await server.serve()  # returns on SIGINT/SIGTERM (uvicorn handles both)
        if not server.started:
            raise SystemExit(f"the gateway could not listen on {host}:{port}")


def log_metrics(settings: Settings, host: str, port: int, *, with_worker: bool) -> None:
    """Where this process's metrics are, in the startup log."""
    from posttrain_server.temporal.client import sdk_metrics_address

    if settings.metrics:
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        what = "the gateway's and its worker's" if with_worker else "the gateway's"
        log.info("metrics: http://%s:%d/metrics (%s; the API keys apply)", shown, port, what)
    else:
        log.info("metrics: off (POSTTRAIN_METRICS)")
    sdk = sdk_metrics_address(settings)
    if sdk is not None:
        log.info("Temporal SDK metrics: http://%s/metrics", sdk)


def run(host: str, port: int, *, with_worker: bool) -> int:
    """Serve until a signal; the exit status (0 clean, 1 failure, 2 bad settings)."""
    from activities.backends.registry import UnknownBackend
    from posttrain_common.keys import ServerKeyError
    from posttrain_server.temporal.dev_server import EmbeddedTemporalError

    try:
        asyncio.run(serve(host, port, with_worker=with_worker))
    except (ValidationError, UnknownBackend) as exc:
        print(f"posttrain-env: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    except ServerKeyError as exc:
        print(f"posttrain-env: {exc}", file=sys.stderr)
        return 2
    except EmbeddedTemporalError as exc:
        print(f"posttrain-env: {exc}", file=sys.stderr)
        return 1
    except SystemExit as exc:
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except Exception:
        log.exception("the server failed")
        return 1
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="server", description="the posttrain_env gateway, worker and embedded Temporal"
    )
    add_server_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    exit_now(run(args.host, args.port, with_worker=not args.no_worker))


if __name__ == "__main__":
    main()
