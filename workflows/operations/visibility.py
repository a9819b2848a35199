"""What an episode and a job show an operator: their search attributes and memo.

`episode_attributes` and `job_attributes` are pure (tested without Temporal). `Visibility` is
the workflow-side half: it upserts only the attributes that changed, and only when a change
that matters happened (a state, an end, a job started or settled, a cancellation pending or
confirmed). `PtStepsUsed` rides along with those and is not a reason to upsert on its own, so a
tool call that changes nothing else costs no history event.

Workflows that recorded histories before this existed must replay unchanged: the upserts run
only under `workflow.patched(VISIBILITY_PATCH)`. `PtReservedMicroUsd` came later, under
`RESERVED_PATCH`: it is not a rider, because a job's start changes the reservation and nothing
else, and the operator's "reservation held by an ended episode" must see it fall to 0 when the
last job settles, not at some later change. Histories recorded before it lack those upserts, so
an episode shows it only when its run found the patch. A job shows its own reservation from its
start (given by the episode) and 0 once it is final, in the upsert of its final state: no upsert
of its own, so no patch (a job recorded before reserves 0 in its input, and its upserts replay
unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributeUpdate

from posttrain_common.contracts.episodes import EpisodeSetup
from posttrain_env.limits import MAX_MEMO_VALUE_CHARS
from posttrain_env.models import JobState
from workflows.episode.state import EpisodeCarry
from workflows.operations import search_attributes as sa

VISIBILITY_PATCH = "pt-visibility-1"
RESERVED_PATCH = "pt-visibility-reserved-1"
MEMO_VALUE_CHARS = MAX_MEMO_VALUE_CHARS

Attributes = dict[SearchAttributeKey[Any], Any]  # a value of None: the attribute is unset
# Changes of these alone never cause an upsert.
_RIDERS: frozenset[str] = frozenset({sa.STEPS_USED.name})


def cancel_pending_since(carry: EpisodeCarry) -> datetime | None:
    """When the oldest cancellation still unconfirmed was asked for (None: none is pending)."""
    pending = [
        r.cancel_requested_at
        for r in carry.jobs.values()
        if r.state is JobState.cancelling and not r.final and r.cancel_requested_at is not None
    ]
    return min(pending) if pending else None


def episode_phase(carry: EpisodeCarry, *, closing: bool = False) -> sa.EpisodePhase:
    if carry.end is None:
        return sa.EpisodePhase.running
    return sa.EpisodePhase.ended if closing else sa.EpisodePhase.ending


def episode_attributes(
    setup: EpisodeSetup, carry: EpisodeCarry, *, closing: bool = False
) -> Attributes:
    end = carry.end
    return {
        sa.TASK: setup.task.id,
        sa.STATE: episode_phase(carry, closing=closing).value,
        sa.END_REASON: end.reason.value if end else None,
        sa.REWARD: end.reward if end else None,
        sa.BACKEND: setup.backend,
        sa.DEPLOYMENT: setup.deployment,
        sa.CAMPAIGN: setup.campaign_id,
        sa.SPEND_MICRO_USD: carry.ledger.settled_micro_usd,
        sa.RESERVED_MICRO_USD: carry.ledger.reserved_micro_usd,
        sa.STEPS_USED: carry.steps_used,
        sa.CANCEL_PENDING_SINCE: cancel_pending_since(carry),
    }


def episode_memo(setup: EpisodeSetup) -> dict[str, str]:
    return bounded_memo(
        {
            "episode_id": setup.episode_id,
            "task_id": setup.task.id,
            "base_model": setup.base_model.repo_id,
            "base_model_commit": setup.base_model.revision,
        }
    )


def job_attributes(
    *,
    state: JobState,
    backend_job_id: str | None,
    cancel_requested_at: datetime | None,
    reserved_micro_usd: int = 0,
) -> Attributes:
    """What changes on a job (its task, role and flavor are set at its start): its reservation
    is held until it is final, then 0 (the episode has settled it)."""
    return {
        sa.STATE: state.value,
        sa.BACKEND_JOB_ID: backend_job_id,
        sa.CANCEL_PENDING_SINCE: None if state.terminal else cancel_requested_at,
        sa.RESERVED_MICRO_USD: 0 if state.terminal else reserved_micro_usd,
    }


# What a memo entry takes besides its value, as the data converter writes it (UTF-8 JSON):
# its key (ours are at most 20 characters), the quotes, with room to spare.
MEMO_ENTRY_OVERHEAD_BYTES = 64


def bounded_memo(memo: Mapping[str, str]) -> dict[str, str]:
    """The memo, each value cut to MEMO_VALUE_CHARS characters and to its share of
    MAX_MEMO_BYTES in UTF-8 (what the data converter writes), whole characters only (a lone
    surrogate, which has no UTF-8, is dropped). Ids are ASCII and never cut (a Hub repo id is
    at most 96 characters, a commit 40); a value of four-byte characters keeps 86 of them in a
    memo of five, 100 in one of four."""
    share = sa.MAX_MEMO_BYTES // max(len(memo), 1) - MEMO_ENTRY_OVERHEAD_BYTES
    return {k: _utf8_prefix(v[:MEMO_VALUE_CHARS], share) for k, v in memo.items()}


def _utf8_prefix(text: str, max_bytes: int) -> str:
    return text.encode(errors="ignore")[:max_bytes].decode(errors="ignore")


def changes(before: Attributes, after: Attributes) -> list[SearchAttributeUpdate[Any]]:
    """The updates that take `before` to `after`, or [] when only riders changed."""
    changed = [k for k, v in after.items() if before.get(k) != v]
    if all(k.name in _RIDERS for k in changed):
        return []
    updates: list[SearchAttributeUpdate[Any]] = []
    for key in changed:
        value = after[key]
        updates.append(key.value_unset() if value is None else key.value_set(value))
    return updates


class Visibility:
    """Workflow code: upserts what changed. Off until `enable()` finds the patch (histories
    recorded before it replay without upserts)."""

    def __init__(self) -> None:
        self._on = False
        self._reserved = False  # show sa.RESERVED_MICRO_USD (RESERVED_PATCH)
        self._shown: Attributes = {}

    def enable(self, memo: dict[str, str] | None = None, *, taken: bool = False) -> bool:
        """`taken`: the run took a later patch that implies both of these (an episode's
        pt-known-runs-1), so neither is asked."""
        self._on = taken or workflow.patched(VISIBILITY_PATCH)
        if self._on:
            # Asked once per run, here: runs recorded before it never show the reservation.
            self._reserved = taken or workflow.patched(RESERVED_PATCH)
        if self._on and memo:
            workflow.upsert_memo(memo)
        return self._on

    def enable_unpatched(self, shown: Attributes) -> None:
        """On, with `shown` already set (at the workflow's start, by its parent), the
        reservation among them when `shown` has it (a job's, since issue 45)."""
        self._on = True
        self._reserved = sa.RESERVED_MICRO_USD in shown
        self._shown = dict(shown)

    def show(self, attributes: Attributes) -> None:
        if not self._on:
            return
        if not self._reserved:
            attributes = {k: v for k, v in attributes.items() if k != sa.RESERVED_MICRO_USD}
        updates = changes(self._shown, attributes)
        if updates:
            workflow.upsert_search_attributes(updates)
            self._shown = dict(attributes)
