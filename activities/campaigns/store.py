"""A campaign's folder on disk: conversations by content hash, agent turns by position, the
records (appended once per attempt) and the campaign's description (records.py has the layout).

Both workers use it (the main one for tool answers and records, the agent worker for turns), so
every write is atomic (a temporary file renamed into place) or an append under a lock, and
every read tolerates a crash of the other side mid-write. Nothing large enters workflow
history: workflows hold the short hashes this module returns.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from posttrain_common.campaigns.records import (
    META_FILE,
    RECORDS_FILE,
    CampaignMeta,
    RolloutRecord,
    record_line,
)
from posttrain_common.campaigns.spec import CAMPAIGN_ID
from posttrain_env.agents.conversation import Conversation, Message, TaskBrief, Turn

CONVERSATIONS = "conversations"
TURNS = "turns"


class StoreError(RuntimeError):
    """Something the store holds is missing or unreadable."""


class _Link(BaseModel):
    """One link of a stored conversation: the messages added after `parent`."""

    parent: str | None = None
    brief: TaskBrief | None = None  # the first link only
    messages: list[Message] = Field(default_factory=list)


class StoredTurn(BaseModel):
    turn: Turn
    conversation: str  # the conversation's head once the turn's messages were added


@dataclass
class _RecordIndex:
    """The (rollout, attempt) keys of records.jsonl up to `offset` bytes (one per process)."""

    offset: int = 0
    keys: set[tuple[str, int]] = field(default_factory=set)


class CampaignStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._indexes: dict[str, _RecordIndex] = {}

    def folder(self, campaign_id: str) -> Path:
        if not CAMPAIGN_ID.fullmatch(campaign_id):  # it is joined to a path
            raise StoreError(f"not a campaign id: {campaign_id!r}")
        return self.root / campaign_id

    # -- the description -----------------------------------------------------------------------

    def write_meta(self, meta: CampaignMeta) -> None:
        folder = self.folder(meta.campaign_id)
        folder.mkdir(parents=True, exist_ok=True)
        _write_atomic(folder / META_FILE, meta.model_dump_json(indent=2).encode())

    def read_meta(self, campaign_id: str) -> CampaignMeta | None:
        path = self.folder(campaign_id) / META_FILE
        try:
            return CampaignMeta.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None

    # -- conversations -------------------------------------------------------------------------

    def start_conversation(self, campaign_id: str, brief: TaskBrief) -> str:
        return self._put(campaign_id, _Link(brief=brief))

    def extend(self, campaign_id: str, head: str, messages: list[Message]) -> str:
        """The head of `head`'s conversation followed by `messages`."""
        if not messages:
            return head
        return self._put(campaign_id, _Link(parent=head, messages=messages))

    def conversation(self, campaign_id: str, head: str) -> Conversation:
        links: list[_Link] = []
        ref: str | None = head
        while ref is not None:
            link = self._get(campaign_id, ref)
            links.append(link)
            ref = link.parent
        first = links[-1]
        if first.brief is None:
            raise StoreError(f"conversation {head} has no brief")
        messages = [m for link in reversed(links) for m in link.messages]
        return Conversation(brief=first.brief, messages=messages)

    def _put(self, campaign_id: str, link: _Link) -> str:
        body = link.model_dump_json(exclude_none=True).encode()
        digest = hashlib.sha256(body).hexdigest()
        path = self._blob(campaign_id, digest)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(path, body)
        return digest

    def _get(self, campaign_id: str, digest: str) -> _Link:
        try:
            return _Link.model_validate_json(self._blob(campaign_id, digest).read_bytes())
        except (FileNotFoundError, ValidationError) as exc:
            raise StoreError(f"conversation link {digest} of {campaign_id}: {exc}") from None

    def _blob(self, campaign_id: str, digest: str) -> Path:
        if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            raise StoreError(f"not a content hash: {digest!r}")
        return self.folder(campaign_id) / CONVERSATIONS / digest[:2] / f"{digest}.json"

    # -- turns (an agent's reply is kept, so a retried turn never asks the agent again) -------

    def save_turn(
        self, campaign_id: str, attempt_key: str, number: int, stored: StoredTurn
    ) -> None:
        path = self._turn_path(campaign_id, attempt_key, number)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, stored.model_dump_json().encode())

    def load_turn(self, campaign_id: str, attempt_key: str, number: int) -> StoredTurn | None:
        path = self._turn_path(campaign_id, attempt_key, number)
        try:
            return StoredTurn.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None

    def _turn_path(self, campaign_id: str, attempt_key: str, number: int) -> Path:
        folder = hashlib.sha256(attempt_key.encode()).hexdigest()[:24]
        return self.folder(campaign_id) / TURNS / folder / f"{number}.json"

    # -- records -------------------------------------------------------------------------------

    def append_record(self, record: RolloutRecord) -> bool:
        """Append `record` unless its (rollout, attempt) is there already. True if written."""
        folder = self.folder(record.campaign_id)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / RECORDS_FILE
        with _locked(folder / (RECORDS_FILE + ".lock")):
            index = self._index(record.campaign_id, path)
            if record.key in index.keys:
                return False
            line = record_line(record).encode() + b"\n"
            with path.open("ab") as out:
                if out.tell() and not _ends_with_newline(path):
                    out.write(b"\n")  # a line cut short by a crash stays alone (and is skipped)
                out.write(line)
                out.flush()
                os.fsync(out.fileno())
                index.offset = out.tell()
            index.keys.add(record.key)
            return True

    def _index(self, campaign_id: str, path: Path) -> _RecordIndex:
        """The keys written so far, read from where this process last looked (other processes
        append too)."""
        index = self._indexes.setdefault(campaign_id, _RecordIndex())
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return index
        if size < index.offset:  # the file was replaced: read it again
            index.offset, index.keys = 0, set()
        if size > index.offset:
            with path.open("rb") as source:
                source.seek(index.offset)
                for line in source.read().splitlines():
                    try:
                        data = json.loads(line)
                        index.keys.add((str(data["rollout_id"]), int(data["attempt"])))
                    except (ValueError, KeyError, TypeError):
                        continue
            index.offset = size
        return index


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as source:
        source.seek(-1, os.SEEK_END)
        return source.read(1) == b"\n"


def _write_atomic(path: Path, body: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(body)
    os.replace(tmp, path)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
