"""The job watchers' sizes (DESIGN §11, "no single workflow grows with the deployment").

Jobs are followed by `watch_shards` watcher workflows per task queue, each job by the shard a
stable hash of its workflow id picks (`workflows.ids.watcher_shard_id`). What one shard carries
and sends is bounded by what it follows: a look sends the states it knows and gets back only
the jobs whose state changed, and a shard continues as new before its history passes a budget.
"""

from __future__ import annotations

from posttrain_env.limits import KIB

# 10,000 running jobs over 16 shards is about 625 a shard (a SHA-256 of the job's workflow id
# spreads them evenly: the scale bench measures the largest shard).
DEFAULT_WATCH_SHARDS = 16
MAX_WATCH_SHARDS = 1024
# The most jobs one shard is sized for: its carry, a look's request and a look's answer stay
# under WATCHER_PAYLOAD_BUDGET with every field at its largest (tests/workflows/
# test_watcher_shards.py). A shard past it still follows every job (money first) and warns at
# each look: raise POSTTRAIN_WATCH_SHARDS.
MAX_JOBS_PER_SHARD = 1000
WATCHER_PAYLOAD_BUDGET = 512 * KIB
# A shard continues as new past this much history (Temporal's own limit is 50 MB, and its
# suggestion comes at ~4,000 events or 10 MB; a shard's carry must be re-read at each start).
WATCHER_HISTORY_BUDGET_BYTES = 4 * 1024 * KIB
# Jobs whose end a shard reported, remembered (the latest this many, by a 16-character digest)
# so that a retried submit's late registration of an ended job is not followed and reported a
# second time.
MAX_ENDED_REMEMBERED = 2000
# A look answers at most this many bytes of changed jobs, ends first; the others are answered at
# the next look (a job's view is at most ~1.3 KiB, its message cut at 1,024 characters).
OBSERVE_ANSWER_BUDGET = 256 * KIB
