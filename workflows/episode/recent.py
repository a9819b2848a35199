"""The answers an episode remembers, so that a request sent again is answered once (pure).

Temporal deduplicates update ids within one run only, so the episode carries the results of its
recent requests through continue-as-new. They are kept within RECENT_RESULTS_BYTES, counted as
the data converter encodes them (UTF-8 JSON: a character can take 4 bytes, a control character
6), oldest dropped first; an answer larger than that whole budget is never kept. A request
whose answer is not kept is remembered by a short hash, and sending it again is refused as
`already_answered` instead of running it a second time. Steps are bounded (MAX_STEPS), so the
hashes are too.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pydantic_core

from posttrain_common.contracts.episode_calls import ToolResult
from posttrain_env.limits import RECENT_RESULTS_BYTES
from workflows.episode.state import EpisodeCarry

# 64 bits: among the at most MAX_STEPS requests of an episode a collision is out of reach.
_HASH_CHARS = 16


def request_hash(request_id: str) -> str:
    return hashlib.sha256(request_id.encode()).hexdigest()[:_HASH_CHARS]


def encoded_bytes(value: Any) -> int:
    """Bytes `value` takes in a payload: the pydantic data converter's `pydantic_core.to_json`."""
    return len(pydantic_core.to_json(value))


def remember(
    carry: EpisodeCarry, request_id: str, result: ToolResult, budget: int = RECENT_RESULTS_BYTES
) -> None:
    """Keep `result` as the answer to `request_id`; drop the oldest answers beyond `budget`.
    An answer larger than the whole budget is not kept, only remembered as answered."""
    size = encoded_bytes(result)
    if size > budget:
        carry.answered.append(request_hash(request_id))
        return
    carry.recent[request_id] = result
    carry.recent_bytes[request_id] = size
    total = recent_bytes(carry)
    while total > budget:
        total -= drop_oldest(carry)


def recent_bytes(carry: EpisodeCarry) -> int:
    """Bytes of every answer kept, encoded."""
    return sum(_size(carry, request_id) for request_id in carry.recent)


def drop_oldest(carry: EpisodeCarry) -> int:
    """Forget the oldest answer kept (its request stays answered); its size in bytes."""
    oldest = next(iter(carry.recent))
    size = _size(carry, oldest)
    del carry.recent[oldest]
    carry.recent_bytes.pop(oldest, None)
    carry.answered.append(request_hash(oldest))
    return size


def was_dropped(carry: EpisodeCarry, request_id: str) -> bool:
    """True when `request_id` was answered but its answer is no longer kept."""
    return request_id not in carry.recent and request_hash(request_id) in carry.answered


def _size(carry: EpisodeCarry, request_id: str) -> int:
    size = carry.recent_bytes.get(request_id)
    if size is None:  # carried over from a run that counted characters, or nothing
        size = carry.recent_bytes[request_id] = encoded_bytes(carry.recent[request_id])
    return size
