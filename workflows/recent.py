"""The answers an episode remembers, so that a request sent again is answered once (pure).

Temporal deduplicates update ids within one run only, so the episode carries the results of its
recent requests through continue-as-new. They are kept within RECENT_RESULTS_BYTES, oldest
dropped first; a dropped request is remembered by a short hash, and sending it again is refused
as `already_answered` instead of running it a second time. Steps are bounded (MAX_STEPS), so
the hashes are too.
"""

from __future__ import annotations

import hashlib

from posttrain_env.limits import RECENT_RESULTS_BYTES
from workflows.episode_contract import ToolResult
from workflows.episode_state import EpisodeCarry

# 64 bits: among the at most MAX_STEPS requests of an episode a collision is out of reach.
_HASH_CHARS = 16


def request_hash(request_id: str) -> str:
    return hashlib.sha256(request_id.encode()).hexdigest()[:_HASH_CHARS]


def remember(
    carry: EpisodeCarry, request_id: str, result: ToolResult, budget: int = RECENT_RESULTS_BYTES
) -> None:
    """Keep `result` as the answer to `request_id`; drop the oldest answers beyond `budget`."""
    carry.recent[request_id] = result
    carry.recent_sizes[request_id] = len(result.model_dump_json())
    total = sum(_size(carry, rid) for rid in carry.recent)
    while total > budget and len(carry.recent) > 1:
        oldest = next(iter(carry.recent))
        total -= _size(carry, oldest)
        del carry.recent[oldest]
        carry.recent_sizes.pop(oldest, None)
        carry.answered.append(request_hash(oldest))


def was_dropped(carry: EpisodeCarry, request_id: str) -> bool:
    """True when `request_id` was answered but its answer is no longer kept."""
    return request_id not in carry.recent and request_hash(request_id) in carry.answered


def _size(carry: EpisodeCarry, request_id: str) -> int:
    size = carry.recent_sizes.get(request_id)
    if size is None:  # carried over from a run that did not record sizes
        size = carry.recent_sizes[request_id] = len(carry.recent[request_id].model_dump_json())
    return size
