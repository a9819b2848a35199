"""Jobs the Hub answers 404 for: when such a job counts as vanished; and in which order jobs
that left the live list are looked at (`LookOrder`).

A 404 on a job's own URL does not prove the job is gone for good (a job can be briefly unknown
right after its creation, and a wrong namespace answers 404 too), while settling a job that
still runs would leave it billing outside the ledger. So a job counts as vanished only after
`after_looks` consecutive 404s spread over at least `after_s` seconds; any answer in between
starts the count again. A vanished job is settled at its worst case (`stages.vanished_job`).

The counts live in the worker's memory: a restarted worker starts them again, which only delays
the verdict, never hastens it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from posttrain_env.limits import VANISHED_AFTER_LOOKS, VANISHED_AFTER_S

# Jobs remembered at most; the oldest are forgotten first (their count simply starts again).
MAX_REMEMBERED = 10_000


@dataclass
class Missing:
    first_404_at: datetime
    looks: int = 1

    def seconds(self, now: datetime) -> float:
        return max(0.0, (now - self.first_404_at).total_seconds())


class MissingJobs:
    def __init__(
        self, after_looks: int = VANISHED_AFTER_LOOKS, after_s: float = VANISHED_AFTER_S
    ) -> None:
        self._after_looks = max(1, after_looks)
        self._after_s = after_s
        self._missing: dict[str, Missing] = {}

    def answered_404(self, job_id: str, now: datetime) -> Missing | None:
        """Count one more 404 for `job_id`; the record when the job now counts as vanished."""
        missing = self._missing.get(job_id)
        if missing is None:
            while len(self._missing) >= MAX_REMEMBERED:
                self._missing.pop(next(iter(self._missing)))
            missing = self._missing[job_id] = Missing(first_404_at=now)
        else:
            missing.looks += 1
        if missing.looks >= self._after_looks and missing.seconds(now) >= self._after_s:
            del self._missing[job_id]
            return missing
        return None

    def answered(self, job_id: str) -> None:
        """The Hub knows the job (again): its count starts over."""
        self._missing.pop(job_id, None)


class LookOrder:
    """The order in which jobs that left the live list are looked at, one request each: those
    looked at longest ago (or never) first. Observe stops looking when its time runs out, so
    a fixed order would leave the same jobs out of every answer."""

    def __init__(self) -> None:
        self._looked: OrderedDict[str, None] = OrderedDict()  # least recently looked first

    def order(self, refs: Iterable[str]) -> list[str]:
        refs = list(refs)
        rank = {ref: n for n, ref in enumerate(self._looked)}
        return sorted(refs, key=lambda ref: rank.get(ref, -1))

    def looked(self, ref: str) -> None:
        self._looked.pop(ref, None)
        self._looked[ref] = None
        while len(self._looked) > MAX_REMEMBERED:
            self._looked.popitem(last=False)
