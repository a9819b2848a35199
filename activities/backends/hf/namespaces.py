"""The Hugging Face namespaces this deployment has jobs in, so that the orphan reaper looks in
every one of them and not only in the current one.

Every job's ref names the namespace it was started in, and every later call on it goes there
(`activities/backends/hf/labels.py`). But the reaper lists jobs, and a listing needs a namespace:
after
`POSTTRAIN_NAMESPACE` (or the token's user) changed, the jobs of the old namespace, among them
a lost create that landed after its retry had started another job, were never listed again.
So the backend notes each namespace it starts (or watches) a job in, with when, in a small file
of its state dir (`hf_namespaces.json`; written when a namespace is new or its note is an hour
old, so not on every submit); the reaper lists the current namespace and those noted in the
last RECENT_FOR (longer than any job here runs: a job older than its timeout has been stopped
by the Hub), at most MAX_LISTED, most recent first.

Without a file (tests, or a backend built without a state dir) the notes live in memory only.
Deployments whose workers have state dirs of their own note in each; the reaper then sees the
namespaces of the worker it runs on.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

log = logging.getLogger(__name__)

RECENT_FOR = timedelta(days=7)
MAX_LISTED = 8  # namespaces besides the current one, per reaper look
_RENOTE_AFTER = timedelta(hours=1)


class NamespaceNotes:
    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._noted: dict[str, datetime] = self._read()

    def needs_note(self, namespace: str, now: datetime) -> bool:
        """True when `note(namespace, now)` would change what is kept (cheap: memory only)."""
        last = self._noted.get(namespace)
        return last is None or now - last >= _RENOTE_AFTER

    def note(self, namespace: str, now: datetime) -> None:
        """Remember that this deployment has a job in `namespace` as of `now` (blocking: run it
        in a thread). A file that cannot be written is logged; the note stays in memory."""
        if not self.needs_note(namespace, now):
            return
        self._noted[namespace] = now
        if self._path is None:
            return
        try:
            self._write(namespace, now)
        except OSError as err:
            log.warning("could not note namespace %s in %s: %s", namespace, self._path, err)

    def recent(self, now: datetime) -> list[str]:
        """Namespaces noted within RECENT_FOR of `now`, most recent first, at most MAX_LISTED
        (blocking: reads the file again, which other processes of the deployment may write)."""
        for namespace, at in self._read().items():
            if namespace not in self._noted or at > self._noted[namespace]:
                self._noted[namespace] = at
        kept = sorted(
            (at, namespace) for namespace, at in self._noted.items() if now - at <= RECENT_FOR
        )
        listed = [namespace for _, namespace in reversed(kept)]
        if len(listed) > MAX_LISTED:
            log.warning(
                "jobs were started in %d namespaces in the last %s; the reaper lists the %d "
                "most recent: %s",
                len(listed),
                RECENT_FOR,
                MAX_LISTED,
                ", ".join(listed[:MAX_LISTED]),
            )
        return listed[:MAX_LISTED]

    # -- the file ----------------------------------------------------------------------------

    def _read(self) -> dict[str, datetime]:
        if self._path is None:
            return {}
        try:
            raw = json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            log.warning("ignoring unreadable namespace notes %s: %s", self._path, err)
            return {}
        notes: dict[str, datetime] = {}
        for namespace, at in raw.items() if isinstance(raw, dict) else ():
            try:
                moment = datetime.fromisoformat(str(at))
            except ValueError:
                continue
            notes[str(namespace)] = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        return notes

    def _write(self, namespace: str, now: datetime) -> None:
        """Merge this note into the file under a lock (other workers may share the dir)."""
        assert self._path is not None
        self._path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            notes = self._read()
            notes[namespace] = max(now, notes.get(namespace, now))
            tmp = self._path.with_suffix(".tmp")
            tmp.write_text(
                json.dumps({ns: at.isoformat() for ns, at in sorted(notes.items())}, indent=1),
                encoding="utf-8",
            )
            os.replace(tmp, self._path)
