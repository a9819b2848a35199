"""A failed start of the embedded Temporal server says why: its error quotes what this start
wrote (not an earlier run's lines in the kept log), and of a long output (a Go panic: its cause
first, then every goroutine's stack) both the head and the tail. CI once lost a panic's cause
to a tail-only quote."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from posttrain_server.temporal.dev_server import (
    DYNAMIC_CONFIG,
    EmbeddedTemporal,
    EmbeddedTemporalConfig,
    EmbeddedTemporalError,
    free_ports,
    start_dev_command,
    start_excerpt,
)
from tests.startup import DEV_SERVER_STARTUP


def test_a_failed_start_quotes_only_what_it_wrote(tmp_path: Path) -> None:
    (tmp_path / "temporal.log").write_text("an earlier run's line\n" * 400)
    (tmp_path / "temporal.db").write_bytes(b"not a database, " * 4096)
    (port,) = free_ports(1, set())
    server = EmbeddedTemporal(EmbeddedTemporalConfig(tmp_path, port=port, headless=True))
    with pytest.raises(EmbeddedTemporalError) as failed:
        asyncio.run(server.start())
    message = str(failed.value)
    assert message.startswith("the embedded Temporal server exited:\n")
    assert "file is not a database" in message
    assert "an earlier run's line" not in message
    # The kept log still has both runs.
    assert "an earlier run's line" in server.log_file.read_text()


def test_a_long_output_keeps_its_first_and_last_lines() -> None:
    panic = "panic: the cause\n\ngoroutine 1 [running]:\n"
    stacks = "".join(f"main.frame{i}()\n\t/src/main.go:{i}\n" for i in range(2000))
    written = panic + stacks + "exit status 2\n"
    excerpt = start_excerpt(written)
    assert excerpt.startswith(panic) and excerpt.endswith("exit status 2\n")
    left_out = len(written) - 4000
    assert f"[... {left_out} characters left out ...]" in excerpt
    assert len(excerpt) < 4100
    assert start_excerpt("short\n") == "short\n"


def test_the_server_runs_with_caches_sized_for_ten_thousand_running_jobs(tmp_path: Path) -> None:
    """The dev server's own caches (8,096 workflows, 512 KiB of events) are smaller than the
    ~12,000 workflows open at 10,000 running jobs: its metrics show the sizes it runs with."""
    port, metrics_port = free_ports(2, set())
    command = start_dev_command(tmp_path / "temporal.db", port, metrics_port=metrics_port)
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        sizes: dict[str, float] = {}
        deadline = time.monotonic() + DEV_SERVER_STARTUP.total_seconds()
        # The gauges read 0 until the history service has made its caches.
        while not (len(sizes) == 2 and all(sizes.values())) and time.monotonic() < deadline:
            assert server.poll() is None, "the server exited"
            try:
                text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
            except httpx.HTTPError:
                time.sleep(0.5)
                continue
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    kind = sample.labels.get("cache_type")
                    if sample.name == "cache_size" and kind in ("mutablestate", "events"):
                        sizes[kind] = sample.value
            time.sleep(0.5)
        assert sizes == {
            "mutablestate": DYNAMIC_CONFIG["history.hostLevelCacheMaxSize"],
            "events": DYNAMIC_CONFIG["history.eventsCacheMaxSizeBytes"],
        }
        assert sizes["mutablestate"] >= 12_000
    finally:
        server.terminate()
        server.wait(timeout=30)
