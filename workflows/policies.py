"""Named timeouts and retry policies for activities, next to nothing else (STYLE 5)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from temporalio.common import RetryPolicy

# NON_RETRYABLE, the failure types that retrying cannot fix: one list for every policy here.
from posttrain_common.failures import NON_RETRYABLE

# Starting a job: a few attempts with backoff (429/503), then hf_error to the agent.
SUBMIT_TIMEOUT = timedelta(seconds=120)
# The submit activity heartbeats (activities/jobs/activities.py SUBMIT_BEAT_S), so an attempt whose
# worker was killed is retried after this, not after SUBMIT_TIMEOUT: an evaluation killed
# inside its submit waited 120 s before (issue 18's fault matrix). Long enough that a worker's
# event loop stalled by load does not lose a live attempt to a second one.
SUBMIT_HEARTBEAT = timedelta(seconds=30)
SUBMIT_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=8,
    non_retryable_error_types=NON_RETRYABLE,
)

# Watching and cancelling must not give up: a job left unobserved may still be billing.
# One listing call is short; a short timeout means a worker killed mid-call delays the watch
# by seconds, not a minute (the activity does not heartbeat).
OBSERVE_TIMEOUT = timedelta(seconds=15)
PERSISTENT_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=0,
    non_retryable_error_types=NON_RETRYABLE,
)

# Reads the agent waits on (logs, scores, dataset checks, episode preparation).
READ_TIMEOUT = timedelta(seconds=60)
READ_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=20),
    maximum_attempts=5,
    non_retryable_error_types=NON_RETRYABLE,
)

# Reading an evaluation's score from its log: a paid grader's result, so retried longer than
# other reads. A read that still fails ends the evaluation unscored (`score_failed`, DESIGN §9:
# a Hugging Face fault is never the agent's score 0); a log read cut short is one such failure
# (activities/jobs/activities.py `read_score`), so it is retried, never taken as "no score line".
SCORE_READ_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=8,
    non_retryable_error_types=NON_RETRYABLE,
)

# Writing an episode's audit record reads its whole history (every run): minutes at most.
AUDIT_TIMEOUT = timedelta(minutes=5)
# The audit record is the episode's durable account (it outlives Temporal's retention), so its
# write is retried as persistently as watching, every 5 minutes at most: a full disk or an
# unreadable history keeps the episode's workflow open (its answer is already given and its
# money retired), counted by `posttrain_activity_retries_total{activity_type="write_audit"}` and
# alerted on (PosttrainAuditRecordUnwritten), instead of a warning in a log and no record.
AUDIT_RETRY = replace(PERSISTENT_RETRY, maximum_interval=timedelta(minutes=5))

# One retention sweep: bounded by its folder cap (RetentionPolicy.max_folders), it heartbeats
# per episode and per folder; a worker that dies mid-sweep is noticed within the heartbeat
# timeout, and the next attempt (or the next scheduled run) finishes the work.
RETENTION_TIMEOUT = timedelta(minutes=30)
RETENTION_HEARTBEAT = timedelta(minutes=2)
# The grader-side contamination check reads the episode's history and up to 256 MiB of datasets
# and scans them at a few MB/s: minutes, within this. Retried as reads are (a transient backend
# error); when it still fails, the episode ends with `check_failed` and its reward stands.
CONTAMINATION_TIMEOUT = timedelta(minutes=15)
