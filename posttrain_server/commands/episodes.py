"""`posttrain-env episodes`: find, read and cancel episodes without writing Temporal queries.

    posttrain-env episodes list [--task T] [--state S] [--end-reason R] [--since 2d]
                                [--stuck 10m] [--campaign C] [--limit N] [--json | --ui-url]
    posttrain-env episodes show <episode_id> [--json]
    posttrain-env episodes export <episode_id>
    posttrain-env episodes cancel | end | retry-cancel | confirm-cancelled ...
                                                      (the repairs: `episode_repair.py`)

Built on the search attributes episodes and jobs upsert
(`workflows/operations/search_attributes.py`),
so `list` works whether or not a worker runs; `show` asks a worker for the live status too.
Connects to TEMPORAL_ADDRESS, or to the embedded server's port when that is unset.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from posttrain_common.failures import EpisodeNotFound

if TYPE_CHECKING:
    from temporalio.client import Client

    from posttrain_common.contracts.audit import AuditRecord
    from posttrain_common.settings import Settings
    from posttrain_server.commands.episode_queries import EpisodeFilter, StuckJob

EPISODES_HELP = "list, show, export and repair episodes (the operator's view and tools)"
STATUS_QUERY_TIMEOUT = timedelta(seconds=10)


def add_episodes_commands(subparsers: argparse._SubParsersAction) -> None:  # pyright: ignore[reportPrivateUsage]
    episodes = subparsers.add_parser("episodes", help=EPISODES_HELP, description=EPISODES_HELP)
    commands = episodes.add_subparsers(dest="episodes_command", required=True)
    listing = commands.add_parser("list", help="episodes matching every filter, newest first")
    listing.add_argument("--task", help="task id")
    listing.add_argument("--state", help="running | ending (ended, jobs not final) | ended")
    listing.add_argument("--end-reason", help="submitted, max_steps, score_failed, cancelled, ...")
    listing.add_argument("--since", help="started within this long: 90s, 10m, 2h, 2d")
    listing.add_argument("--stuck", help="a cancellation pending longer than this, e.g. 10m")
    listing.add_argument("--campaign", help="campaign id")
    listing.add_argument("--limit", type=int, default=100, help="at most this many (100)")
    shown = listing.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="JSON instead of a table")
    shown.add_argument(
        "--ui-url",
        action="store_true",
        help="instead, the Temporal UI's link to this list, its times computed now (with "
        "--stuck and no episode-only filter: the stuck job workflows, which carry the backend "
        "job id)",
    )
    show = commands.add_parser("show", help="one episode: steps, jobs, spend, end, reward")
    show.add_argument("episode_id")
    show.add_argument("--json", action="store_true")
    export = commands.add_parser(
        "export", help="the episode's audit record as JSON, validated against its schema"
    )
    export.add_argument("episode_id")
    from posttrain_server.commands.episode_repair import add_repair_commands

    add_repair_commands(commands)


def run_episodes(args: argparse.Namespace) -> int:
    """Run a parsed `episodes` command; the exit status (2: bad input, a malformed id
    included; 1: not found, or a repair refused)."""
    from posttrain_common.settings import Settings

    return asyncio.run(run_episodes_async(args, Settings()))


async def run_episodes_async(args: argparse.Namespace, settings: Settings) -> int:
    from posttrain_server.commands.episode_queries import FilterError
    from posttrain_server.commands.episode_repair import REPAIRS, run_repair

    malformed = malformed_id(args)
    if malformed is not None:  # bad input, as a bad flag is: 2, before Temporal is asked
        print(f"posttrain-env episodes {args.episodes_command}: {malformed}", file=sys.stderr)
        return 2
    try:
        if args.episodes_command == "list" and args.ui_url:
            return print_list_link(settings, args)  # a link only: Temporal is not asked
        client = await operator_client(settings)
        if args.episodes_command == "list":
            return await list_episodes(client, args)
        if args.episodes_command == "show":
            return await show_episode(client, settings, args.episode_id, as_json=args.json)
        if args.episodes_command in REPAIRS:
            return await run_repair(client, args)
        if args.episodes_command == "export":
            record = await export_record(client, settings, args.episode_id)
            print(json.dumps(record, indent=2))
            return 0
    except (FilterError, MalformedId) as exc:
        print(f"posttrain-env episodes: {exc}", file=sys.stderr)
        return 2
    except (EpisodeNotFound, InvalidRecord) as exc:
        print(f"posttrain-env episodes: {exc}", file=sys.stderr)
        return 1
    return 2


def malformed_id(args: argparse.Namespace) -> str | None:
    """What is wrong with the command's episode or job id (None: nothing, or it takes none)."""
    from workflows.ids import EPISODE_ID, JOB_ID

    episode_id = getattr(args, "episode_id", None)
    if episode_id is not None and not EPISODE_ID.fullmatch(episode_id):
        return f"{episode_id!r} is not an episode id (ep-<16 hex>)"
    job_id = getattr(args, "job_id", None)
    if job_id is not None and not JOB_ID.fullmatch(job_id):
        return f"{job_id!r} is not a job id (job-<12 hex>, or eval-<12 hex> for an evaluation)"
    return None


class MalformedId(ValueError):
    """An episode or job id that no episode or job can have."""


class InvalidRecord(ValueError):
    """An audit record that does not validate against the published schema."""


async def operator_client(settings: Settings) -> Client:
    """A client of the namespace the server uses: TEMPORAL_ADDRESS, else the embedded one."""
    from posttrain_server.temporal.client import connect

    if "temporal_address" not in settings.model_fields_set:
        settings = settings.model_copy(
            update={"temporal_address": f"127.0.0.1:{settings.temporal_port}"}
        )
    return await connect(settings)


def ui_workflows(settings: Settings) -> str | None:
    """The Temporal UI's page of the namespace's workflows (embedded server: its UI port; else
    POSTTRAIN_TEMPORAL_UI_URL when set; None when neither)."""
    base = settings.temporal_ui_url
    if base is None and "temporal_address" not in settings.model_fields_set:
        base = f"http://127.0.0.1:{settings.temporal_ui_port}"
    if base is None:
        return None
    namespace = quote(settings.temporal_namespace, safe="")
    return f"{base.rstrip('/')}/namespaces/{namespace}/workflows"


def ui_url(settings: Settings, workflow_id: str) -> str | None:
    """The Temporal UI's page of a workflow."""
    workflows = ui_workflows(settings)
    return None if workflows is None else f"{workflows}/{quote(workflow_id, safe='')}"


def ui_list_url(settings: Settings, query: str) -> str | None:
    """The Temporal UI's list of the workflows `query` finds (the UI reads `?query=`)."""
    workflows = ui_workflows(settings)
    return None if workflows is None else f"{workflows}?query={quote(query, safe='')}"


# -- list --------------------------------------------------------------------------------------


async def stuck_jobs(
    client: Client, now: datetime, pending_for: timedelta = timedelta(0)
) -> dict[str, list[StuckJob]]:
    """Episode id -> its open job workflows whose cancellation has been pending longer than
    `pending_for`. The one reading of "stuck" that `list` and `show` both print."""
    from posttrain_server.commands.episode_queries import (
        episode_id_of,
        stuck_job_of,
        stuck_jobs_query,
    )

    found: dict[str, list[StuckJob]] = {}
    async for wf in client.list_workflows(stuck_jobs_query(now, pending_for), limit=1000):
        episode_id = episode_id_of(wf.id)
        if episode_id is not None:
            found.setdefault(episode_id, []).append(
                stuck_job_of(wf.id, wf.typed_search_attributes, now)
            )
    for jobs in found.values():
        jobs.sort(key=lambda job: job.workflow_id)
    return found


def episode_filter(args: argparse.Namespace) -> EpisodeFilter:
    """The `list` command's filters. Raises FilterError."""
    from posttrain_server.commands.episode_queries import EpisodeFilter, parse_duration

    return EpisodeFilter(
        task=args.task,
        state=args.state,
        end_reason=args.end_reason,
        campaign=args.campaign,
        since=parse_duration(args.since) if args.since else None,
        stuck=parse_duration(args.stuck) if args.stuck else None,
    )


def print_list_link(settings: Settings, args: argparse.Namespace) -> int:
    """`list --ui-url`: the UI's link to the list, every filter in it (with --stuck, to the
    stuck job workflows: the rows with the backend job id; `list_link_query` says when).
    Raises FilterError."""
    from posttrain_server.commands.episode_queries import FilterError, list_link_query

    link = ui_list_url(settings, list_link_query(episode_filter(args), datetime.now(UTC)))
    if link is None:
        raise FilterError(
            "--ui-url: no Temporal UI is known for TEMPORAL_ADDRESS; set "
            "POSTTRAIN_TEMPORAL_UI_URL to its address"
        )
    print(link)
    return 0


async def list_episodes(client: Client, args: argparse.Namespace) -> int:
    from posttrain_server.commands.episode_queries import FilterError, row_of, table

    if not 0 < args.limit <= 10_000:
        raise FilterError(f"--limit {args.limit}: between 1 and 10000")
    filters = episode_filter(args)
    now = datetime.now(UTC)
    rows = []
    async for wf in client.list_workflows(filters.query(now), limit=args.limit):
        status = wf.status.name.title() if wf.status else "Unknown"
        rows.append(row_of(wf.id, status, wf.start_time, wf.typed_search_attributes))
    if rows:  # each episode's jobs with a cancellation pending (longer than --stuck)
        stuck = await stuck_jobs(client, now, filters.stuck or timedelta(0))
        for row in rows:
            row.stuck_jobs = stuck.get(row.episode_id, [])
    if args.json:
        print(json.dumps([row.as_json() for row in rows], indent=2))
    else:
        print(table(rows))
    return 0


# -- show --------------------------------------------------------------------------------------


async def episode_summary(client: Client, settings: Settings, episode_id: str) -> dict[str, Any]:
    """What `show` prints: the attributes and memo Temporal keeps, the live status a worker
    answers (when one runs), each job's attributes, and the UI link. Raises EpisodeNotFound."""
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError, RPCStatusCode

    from posttrain_server.commands.episode_queries import row_of
    from posttrain_server.episode_pages import status_with_every_job
    from workflows.ids import episode_workflow_id, job_workflow_id
    from workflows.operations import search_attributes as sa

    workflow_id = episode_workflow_id(episode_id)
    handle = client.get_workflow_handle(workflow_id)
    try:
        described = await handle.describe()
    except RPCError as err:
        if err.status is RPCStatusCode.NOT_FOUND:
            raise EpisodeNotFound(f"no episode {episode_id!r} in this namespace") from None
        raise
    status = described.status.name.title() if described.status else "Unknown"
    row = row_of(workflow_id, status, described.start_time, described.typed_search_attributes)
    now = datetime.now(UTC)
    row.stuck_jobs = (await stuck_jobs(client, now)).get(episode_id, [])
    summary: dict[str, Any] = {
        **row.as_json(),
        "memo": await described.memo(),
        "closed_at": described.close_time.isoformat() if described.close_time else None,
        "ui": ui_url(settings, workflow_id),
    }
    try:
        live = await status_with_every_job(handle, STATUS_QUERY_TIMEOUT)
        # The query's time is the workflow's last task's: the time left is as of now.
        live = live.as_of(now)
        summary["live"] = live.model_dump(mode="json", exclude={"metadata"})
        # What the episode's artifacts keep (its spend's storage block, DESIGN §12).
        summary["stored_bytes"] = live.service_spend.storage.bytes
    except (RPCError, WorkflowQueryFailedError) as err:
        summary["live"] = None
        summary["live_error"] = f"no worker answered the status query ({err})"
    jobs = []
    for n in range(1, 10_000):  # the episode's job workflows are numbered from 1
        job_handle = client.get_workflow_handle(job_workflow_id(episode_id, n))
        try:
            job = await job_handle.describe()
        except RPCError as err:
            if err.status is RPCStatusCode.NOT_FOUND:
                break
            raise
        attrs = job.typed_search_attributes
        entry = {
            "workflow_id": job.id,
            "job_id": (await job.memo()).get("job_id"),
            "role": attrs.get(sa.ROLE),
            "flavor": attrs.get(sa.FLAVOR),
            "state": attrs.get(sa.STATE),
            "backend_job_id": attrs.get(sa.BACKEND_JOB_ID),
        }
        stuck = next((j for j in row.stuck_jobs if j.workflow_id == job.id), None)
        if stuck is not None:
            entry["cancel_pending_since"] = stuck.pending_since
            entry["cancel_pending_s"] = stuck.pending_s
        jobs.append(entry)
    summary["jobs"] = jobs
    return summary


async def show_episode(
    client: Client, settings: Settings, episode_id: str, *, as_json: bool
) -> int:
    summary = await episode_summary(client, settings, episode_id)
    if as_json:
        print(json.dumps(summary, indent=2, default=str))
        return 0
    print(render_summary(summary))
    return 0


def render_summary(s: dict[str, Any]) -> str:
    lines = [
        f"episode {s['episode_id']}  ({s['status']}; {s['state'] or '-'})",
        f"  task {s['task']}  base model {s['memo'].get('base_model')}"
        f"@{s['memo'].get('base_model_commit')}",
        f"  started {s['started_at']}  closed {s['closed_at'] or '-'}",
    ]
    live = s.get("live")
    if live:
        spend = live["service_spend"]
        lines.append(
            f"  steps used {live['steps_used']} (left {live['steps_left']}), time left "
            f"{live['time_left_s']:.0f} s"
        )
        lines.append(
            f"  spend settled {spend['settled']['usd']:.6f} USD, reserved "
            f"{spend['reserved']['usd']:.6f} USD, final {spend['final']}"
        )
        storage = spend.get("storage") or {}
        if storage.get("cap_bytes") is not None:
            lines.append(
                f"  storage {storage['bytes']} bytes kept, {storage['reserved_bytes']} held for "
                f"live jobs, of a cap of {storage['cap_bytes']} ({storage['usd']:.6f} USD)"
            )
        end = live.get("end")
        if end:
            lines.append(f"  end: {end['reason']}, reward {end['reward']}")
        for job in live["jobs"]:
            lines.append(
                f"  job {job['job_id']}  {job['state']}  {job['flavor']}  "
                f"cost {job['cost_usd']:.6f} USD  reserved {job['reserved_usd']:.6f} USD"
                + (f"  ({job['message']})" if job.get("message") else "")
            )
    else:
        lines.append(f"  {s.get('live_error', 'no live status')}; attributes as last upserted:")
        lines.append(
            f"  steps used {s['steps_used']}, spend {s['spend_usd']} USD, reserved "
            f"{s['reserved_usd']} USD, end {s['end_reason']}, reward {s['reward']}"
        )
    for job in s["jobs"]:
        role = job["role"] or "?"
        line = f"  {role} workflow {job['workflow_id']}: {job['state']}"
        if job.get("backend_job_id"):
            line += f", backend job {job['backend_job_id']}"
        if job.get("cancel_pending_since"):
            line += (
                f", CANCELLATION UNCONFIRMED for {job['cancel_pending_s']} s "
                f"(since {job['cancel_pending_since']})"
            )
        lines.append(line)
    if s.get("ui"):
        lines.append(f"  Temporal UI: {s['ui']}")
    return "\n".join(lines)


# -- export ------------------------------------------------------------------------------------


async def export_record(client: Client, settings: Settings, episode_id: str) -> dict[str, Any]:
    """The audit record: the file written when the episode ended, or (while it runs, or when
    none was written) read from Temporal now. Validated against the published schema. Raises
    MalformedId, EpisodeNotFound, InvalidRecord."""
    from temporalio.service import RPCError, RPCStatusCode

    from activities.records.audit import record_path
    from posttrain_server.audit_trail import read_trail
    from workflows.ids import EPISODE_ID

    if not EPISODE_ID.fullmatch(episode_id):  # it names a file below
        raise MalformedId(f"{episode_id!r} is not an episode id (ep-<16 hex>)")
    path = record_path(settings.audit_folder, episode_id)
    if path.exists():
        record = json.loads(path.read_text())
    else:
        try:
            trail = await read_trail(client, episode_id)
        except RPCError as err:
            if err.status is RPCStatusCode.NOT_FOUND:
                raise EpisodeNotFound(
                    f"no audit record of {episode_id!r} in {path.parent} and no such episode "
                    "in Temporal"
                ) from None
            raise
        if trail.end is None:  # still open (running, or ending): its end is in its state
            await _add_live_end(client, trail)
        record = trail.model_dump(mode="json")
    validate_record(record)
    return record


async def _add_live_end(client: Client, record: AuditRecord) -> None:
    """An open episode's history holds no end (the run's result): take the end and the spend
    from its live status, or, when no worker answers, from its search attributes."""
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError

    from posttrain_common.contracts.audit import AuditEnd
    from workflows.episode.workflow import EpisodeWorkflow
    from workflows.ids import episode_workflow_id
    from workflows.operations import search_attributes as sa

    handle = client.get_workflow_handle(episode_workflow_id(record.episode_id))
    try:
        live = await handle.query(EpisodeWorkflow.status, rpc_timeout=STATUS_QUERY_TIMEOUT)
    except (RPCError, WorkflowQueryFailedError):
        attrs = (await handle.describe()).typed_search_attributes
        reason = attrs.get(sa.END_REASON)
        if reason is not None:
            record.end = AuditEnd(reason=reason, reward=attrs.get(sa.REWARD))
        record.final_spend_micro_usd = attrs.get(sa.SPEND_MICRO_USD) or 0
        record.reserved_micro_usd = attrs.get(sa.RESERVED_MICRO_USD) or 0
        return
    if live.end is not None:
        end = live.end
        record.end = AuditEnd(
            reason=end.reason.value, reward=end.reward, invalid_score=end.invalid_score
        )
    spend = live.service_spend
    record.final_spend_micro_usd = round(spend.settled.usd * 1_000_000)
    record.reserved_micro_usd = round(spend.reserved.usd * 1_000_000)


def validate_record(record: dict[str, Any]) -> None:
    """Raises InvalidRecord naming the first place the record breaks the schema."""
    import jsonschema

    from posttrain_common.contracts.audit import SCHEMA_PATH

    schema = json.loads(SCHEMA_PATH.read_text())
    try:
        jsonschema.validate(record, schema, cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError as err:
        where = "/".join(str(p) for p in err.absolute_path) or "(the record)"
        raise InvalidRecord(
            f"the audit record breaks its schema at {where}: {err.message}"
        ) from None
