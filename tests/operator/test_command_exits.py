"""The operator's one-shot commands, run from a shell that holds the deployment's settings:
they never serve the Temporal SDK's metrics (that port is the running processes'), and a
malformed id is bad input (exit 2), not "not found" (1, which a refusal also returns)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from activities.backends.fake.backend import FakeScenario
from tests.operator.dev_env import operated


@contextmanager
def taken_port() -> Iterator[int]:
    """A port something else listens on (the deployment's worker, serving its SDK metrics)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


async def test_one_shot_commands_run_beside_the_deployments_sdk_metrics_port(
    tmp_path: Path,
) -> None:
    async with operated(tmp_path, FakeScenario()) as op:
        episode_id = (await op.reset()).episode_id
        with taken_port() as port:
            shell = {"POSTTRAIN_TEMPORAL_METRICS_PORT": str(port)}
            commands = [
                ("episodes", "list", "--json"),
                ("episodes", "show", episode_id),
                ("episodes", "export", episode_id),
                ("episodes", "end", episode_id, "--reason", "the operator's shell"),
                ("campaign", "list"),
                ("temporal", "setup"),
            ]
            for command in commands:
                done = await op.cli(*command, env=shell)
                assert done.status == 0, (command, done.stderr)
                assert "metrics" not in done.stderr, (command, done.stderr)
        (listed,) = (await op.run("episodes", "list", "--json")).json()
        assert listed["episode_id"] == episode_id
        assert listed["end_reason"] == "cancelled_by_operator"  # the repair went through


MALFORMED = [
    (("end", "not an id!", "--reason", "x"), "'not an id!' is not an episode id"),
    (("cancel", "ep-123"), "'ep-123' is not an episode id"),
    (("retry-cancel", "EP-0123456789ABCDEF"), "is not an episode id"),
    (("confirm-cancelled", "ep-0123456789abcdeg", "job-0123456789ab", "--reason", "x"), "episode"),
    (("confirm-cancelled", "ep-0123456789abcdef", "job-1", "--reason", "x"), "not a job id"),
    (("show", "../../etc/passwd"), "is not an episode id"),
    (("export", "../audit/ep-0123456789abcdef"), "is not an episode id"),
]


async def test_a_malformed_id_is_bad_input_for_every_episodes_command(tmp_path: Path) -> None:
    async with operated(tmp_path, FakeScenario()) as op:
        # As an operator types it, in a process of its own ...
        done = await op.cli("episodes", "end", "not an id!", "--reason", "x")
        assert done.status == 2, done
        assert "'not an id!' is not an episode id (ep-<16 hex>)" in done.stderr
        # ... and every command that takes an id, through the same code in this process.
        for args, said in MALFORMED:
            done = await op.run("episodes", *args)
            assert done.status == 2, (args, done)
            assert said in done.stderr, (args, done.stderr)
        # A well-formed id of no episode is "not found": 1.
        missing = await op.cli("episodes", "end", "ep-0000000000000000", "--reason", "x")
        assert missing.status == 1 and "no episode" in missing.stderr
