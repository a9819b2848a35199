"""The server-wide caps refuse new episodes and jobs cleanly over the OpenEnv wire: a typed error
the stock client raises with its message, nothing half-made, and room again once an episode ends."""

from __future__ import annotations

from pathlib import Path

import pytest
from openenv.core.env_server.mcp_types import CallToolAction

from posttrain_env import PostTrainEnv
from tests.gateway.conftest import QUICK
from tests.gateway.server import ServerProcess

# One job of 5 minutes of cpu-basic reserves $0.000835; the cap lets one run, not two.
CAPS = {"POSTTRAIN_MAX_LIVE_EPISODES": "1", "POSTTRAIN_SPEND_CAP_USD": "0.001"}
SUBMIT = {"script": "RUN_LONG = 1\n", "flavor": "cpu-basic", "timeout_minutes": 5}


def test_the_live_episode_cap_and_the_spend_cap_refuse_cleanly(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "state", scenario=QUICK, extra_env=CAPS)
    server.start()
    try:
        with PostTrainEnv(base_url=server.base_url).sync() as first:
            first.reset(task_id="t0_artifact")
            job = first.step(CallToolAction(tool_name="jobs_submit", arguments=SUBMIT))
            assert job.observation.result["data"]["state"] in {"queued", "running"}
            second_job = first.step(CallToolAction(tool_name="jobs_submit", arguments=SUBMIT))
            error = second_job.observation.result["data"]["error"]
            assert error["type"] == "budget_exhausted" and "server-wide" in error["message"]

            with PostTrainEnv(base_url=server.base_url).sync() as second:
                with pytest.raises(RuntimeError) as refused:
                    second.reset(task_id="t0_artifact")
                assert "limit_reached" in str(refused.value)
                assert "maximum of 1 live episodes" in str(refused.value)
                assert second.episode_id is None
        # `first` closed: its episode ended and was retired, so there is room again.
        with PostTrainEnv(base_url=server.base_url).sync() as third:
            third.reset(task_id="t0_artifact")
            assert third.episode_id is not None
    finally:
        server.stop()
