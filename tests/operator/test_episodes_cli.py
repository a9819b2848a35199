"""`posttrain-env episodes` and the queries of docs/operations.md, on the real dev server:
a cancellation that never confirms is found (with its backend job id) until it confirms;
filters find exactly the episodes they should."""

from __future__ import annotations

import base64
import json
import re
import shlex
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx

from activities.backends.fake.backend import FakeJobScript, FakeScenario
from mcp_gateway.episode_calls import call_tool
from posttrain_common.contracts.episode_calls import EndRequest, ToolCall
from posttrain_common.contracts.jobs import JobRole
from posttrain_env.models import EndReason
from posttrain_server.temporal.dev_server import free_ports
from tests.operator.dev_env import Operated, operated
from tests.waiting import PROGRESS_S, eventually
from workflows.episode.workflow import EpisodeInput, EpisodeWorkflow
from workflows.ids import episode_workflow_id

# The page that shows the operator's commands and queries: they are run here as written.
OPERATIONS = Path(__file__).parents[2] / "docs" / "operations.md"
PLACEHOLDER = "2026-01-01T00:00:00Z"  # the page's timestamp, to be replaced by now - 10 min
STUCK = FakeScenario(
    jobs=[FakeJobScript(role=JobRole.agent, queue_s=0, run_s=3600, cancel_confirm_after_s=None)]
)


def page_blocks(kind: str) -> list[str]:
    """The page's code blocks of one kind (`bash`, `sql`), in order."""
    return re.findall(rf"```{kind}\n(.*?)```", OPERATIONS.read_text(), re.S)


def listed(output: str) -> dict[str, dict[str, object]]:
    """`temporal workflow list --output json` -> workflow id: its search attributes, decoded."""
    found = {}
    for entry in json.loads(output or "[]"):
        fields = entry.get("searchAttributes", {}).get("indexedFields", {})
        found[entry["execution"]["workflowId"]] = {
            name: json.loads(base64.b64decode(payload["data"])) for name, payload in fields.items()
        }
    return found


def instant(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


async def submit(op: Operated, episode_id: str) -> str:
    call = ToolCall(
        request_id="r1",
        tool="jobs_submit",
        arguments={"script": "print('x')\n", "flavor": "cpu-basic", "timeout_minutes": 60},
        path="mcp",
    )
    result = await call_tool(op.client, episode_id, call)
    assert "error" not in result.data, result.data
    return result.data["job_id"]


async def test_an_unconfirmed_cancellation_is_found_with_its_backend_job_until_it_confirms(
    tmp_path: Path,
) -> None:
    (ui_port,) = free_ports(1, set())
    ui = {"POSTTRAIN_TEMPORAL_UI_URL": f"http://127.0.0.1:{ui_port}"}
    async with operated(tmp_path, STUCK, ui_port=ui_port) as op:
        reset = await op.reset()
        episode_id = reset.episode_id
        await submit(op, episode_id)
        (request,) = op.backend.requests()

        cancelled = await op.cli("episodes", "cancel", episode_id)
        assert cancelled.status == 0, cancelled.stderr
        assert "ended (cancelled_by_operator)" in cancelled.stdout

        async def listed_as_stuck() -> bool:
            done = await op.run("episodes", "list", "--stuck", "2s", "--json")
            assert done.status == 0, done.stderr
            return [row["episode_id"] for row in done.json()] == [episode_id]

        await eventually(
            listed_as_stuck, PROGRESS_S, "the episode is listed with --stuck 2s", every_s=0.5
        )
        (row,) = (await op.cli("episodes", "list", "--stuck", "2s", "--json")).json()
        (job,) = row["stuck_jobs"]
        ref = job["backend_job_id"]
        assert ref and ref in {r.key for r in op.backend.requests()} | {ref}
        assert job["workflow_id"] == f"{episode_workflow_id(episode_id)}/job/1"
        assert job["pending_s"] >= 2 and row["state"] == "ending"
        assert row["end_reason"] == "cancelled_by_operator" and row["reward"] is None
        # Pending for seconds, not a minute: --stuck 1m does not list it yet.
        assert (await op.run("episodes", "list", "--stuck", "1m", "--json")).json() == []
        table = await op.cli("episodes", "list", "--stuck", "2s")
        assert episode_id in table.stdout and f"backend job {ref}" in table.stdout

        # The UI's link to the stuck jobs' list: its query, run, finds the job; the UI serves it.
        linked = await op.cli("episodes", "list", "--stuck", "2s", "--ui-url", env=ui)
        assert linked.status == 0, linked.stderr
        link = linked.stdout.strip()
        assert link.startswith(f"http://127.0.0.1:{ui_port}/namespaces/default/workflows?query=")
        (query,) = parse_qs(urlsplit(link).query)["query"]
        assert "WorkflowType = 'JobWorkflow'" in query and "PtCancelPendingSince <" in query
        assert list(listed(await op.temporal_list(query))) == [job["workflow_id"]]
        async with httpx.AsyncClient(timeout=30) as http:
            page = await http.get(link)
        assert page.status_code == 200 and "<html" in page.text.lower()
        no_ui = await op.cli("episodes", "list", "--stuck", "2s", "--ui-url")
        assert no_ui.status == 2 and "POSTTRAIN_TEMPORAL_UI_URL" in no_ui.stderr

        # The page's query, as written, with now minus two seconds for its timestamp.
        (stuck_query,) = page_blocks("sql")[0].strip().splitlines()
        assert PLACEHOLDER in stuck_query
        cutoff = instant(datetime.now(UTC) - timedelta(seconds=2))
        found = listed(await op.temporal_list(stuck_query.replace(PLACEHOLDER, cutoff)))
        assert list(found) == [job["workflow_id"]]
        assert found[job["workflow_id"]]["PtBackendJobId"] == ref
        assert found[job["workflow_id"]]["PtState"] == "cancelling"

        shown = await op.cli("episodes", "show", episode_id)
        assert shown.status == 0, shown.stderr
        assert "CANCELLATION UNCONFIRMED" in shown.stdout and ref in shown.stdout
        assert request.job_id in shown.stdout  # the live status a worker answered

        # The page's orphan queries: the episode waits on its job; the job is open.
        ending, open_jobs = page_blocks("sql")[1].strip().splitlines()
        assert list(listed(await op.temporal_list(ending))) == [episode_workflow_id(episode_id)]
        now = instant(datetime.now(UTC))
        assert job["workflow_id"] in listed(
            await op.temporal_list(open_jobs.replace(PLACEHOLDER, now))
        )

        op.backend.confirm_cancellations()

        async def no_longer_stuck() -> bool:
            done = await op.run("episodes", "list", "--stuck", "2s", "--json")
            return done.json() == []

        await eventually(
            no_longer_stuck,
            PROGRESS_S,
            "the confirmed cancellation leaves the stuck list",
            every_s=0.5,
        )
        found = listed(await op.temporal_list(stuck_query.replace(PLACEHOLDER, cutoff)))
        assert found == {}

        async def ended() -> bool:
            rows = (await op.run("episodes", "list", "--state", "ended", "--json")).json()
            return [r["episode_id"] for r in rows] == [episode_id]

        await eventually(
            ended, PROGRESS_S, "the episode is ended once its job confirmed", every_s=0.5
        )


async def test_filters_find_exactly_their_episodes_and_the_pages_commands_run(
    tmp_path: Path,
) -> None:
    tasks = {"t_test": {}, "t_short": {"time_limit_s": 3}}
    async with operated(tmp_path, FakeScenario(), tasks) as op:
        cancelled = await op.reset("t_test")
        await op.handle(cancelled.workflow_id).signal(
            EpisodeWorkflow.end_requested, EndRequest(reason=EndReason.cancelled)
        )
        timed_out = await op.reset("t_short")
        campaign_id = f"ep-{uuid.uuid4().hex[:16]}"
        setup = cancelled.setup.model_copy(
            update={"episode_id": campaign_id, "campaign_id": "c-1", "session_workflow_id": None}
        )
        await op.client.start_workflow(
            EpisodeWorkflow.run,
            EpisodeInput(setup=setup),
            id=episode_workflow_id(campaign_id),
            task_queue=op.task_queue,
        )

        async def ids(*args: str) -> set[str]:
            done = await op.run("episodes", "list", *args, "--json")
            assert done.status == 0, done.stderr
            return {row["episode_id"] for row in done.json()}

        async def settled() -> bool:
            return await ids("--state", "ended") == {cancelled.episode_id, timed_out.episode_id}

        await eventually(
            settled, PROGRESS_S, "the cancelled and the timed-out episodes are ended", every_s=0.5
        )
        assert await ids("--task", "t_test") == {cancelled.episode_id, campaign_id}
        assert await ids("--task", "t_short") == {timed_out.episode_id}
        assert await ids("--end-reason", "cancelled") == {cancelled.episode_id}
        assert await ids("--end-reason", "time_limit") == {timed_out.episode_id}
        assert await ids("--end-reason", "submitted") == set()
        assert await ids("--campaign", "c-1") == {campaign_id}
        assert await ids("--campaign", "c-2") == set()
        assert await ids("--state", "running") == {campaign_id}
        assert await ids("--since", "1h") == {
            cancelled.episode_id,
            timed_out.episode_id,
            campaign_id,
        }
        assert await ids("--task", "t_test", "--state", "ended") == {cancelled.episode_id}
        assert await ids("--stuck", "1s") == set()
        (row,) = (await op.run("episodes", "list", "--end-reason", "time_limit", "--json")).json()
        assert row["reward"] == 0.0 and row["task"] == "t_short" and row["status"] == "Completed"
        assert row["steps_used"] == 0 and row["spend_usd"] == 0.0

        # Bad input: a clear message and status 2, never a query with the value in it.
        for bad, why in (
            (["--state", "bogus"], "one of running, ending, ended"),
            (["--task", "x' OR PtTask != '"], "letters, digits"),
            (["--since", "5x"], "not a duration"),
            (["--end-reason", "won"], "one of submitted"),
            (["--limit", "0"], "between 1 and 10000"),
        ):
            done = await op.run("episodes", "list", *bad)
            assert done.status == 2 and why in done.stderr, (bad, done.stderr)
        missing = await op.run("episodes", "show", "ep-ffffffffffffffff")
        assert missing.status == 1 and "no episode" in missing.stderr

        # The page's commands, as written, on this deployment's ids.
        bash = page_blocks("bash")
        setup_line = bash[0].strip().replace("temporal.example:7233", op.address)
        lines = [setup_line] + [line.split("  #")[0] for line in bash[1].strip().splitlines()]
        for line in lines:
            words = shlex.split(
                line.replace("ep-0123456789abcdef", campaign_id).replace("t0_artifact", "t_test")
            )
            env = [w for w in words if "=" in w and w.split("=")[0].isupper()]
            words = [w for w in words if w not in env][2:]  # drop `uv run`
            assert words[0] == "posttrain-env", line
            # `--ui-url` needs the UI's address beside TEMPORAL_ADDRESS (none is served here).
            done = await op.cli(*words[1:], env={"POSTTRAIN_TEMPORAL_UI_URL": "http://ui.test"})
            assert done.status == 0, (line, done.stderr)
            if words[1:3] == ["episodes", "export"]:  # a running episode: read from Temporal
                record = done.json()
                assert record["episode_id"] == campaign_id and record["campaign_id"] == "c-1"
                assert record["end"] is None and record["calls"] == []
        assert "already registered" in (await op.cli("temporal", "setup")).stdout

        async def campaign_cancelled() -> bool:
            reason = "cancelled_by_operator"
            return await ids("--campaign", "c-1", "--end-reason", reason) == {campaign_id}

        await eventually(
            campaign_cancelled,
            PROGRESS_S,
            "the page's cancel ended the campaign's episode",
            every_s=0.5,
        )
