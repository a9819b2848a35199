"""Every limit of the system, defined once (DESIGN §9 "Limits", §10 "bounded by construction").

Two kinds. Limits an agent meets (argument sizes, waits, log answers) are part of the contract
and are listed in docs/development.md ("Limits"). Limits that keep what crosses Temporal below its
2 MB payload
limit are chosen so that no sum of bounded parts can reach it: a payload over that limit is not
refused cleanly, it wedges the workflow task in a retry loop (FACTS.md), so nothing may depend
on Temporal to enforce them. Each limit has a test.

Pure (standard library only), so the client, the gateway and workflow code all import it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KIB = 1024
MIB = 1024 * KIB

# -- what Temporal allows ------------------------------------------------------------------------
# Temporal's per-payload error limit (the SDK's and the server's `limit.blobSize.error`).
TEMPORAL_PAYLOAD_LIMIT_BYTES = 2 * MIB
# What the gateway sends in one update, at most: well below that limit.
MAX_UPDATE_BYTES = 3 * MIB // 2
# What an episode answers one update with, at most, encoded (the worker's last guard; answers
# are bounded far below it by construction): a larger answer is replaced by a typed error.
MAX_ANSWER_BYTES = 1 * MIB
# What an episode hands to its next run at continue-as-new, at most, encoded (the worker's last
# guard: over it, the episode drops its carried answers, then shortens its finished jobs' texts).
# CARRY_BUDGET_BYTES, the budget of every carry (the worst case fits only by that guard).
MAX_CARRY_BYTES = 512 * KIB

# -- transport (every route of the gateway) ------------------------------------------------------
# HTTP request bodies and WebSocket messages: refused above this without being read whole.
MAX_BODY_BYTES = 32 * MIB
# JSON nested deeper than this is refused as malformed (a clean 400 / parse error).
MAX_JSON_DEPTH = 64

# -- tool arguments ------------------------------------------------------------------------------
# A tool call's arguments, measured as JSON as the data converter encodes them.
MAX_ARGUMENTS_BYTES = 1 * MIB
MAX_SCRIPT_BYTES = 256 * KIB  # UTF-8
MAX_DEPENDENCIES = 64
MAX_REQUIREMENT_CHARS = 256  # one requirement string: longer is not a plain requirement
MAX_DATASETS = 16
MAX_REPO_ID_CHARS = 200  # `<namespace>/<name>`; Hugging Face allows 96 characters per part
MAX_JOB_ID_CHARS = 64
MAX_FLAVOR_CHARS = 64
MAX_TOOL_NAME_CHARS = 64
MAX_REQUEST_ID_CHARS = 200  # printable ASCII
MAX_WAIT_TIMEOUT_S = 600
DEFAULT_WAIT_TIMEOUT_S = 300
MAX_LOG_TAIL = 2000
DEFAULT_LOG_TAIL = 200
# `jobs_status` without a job id answers a page of jobs: this many by default, at most
# MAX_JOBS_PAGE (a job's view takes at most about 7 KiB as JSON, its message being the largest
# part, so a full page stays far below 512 KiB). A page's `next_cursor` is at most this long.
DEFAULT_JOBS_PAGE = 20
MAX_JOBS_PAGE = 50
MAX_CURSOR_CHARS = 128

# -- what comes back -----------------------------------------------------------------------------
# `jobs_logs`: each line cut to this many bytes (as JSON), the whole answer at most this many.
MAX_LOG_LINE_BYTES = 4 * KIB
MAX_LOG_ANSWER_BYTES = 64 * KIB
# How much of a job's log a backend reads to find its last lines.
MAX_LOG_READ_BYTES = 8 * MIB
# Any text a job, an agent or an artifact controls that enters the system as a message or a
# reason (job messages, error messages, evaluator reasons): cut to this many characters (a
# character takes up to 4 bytes in UTF-8, and a control character 6 as JSON).
MAX_MESSAGE_CHARS = 1024
# Each string detail of an error (`{"error": {"type", "message", <details>}}`: the requirement,
# job id, field or dataset it is about): cut to this many characters. Every legitimate one is
# shorter (a requirement is at most MAX_REQUIREMENT_CHARS).
MAX_ERROR_DETAIL_CHARS = 300
# An evaluator's score details (JSON): larger details are replaced by a note saying so.
MAX_SCORE_DETAILS_BYTES = 8 * KIB
# A trusted line (`POSTTRAIN_SCORE <nonce> {json}`, `POSTTRAIN_LAUNCHER ...`) is at most this
# many characters; a longer line is not read at all. job_launcher/trusted_lines.py keeps its own
# copy (the launcher's package is self-contained); a test binds the two.
MAX_TRUSTED_LINE_CHARS = 16_384
# Lines of a failed job's log read for the launcher's own lines (why it failed), and how much
# of the launcher's error is kept in the job's message; versions kept per job for the audit.
LAUNCHER_LOG_TAIL = 2000
MAX_LAUNCHER_ERROR_CHARS = 600
MAX_LAUNCHER_PACKAGES = 512
# A retention sweep's messages (why a folder was refused or failed), in characters.
MAX_RETENTION_MESSAGE_CHARS = 300
# A workflow's memo (shown beside it in the UI and `episodes show`; ids only), and each of its
# values in characters (each is also cut to its share of the bytes in UTF-8:
# workflows/operations/visibility.py, `bounded_memo`).
MAX_MEMO_BYTES = 2048
MAX_MEMO_VALUE_CHARS = 100

# -- what an episode carries (its continue-as-new input stays far below the payload limit) --------
# Results of recent requests, kept so that a re-sent request is answered once; oldest dropped
# first. Requests whose result was dropped are remembered by a short hash and refused.
RECENT_RESULTS_BYTES = 256 * KIB
# Steps per episode (a task's `max_steps` may not exceed this) and jobs per episode (agent jobs
# and evaluations together).
MAX_STEPS = 10_000
MAX_JOBS_PER_EPISODE = 256
# Continue as new once the history is this large (Temporal terminates a workflow at 50 MB), as
# well as when Temporal suggests it.
CONTINUE_AS_NEW_HISTORY_BYTES = 8 * MIB
# When the continue-as-new input would pass MAX_CARRY_BYTES even without carried answers, the
# texts of finished jobs (message, error, evaluator reason) are shortened to this many
# characters, oldest job first, and their evaluator details replaced by a note.
COMPACT_JOB_TEXT_CHARS = 120
# ... and, when that is not enough (256 finished jobs whose every text is at its limit in
# four-byte characters), to this many, their errors to their type and message alone.
MIN_JOB_TEXT_CHARS = 24

# -- the contamination check (activities/contamination/activities.py; docs/tasks.md, "Contamination
# check")
# ---------
# Bytes of one mounted dataset the check reads (its files in path order, the last one cut):
# what a grader-side scan of sixteen datasets can afford in minutes of one CPU.
CONTAMINATION_DATASET_BYTES = 32 * MIB
# ... and of all the datasets an episode mounted together (datasets past it are listed as not
# read). The scan reads a few MB of text per second: this keeps a check within minutes.
CONTAMINATION_TOTAL_BYTES = 256 * MIB
# Bytes of one agent job's outputs (`/data/outputs/`) the check reads: every file but the
# weights first, then each weights file's header only (activities/contamination/dataset_bytes.py
# `outputs_order`); and of all the episode's agent jobs together (the submitted job first).
CONTAMINATION_OUTPUTS_BYTES = 32 * MIB
CONTAMINATION_OUTPUTS_TOTAL_BYTES = 128 * MIB
# A task's test items file: larger ones are refused (the check reports `check_failed`).
CONTAMINATION_ITEMS_BYTES = 16 * MIB
# Evidence kept for the audit record (it crosses Temporal once, in the check's result): this
# many matched items, each with this many places and a snippet of this many characters.
MAX_CONTAMINATION_EVIDENCE = 50
MAX_CONTAMINATION_PLACES = 4
MAX_CONTAMINATION_SNIPPET_CHARS = 300

# -- campaigns (a spec, its agents' turns, what a campaign carries) --------------------------------
# A campaign's rollouts (tasks x agents x epochs), and how many may be in flight at once.
MAX_CAMPAIGN_ROLLOUTS = 100_000
MAX_CONCURRENCY = 1_000
MAX_CAMPAIGN_TASKS = 64
MAX_CAMPAIGN_AGENTS = 64
# An agent's arguments, as JSON: they travel in every rollout's input (workflow history).
MAX_AGENT_ARGS_BYTES = 16 * KIB
# Turns per rollout (each turn is one agent reply), and tool calls in one turn.
MAX_AGENT_TURNS = 10_000
MAX_AGENT_CALLS_PER_TURN = 16
# What an agent's process may print as its turn (a script argument is at most 256 KiB).
MAX_AGENT_TURN_BYTES = 4 * MIB
# A tool's answer as an LLM agent reads it (its context is finite); longer ones are cut.
MAX_TOOL_MESSAGE_CHARS = 20_000
# In-flight rollouts named in a campaign's status (the counts cover them all).
MAX_STATUS_ROLLOUTS_LISTED = 100
# Rollouts one `campaign retry` queues (each a few integers in the campaign's carry); a
# second `retry` takes the rest.
MAX_RETRIES_PER_REQUEST = 5_000
# New attempts waiting in a campaign's carry (asked for by `campaign retry`, or after an
# `error`), at most. At the cap, `campaign retry` queues none (it answers `more`: ask again once
# some started) and an attempt that ends in `error` is counted as an error, not retried
# (`campaign retry --only errors` runs it again later).
MAX_QUEUED_RETRIES = 1_000
# A campaign's spec as JSON (it travels in the campaign's input and carry), and each of its task
# ids (they are part of every rollout id, the keys of the in-flight set): larger specs are
# refused where a spec is read (`parse_spec`).
MAX_CAMPAIGN_SPEC_BYTES = 64 * KIB
MAX_CAMPAIGN_TASK_ID_CHARS = 64
# A task as JSON (its prompt most of it): it travels in every episode's input and carry and in
# its session's, so a larger `task.toml` is refused where it is loaded.
MAX_TASK_SPEC_BYTES = 32 * KIB
# Live episodes the server-wide account tracks (when a cap is set), whatever
# POSTTRAIN_MAX_LIVE_EPISODES says: one more is refused as `limit_reached`. Each takes about 42
# bytes of the account's carry.
MAX_TRACKED_EPISODES = 10_000
# What any continue-as-new carry may take at its limits, encoded (issue 27: no payload above
# this): each carry has a test filling it to its caps and measuring it against this budget.
CARRY_BUDGET_BYTES = 512 * KIB

# -- the Hugging Face Hub (activities/backends/hf)
# --------------------------------------------------------
# Every Hub request (activities/backends/hf/http.py), in seconds. Each is shorter than the shortest
# activity
# that calls the Hub (observe_jobs and cancel_job: 15 s), so one stalled request can fail its
# activity attempt but never outlast it.
HUB_CONNECT_TIMEOUT_S = 5.0
HUB_READ_TIMEOUT_S = 10.0  # between two bytes of an answer
HUB_WRITE_TIMEOUT_S = 10.0
HUB_POOL_TIMEOUT_S = 5.0  # waiting for a free connection of the shared client
# A whole Hub call (all of its requests) made outside an activity, e.g. by the smoke script.
HUB_CALL_TIMEOUT_S = 60.0
# Inside an activity a call must be over this long before the activity's own timeout: Temporal
# may start the retry as soon as that timeout passes.
HUB_ACTIVITY_MARGIN_S = 2.0
# Threads for Hub calls (huggingface_hub is synchronous), a pool of their own.
HUB_CALL_THREADS = 8
# A 429's rate-limit reset (or a Retry-After) is honoured as the next attempt's delay up to this.
HUB_MAX_RETRY_AFTER_S = 600.0
# A retried submit looks for its earlier attempt's job at least this many times, this far apart,
# and for at least this long before it creates anything (the Hub's listing can lag a new job).
SUBMIT_SETTLE_LOOKS = 3
SUBMIT_LOOK_INTERVAL_S = 5.0
SUBMIT_SETTLE_S = 30.0
# A job the Hub answers 404 for counts as vanished (settled at its whole reservation) after this
# many consecutive 404s spread over at least this long.
VANISHED_AFTER_LOOKS = 3
VANISHED_AFTER_S = 300.0


def cut_text(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text`, cut to at most `limit` characters with a marker saying how much was dropped."""
    if len(text) <= limit:
        return text
    marker = f" [... cut from {len(text)} characters]"
    return text[: max(0, limit - len(marker))] + marker


def json_size(text: str) -> int:
    """Bytes `text` takes as a JSON string (UTF-8, quotes and escapes included)."""
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8"))


def cut_to_json_bytes(text: str, limit: int) -> str:
    """The longest prefix of `text` whose JSON encoding takes at most `limit` bytes."""
    if json_size(text) <= limit:
        return text
    low, high = 0, min(len(text), limit)  # a character takes at least one byte
    while low < high:
        middle = (low + high + 1) // 2
        if json_size(text[:middle]) <= limit:
            low = middle
        else:
            high = middle - 1
    return text[:low]


@dataclass(frozen=True)
class LogTail:
    """The end of a job's log as `jobs_logs` answers it, and what was cut to fit the limits."""

    lines: list[str]
    dropped_lines: int = 0  # lines of the requested tail left out to keep the answer small
    cut_bytes: int = 0  # bytes removed from lines longer than MAX_LOG_LINE_BYTES


def bound_log_lines(
    lines: list[str],
    tail: int,
    line_bytes: int = MAX_LOG_LINE_BYTES,
    answer_bytes: int = MAX_LOG_ANSWER_BYTES,
) -> LogTail:
    """The last `tail` lines, each cut to `line_bytes` (as JSON), then the oldest dropped until
    all of them together take at most `answer_bytes` as a JSON list."""
    wanted = lines[-tail:] if tail > 0 else []
    kept: list[str] = []
    cut = 0
    for line in wanted:
        short = cut_to_json_bytes(line, line_bytes)
        cut += len(line.encode("utf-8", "replace")) - len(short.encode("utf-8", "replace"))
        kept.append(short)
    total = 2 + sum(json_size(line) + 1 for line in kept)  # brackets and commas
    first = 0
    while first < len(kept) and total > answer_bytes:
        total -= json_size(kept[first]) + 1
        first += 1
    return LogTail(lines=kept[first:], dropped_lines=first, cut_bytes=cut)


# -- local jobs (the local backend; docs/backends.md, "Local backend")
# ---------------------------------------
GIB = 1024 * MIB


@dataclass(frozen=True)
class FlavorSize:
    """What a flavor gives one job on Hugging Face (its hardware list: `cpu`, `ram`)."""

    vcpus: float
    memory_bytes: int


# Hugging Face's CPU flavors ("16 GB" taken as GiB). A local job gets its flavor's size, scaled
# down to what this machine can give (never more than the jobs' share of it). A flavor not in
# this table is sized as cpu-basic.
HF_CPU_FLAVORS: dict[str, FlavorSize] = {
    "cpu-basic": FlavorSize(vcpus=2, memory_bytes=16 * GIB),
    "cpu-upgrade": FlavorSize(vcpus=8, memory_bytes=32 * GIB),
}
DEFAULT_FLAVOR = "cpu-basic"
# All local jobs together use at most this share of the machine's memory (a memory limit on
# their parent control group); the rest is the reserve of the server, the worker, Temporal and
# the operating system.
LOCAL_MEMORY_SHARE = 0.75
# All local jobs together use at most this share of the machine's CPUs (a CPU quota on their
# parent group). 1.0: no quota, the reserve below is a weight.
LOCAL_CPU_SHARE = 1.0
# CPU weights (cgroup v2 units: 100 is a default process's or group's; v1 shares are 10.24x).
# Under contention, all local jobs together weigh as much as one busy process of the server, so
# the server, the worker and Temporal keep most of the CPU they ask for; each job weighs the
# same as every other, so one job cannot crowd out another episode's.
LOCAL_JOBS_CPU_WEIGHT = 100
LOCAL_JOB_CPU_WEIGHT = 100
# A job that has used this much CPU time weighs LOCAL_BUSY_JOB_CPU_WEIGHT from then on: under
# contention a busy job (a training, a fork storm, a CPU hog) yields to jobs that have used
# little (a small job, an evaluation, another episode's first minute), which then run within
# 1.25x of their time alone instead of 2x; alone, a job still takes every CPU it can use, and
# two busy jobs still share equally. As the schedulers of old Unix decayed a CPU hog's priority.
LOCAL_BUSY_JOB_AFTER_CPU_S = 10.0
LOCAL_BUSY_JOB_CPU_WEIGHT = 25
# What a job may read and write per second on its own disk (its loop device; cgroup v1 blkio
# throttling, held where a job's own process submits the I/O: its fsyncs, direct writes and
# reads). A fifth of this machine's disk (about 300 MB/s): a job that fsyncs without end leaves
# the rest for other episodes' jobs and Temporal's own fsyncs; a 1 GB checkpoint still takes
# 16 s. Buffered writes the kernel's flusher writes back are not held (v1 cannot charge them).
LOCAL_JOB_DISK_BYTES_PER_S = 64 << 20
LOCAL_JOB_DISK_IOPS = 2000
# Per job, whatever its flavor:
LOCAL_JOB_PROCESSES = 1024  # processes and threads (its pids group; RLIMIT_NPROC without one)
LOCAL_JOB_DISK_BYTES = 8 * GIB  # /data, /tmp and the venv: one filesystem of this size
LOCAL_JOB_FILES = 100_000  # that filesystem's inodes (and /dev/shm's)
LOCAL_JOB_LOG_BYTES = 1 * GIB  # the job's log (stdout and stderr of every phase)
LOCAL_ARTIFACT_CAP_BYTES = 2 * GIB  # /data/outputs, unless the task sets its own cap
# An artifact holds at most this many folder levels below outputs/ (deeper ones refuse the
# outputs whole): nothing a checkpoint needs, and no walk over it can go deep.
MAX_ARTIFACT_DEPTH = 64
# ... and no path (relative to outputs/) longer than this, so every path it holds stays far
# below PATH_MAX for whoever reads it.
MAX_ARTIFACT_PATH_BYTES = 1024

# -- storage: what one episode's artifacts may hold, and what they cost (DESIGN §12) ------------
# Every agent job's artifact counts against its episode's storage cap (a task's
# `storage_cap_bytes`, else its backend's default below) by apparent size; a job may keep at
# most what its episode has left when it starts (reserved like money, settled at what it kept).
HF_ARTIFACT_CAP_BYTES = 20 * GIB  # one job's outputs on Hugging Face, unless the task sets one
HF_EPISODE_STORAGE_BYTES = 100 * GIB  # five artifacts at their cap
LOCAL_EPISODE_STORAGE_BYTES = 8 * GIB  # four local artifacts at their cap
# The price of storage: the Hub's list price of pay-as-you-go private storage
# (hf.co/docs/hub/billing, "$25/TB/month"), a setting (POSTTRAIN_STORAGE_USD_PER_TB_MONTH);
# simulated on the local backend, as its job prices are. An artifact is charged once, when its
# job ends, for the days job folders are kept (POSTTRAIN_JOB_RETENTION_DAYS; kept forever:
# STORAGE_DAYS_WHEN_KEPT_FOREVER, a year, the bound a budget can reserve).
STORAGE_USD_PER_TB_MONTH = 25.0
STORAGE_DAYS_WHEN_KEPT_FOREVER = 365


def artifact_over_cap(
    size: int, artifact_cap: int, storage_left: int | None = None, storage_cap: int | None = None
) -> dict[str, Any] | None:
    """Whether an artifact of `size` apparent bytes goes over the job's `artifact_cap` or what
    its episode may still keep (`storage_left` of its `storage_cap`; None: not counted): None
    when it fits, else `{"cap": "artifact" | "storage", "cap_bytes", "over_by_bytes",
    "message"}`, the cap it meets first (the smaller). One rule for every backend: the local
    supervisor's collection and the measurement of a Hugging Face job's folder."""
    if size > artifact_cap and (storage_left is None or artifact_cap <= storage_left):
        return {
            "cap": "artifact",
            "cap_bytes": artifact_cap,
            "over_by_bytes": size - artifact_cap,
            "message": f"its outputs hold {size} bytes, {size - artifact_cap} over this job's "
            f"artifact cap of {artifact_cap} bytes; nothing was kept",
        }
    if storage_left is not None and size > storage_left:
        of = "" if storage_cap is None else f" of its {storage_cap}-byte storage cap"
        return {
            "cap": "storage",
            "cap_bytes": storage_cap,
            "over_by_bytes": size - storage_left,
            "message": f"its outputs hold {size} bytes, {size - storage_left} over the "
            f"{storage_left} bytes this episode could still keep{of} (its other jobs' "
            "artifacts count); nothing was kept",
        }
    return None
