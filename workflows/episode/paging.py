"""Pages of an episode's jobs (pure): what `jobs_status` without a job id and the `status` query
answer, so that neither grows with the number of jobs.

Jobs are listed in the order they were started (the job table is a dict that is only ever
appended to, and keeps its order through continue-as-new), so a page's position in that list
stays valid while jobs are added: paging on never skips or repeats a job, and a job started
meanwhile appears on a later page. The cursor is that position with a tag binding it to the
episode and to the list it pages (an agent's jobs or every job): opaque to the caller, and one
taken from another episode or another list, or altered, is refused with a typed error.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from posttrain_env.errors import ErrorType, ToolError

T = TypeVar("T")
# Which list a cursor pages: `agent` (jobs_status: the agent's own jobs) or `all` (the status
# query: every job, evaluations included).
Scope = Literal["agent", "all"]
_TAG_CHARS = 16
_VERSION = "j1"


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    total: int  # items in the whole list as of this page
    next_cursor: str | None  # None on the last page


def cursor_at(episode_id: str, scope: Scope, position: int) -> str:
    """The cursor of the page starting at `position` of `scope`'s list of `episode_id`."""
    raw = f"{_VERSION}:{position}:{_tag(episode_id, scope, position)}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def position_of(episode_id: str, scope: Scope, cursor: str | None, total: int) -> int:
    """Where the page `cursor` names starts (0 without one). Raises ToolError(invalid_argument)
    for a cursor this episode did not give for this list."""
    if cursor is None:
        return 0
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        version, position_text, tag = (
            base64.urlsafe_b64decode(padded.encode("ascii")).decode("ascii").split(":")
        )
        position = int(position_text)
    except (ValueError, UnicodeError, binascii.Error):
        raise _bad_cursor("it is not a cursor this server gives") from None
    if version != _VERSION or position < 0 or tag != _tag(episode_id, scope, position):
        raise _bad_cursor("it was not given by this episode for this list")
    if position > total:  # jobs are never removed: no cursor of this episode points past them
        raise _bad_cursor("it points past this episode's jobs")
    return position


def page_of(
    episode_id: str, scope: Scope, items: Sequence[T], cursor: str | None, limit: int
) -> Page[T]:
    """The page of at most `limit` of `items` (in their order) that `cursor` names."""
    start = position_of(episode_id, scope, cursor, len(items))
    end = min(len(items), start + limit)
    following = cursor_at(episode_id, scope, end) if end < len(items) else None
    return Page(items=list(items[start:end]), total=len(items), next_cursor=following)


def _tag(episode_id: str, scope: Scope, position: int) -> str:
    return hashlib.sha256(f"{episode_id}\n{scope}\n{position}".encode()).hexdigest()[:_TAG_CHARS]


def _bad_cursor(why: str) -> ToolError:
    return ToolError(
        ErrorType.invalid_argument,
        f"argument 'cursor': {why}; pass the `next_cursor` of the previous page, or no cursor "
        "for the first page",
        field="cursor",
    )
