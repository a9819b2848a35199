"""The search attributes and memo that let an operator find episodes and jobs in Temporal (pure).

Declared once, here, as typed keys: the workflows upsert them, the embedded dev server and
`posttrain-env temporal setup` register them, `posttrain-env episodes` queries them. SQL
visibility (the embedded server's) allows at most 10 custom Keyword attributes per namespace,
so episodes and jobs share them: `PtState` is an episode's state on an `EpisodeWorkflow` and a
job's state on a `JobWorkflow`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from temporalio.common import SearchAttributeKey

# A memo is shown beside a workflow in the UI and `episodes show`; it holds ids only (never a
# secret, prompt or script), and is kept under this size (re-exported from the limits).
from posttrain_env.limits import MAX_MEMO_BYTES as MAX_MEMO_BYTES

# Keyword (9 of the 10 SQL visibility allows)
TASK = SearchAttributeKey.for_keyword("PtTask")
STATE = SearchAttributeKey.for_keyword("PtState")  # episode: EpisodePhase; job: JobState
END_REASON = SearchAttributeKey.for_keyword("PtEndReason")
BACKEND = SearchAttributeKey.for_keyword("PtBackend")
DEPLOYMENT = SearchAttributeKey.for_keyword("PtDeployment")
CAMPAIGN = SearchAttributeKey.for_keyword("PtCampaign")
ROLE = SearchAttributeKey.for_keyword("PtRole")  # jobs: agent | dev | grader
FLAVOR = SearchAttributeKey.for_keyword("PtFlavor")
BACKEND_JOB_ID = SearchAttributeKey.for_keyword("PtBackendJobId")
# Others
REWARD = SearchAttributeKey.for_float("PtReward")  # absent while there is none
SPEND_MICRO_USD = SearchAttributeKey.for_int("PtSpendMicroUsd")  # settled spend
# Held for jobs not yet settled (an episode's; 0 once every job is final).
RESERVED_MICRO_USD = SearchAttributeKey.for_int("PtReservedMicroUsd")
STEPS_USED = SearchAttributeKey.for_int("PtStepsUsed")
# When the oldest cancellation not yet confirmed was asked for; absent when none is pending.
CANCEL_PENDING_SINCE = SearchAttributeKey.for_datetime("PtCancelPendingSince")

SEARCH_ATTRIBUTES: Sequence[SearchAttributeKey[Any]] = (
    TASK,
    STATE,
    END_REASON,
    BACKEND,
    DEPLOYMENT,
    CAMPAIGN,
    ROLE,
    FLAVOR,
    BACKEND_JOB_ID,
    REWARD,
    SPEND_MICRO_USD,
    RESERVED_MICRO_USD,
    STEPS_USED,
    CANCEL_PENDING_SINCE,
)


class EpisodePhase(enum.StrEnum):
    """An episode's `PtState`."""

    running = "running"
    ending = "ending"  # ended, but some job is not confirmed final yet
    ended = "ended"


def type_name(key: SearchAttributeKey[Any]) -> str:
    """The type as `temporal server start-dev --search-attribute Name=Type` and `tcld` spell
    it (`Keyword`, `Int`, `Double`, `Datetime`)."""
    return key._metadata_type  # the SDK's own spelling, used by its start_local as well


def dev_server_flags() -> list[str]:
    """`--search-attribute Name=Type` for each attribute, for `temporal server start-dev`."""
    flags: list[str] = []
    for key in SEARCH_ATTRIBUTES:
        flags += ["--search-attribute", f"{key.name}={type_name(key)}"]
    return flags
