"""A failed start of the embedded Temporal server says why: its error quotes what this start
wrote (not an earlier run's lines in the kept log), and of a long output (a Go panic: its cause
first, then every goroutine's stack) both the head and the tail. CI once lost a panic's cause
to a tail-only quote."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from posttrain_server.temporal.dev_server import (
    EmbeddedTemporal,
    EmbeddedTemporalConfig,
    EmbeddedTemporalError,
    free_ports,
    start_excerpt,
)


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
