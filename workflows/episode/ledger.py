"""An episode's budget ledger, in integer micro-USD (DESIGN §5).

Pure: pydantic, the standard library and the contract models only — no I/O, clock or randomness —
because it lives in EpisodeWorkflow state and is replayed. Agent jobs and dev evaluations are
reserved at `price × timeout_minutes` (price locked at reservation) and settled at
`price × ceil(running_s / 60)`, the real cost even above the reservation, where `running_s` is
the backend's own billed running time (on Hugging Face, the Hub's `durations.running_secs`:
`activities/backends/hf/stages.py`); a job the backend lost is settled at its whole reservation.
Grader
evaluations are free and never enter the ledger.

Storage (DESIGN §12) follows the same rule: an agent job's reservation also holds what its
artifact may keep (`StorageHold`: the episode's storage left, at most the job's artifact cap)
and that much storage's cost at the price locked for the episode; when the job ends it is
settled at the bytes its artifact really keeps. An artifact's storage is charged once, as
`bytes × price per TB-month × billed days / 30`, rounded up to a whole micro-USD.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Literal

from pydantic import BaseModel, Field

from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.models import (
    FlavorPrice,
    ReplayedSpend,
    ReservedSpend,
    ServiceSpend,
    SettledSpend,
    StorageSpend,
    usd,
)

LedgerKind = Literal["job", "dev"]


def billed_minutes(running_s: float) -> int:
    """Minutes billed for `running_s` seconds: every started minute counts; 0 s bills 0 minutes.

    Raises ValueError for a negative or non-finite time.
    """
    if not math.isfinite(running_s) or running_s < 0:
        raise ValueError(f"running_s must be a finite number >= 0, got {running_s!r}")
    # Exact rational arithmetic: `running_s / 60` in floats can round a started minute away
    # (5e-324 / 60 underflows to 0.0; 60k + ε can round down to k).
    return math.ceil(Fraction(running_s) / 60)


TB = 10**12


def storage_cost_micro_usd(stored_bytes: int, micro_usd_per_tb_month: int, days: float) -> int:
    """What keeping `stored_bytes` for `days` costs at a price per TB and 30-day month, rounded
    up to a whole micro-USD (exact rational arithmetic, as for minutes). Raises ValueError for
    a negative size or a negative or non-finite number of days."""
    if stored_bytes < 0 or not math.isfinite(days) or days < 0:
        raise ValueError(f"cannot price {stored_bytes} bytes for {days!r} days")
    return math.ceil(Fraction(stored_bytes) * micro_usd_per_tb_month * Fraction(days) / (30 * TB))


class StorageHold(BaseModel):
    """What an agent job's artifact may keep, and the price it is charged at (locked)."""

    bytes: int = Field(ge=0)
    micro_usd_per_tb_month: int = Field(ge=0)
    billed_days: float = Field(ge=0)

    def cost_micro_usd(self, stored_bytes: int) -> int:
        return storage_cost_micro_usd(stored_bytes, self.micro_usd_per_tb_month, self.billed_days)


class Reservation(BaseModel):
    """Money held for one live agent job or dev evaluation (and, for an agent job, the storage
    its artifact may keep)."""

    key: str  # our job_id or dev-evaluation id
    kind: LedgerKind
    flavor: str
    micro_usd_per_minute: int  # locked at reservation: later price changes never reach this job
    timeout_minutes: int
    accelerators: int = 0
    storage: StorageHold | None = None  # None: no storage counted (reserved before it was)

    @property
    def compute_micro_usd(self) -> int:
        return self.micro_usd_per_minute * self.timeout_minutes

    @property
    def storage_bytes(self) -> int:
        return self.storage.bytes if self.storage else 0

    @property
    def storage_micro_usd(self) -> int:
        return self.storage.cost_micro_usd(self.storage.bytes) if self.storage else 0

    @property
    def amount_micro_usd(self) -> int:
        return self.compute_micro_usd + self.storage_micro_usd


class Settlement(BaseModel):
    """What one reservation cost when it was settled."""

    key: str
    kind: LedgerKind
    running_s: float
    billed_minutes: int
    cost_micro_usd: int  # the real cost, even above the reservation
    reserved_micro_usd: int
    overrun_micro_usd: int  # max(0, cost - reserved): provider stop lag past the timeout
    # Settled at the whole reservation because the real running time cannot be known (the
    # backend lost the job): see `Ledger.settle_at_reservation`.
    worst_case: bool = False
    # An agent job's artifact: the bytes it keeps and their storage cost (part of the cost).
    # Left out of the encoding at 0 (most settlements: evaluations, calls): the carry of an
    # episode at its limits holds 256 of them (tests/test_limits.py).
    stored_bytes: int = Field(default=0, exclude_if=lambda v: v == 0)
    storage_micro_usd: int = Field(default=0, exclude_if=lambda v: v == 0)


class Ledger(BaseModel):
    """Settled and reserved spend against one episode's budget."""

    budget_micro_usd: int
    reservations: dict[str, Reservation] = Field(default_factory=dict)
    settled_micro_usd: int = 0
    settled_gpu_s: float = 0.0  # accelerator-seconds: accelerators × running_s, summed
    settled_jobs: int = 0  # settled agent jobs (kind "job")
    settled_calls: int = 0  # settled dev evaluations (kind "dev")
    # The part of the settled spend whose jobs were replayed from recordings (the replay
    # backend): charged as the recorded runs were billed, and said so in `service_spend`.
    replayed_micro_usd: int = 0
    replayed_jobs: int = 0
    replayed_calls: int = 0
    # Storage: the episode's cap (None: not counted, an episode started before it was), the
    # bytes its ended jobs' artifacts keep, and their charge (part of `settled_micro_usd`).
    storage_cap_bytes: int | None = None
    stored_bytes: int = 0
    storage_micro_usd: int = 0

    @property
    def reserved_storage_bytes(self) -> int:
        return sum(r.storage_bytes for r in self.reservations.values())

    @property
    def storage_left_bytes(self) -> int | None:
        """What a new job's artifact may still keep: the cap less what is kept and held (None:
        no cap)."""
        if self.storage_cap_bytes is None:
            return None
        return max(0, self.storage_cap_bytes - self.stored_bytes - self.reserved_storage_bytes)

    @property
    def reserved_micro_usd(self) -> int:
        return sum(r.amount_micro_usd for r in self.reservations.values())

    @property
    def committed_micro_usd(self) -> int:
        return self.settled_micro_usd + self.reserved_micro_usd

    @property
    def remaining_micro_usd(self) -> int:
        """What can still be reserved; 0 (never negative) once overruns pushed spend past budget."""
        return max(0, self.budget_micro_usd - self.committed_micro_usd)

    def can_reserve(self, amount_micro_usd: int) -> bool:
        """True when `amount_micro_usd` more fits: settled + reserved + amount <= budget."""
        return self.committed_micro_usd + amount_micro_usd <= self.budget_micro_usd

    def reserve(
        self,
        key: str,
        kind: LedgerKind,
        price: FlavorPrice,
        timeout_minutes: int,
        storage: StorageHold | None = None,
    ) -> Reservation:
        """Hold `price × timeout_minutes` for `key` at `price`, locked from now on, and with
        `storage` (an agent job) the bytes its artifact may keep and their cost.

        Raises ToolError(budget_exhausted) when it does not fit (reaching the budget exactly is
        allowed), ValueError on a key already reserved or `timeout_minutes <= 0`. Nothing changes
        when it raises.
        """
        if key in self.reservations:
            raise ValueError(f"{key!r} is already reserved")
        if timeout_minutes <= 0:
            raise ValueError(f"timeout_minutes must be > 0, got {timeout_minutes}")
        reservation = Reservation(
            key=key,
            kind=kind,
            flavor=price.name,
            micro_usd_per_minute=price.micro_usd_per_minute,
            timeout_minutes=timeout_minutes,
            accelerators=price.accelerators,
            storage=storage,
        )
        amount = reservation.amount_micro_usd
        if not self.can_reserve(amount):
            raise ToolError(
                ErrorType.budget_exhausted,
                self._refusal_message(reservation),
                budget_usd=usd(self.budget_micro_usd),
                settled_usd=usd(self.settled_micro_usd),
                reserved_usd=usd(self.reserved_micro_usd),
                requested_usd=usd(amount),
                remaining_usd=usd(self.remaining_micro_usd),
            )
        self.reservations[key] = reservation
        return reservation

    def settle(
        self,
        key: str,
        running_s: float,
        *,
        replayed: bool = False,
        stored_bytes: int | None = None,
    ) -> Settlement:
        """Release `key`'s reservation and charge its real cost at the locked price
        (`replayed`: the job's outcome, running time included, was replayed from a recording),
        with the storage of `stored_bytes` for a job that held storage (None: what it held, the
        worst case, as for a backend that did not say).

        Raises KeyError for a key not reserved (never reserved, or already settled) and ValueError
        for a negative or non-finite `running_s` or a negative size; nothing changes when it
        raises.
        """
        minutes = billed_minutes(running_s)
        if key not in self.reservations:
            raise KeyError(key)
        if stored_bytes is not None and stored_bytes < 0:
            raise ValueError(f"stored_bytes must be >= 0, got {stored_bytes}")
        reservation = self.reservations.pop(key)
        kept, storage_cost = 0, 0
        if reservation.storage is not None:
            kept = reservation.storage.bytes if stored_bytes is None else stored_bytes
            storage_cost = reservation.storage.cost_micro_usd(kept)
        cost = reservation.micro_usd_per_minute * minutes + storage_cost
        reserved = reservation.amount_micro_usd
        self.stored_bytes += kept
        self.storage_micro_usd += storage_cost
        self.settled_micro_usd += cost
        self.settled_gpu_s += reservation.accelerators * running_s
        if reservation.kind == "job":
            self.settled_jobs += 1
        else:
            self.settled_calls += 1
        if replayed:
            self.replayed_micro_usd += cost
            self.replayed_jobs += reservation.kind == "job"
            self.replayed_calls += reservation.kind != "job"
        return Settlement(
            key=key,
            kind=reservation.kind,
            running_s=running_s,
            billed_minutes=minutes,
            cost_micro_usd=cost,
            reserved_micro_usd=reserved,
            overrun_micro_usd=max(0, cost - reserved),
            stored_bytes=kept,
            storage_micro_usd=storage_cost,
        )

    def settle_late(
        self, key: str, kind: LedgerKind, price: FlavorPrice, running_s: float
    ) -> Settlement:
        """Charge a job that ran without a reservation: a create that landed after its submit
        gave up (or beside the job its retry adopted), found and cancelled by the reaper. Its
        real cost at `price` joins the settled spend, even past the budget (it was spent); the
        agent's job counts do not change (it never had this job). Raises ValueError for a
        negative or non-finite `running_s`."""
        minutes = billed_minutes(running_s)
        cost = price.micro_usd_per_minute * minutes
        self.settled_micro_usd += cost
        self.settled_gpu_s += price.accelerators * running_s
        return Settlement(
            key=key,
            kind=kind,
            running_s=running_s,
            billed_minutes=minutes,
            cost_micro_usd=cost,
            reserved_micro_usd=0,
            overrun_micro_usd=cost,
        )

    def settle_at_reservation(self, key: str) -> Settlement:
        """Settle `key` at its worst case, as if it ran its whole timeout: the cost is the
        reservation. For a job whose backend lost it (it may have run, and may still run, up to
        its timeout), which must never settle at 0; its artifact at the most it could keep.
        Raises KeyError for a key not reserved."""
        reservation = self.reservations[key]
        settlement = self.settle(key, reservation.timeout_minutes * 60, stored_bytes=None)
        return settlement.model_copy(update={"worst_case": True})

    def release(self, key: str) -> Reservation:
        """Drop `key`'s reservation without any charge: the job never started (its start failed,
        or a server-wide cap refused it). Raises KeyError for a key not reserved."""
        return self.reservations.pop(key)

    def service_spend(self, *, final: bool) -> ServiceSpend:
        """The observation's `service_spend` (DESIGN §4); `final` is the caller's to know."""
        return ServiceSpend(
            settled=SettledSpend(
                usd=usd(self.settled_micro_usd),
                gpu_s=self.settled_gpu_s,
                jobs=self.settled_jobs,
                calls=self.settled_calls,
            ),
            reserved=ReservedSpend(usd=usd(self.reserved_micro_usd)),
            storage=StorageSpend(
                bytes=self.stored_bytes,
                reserved_bytes=self.reserved_storage_bytes,
                cap_bytes=self.storage_cap_bytes,
                usd=usd(self.storage_micro_usd),
            ),
            final=final,
            replayed=ReplayedSpend(
                usd=usd(self.replayed_micro_usd), jobs=self.replayed_jobs, calls=self.replayed_calls
            )
            if self.replayed_jobs or self.replayed_calls
            else None,
        )

    def _refusal_message(self, reservation: Reservation) -> str:
        remaining = self.remaining_micro_usd
        price = reservation.micro_usd_per_minute
        what = "this job" if reservation.kind == "job" else "a dev evaluation"
        storage = ""
        if reservation.storage_micro_usd:
            storage = (
                f" and {_dollars(reservation.storage_micro_usd)} for the "
                f"{reservation.storage_bytes} bytes its artifact may keep"
            )
        message = (
            f"budget exhausted: {what} needs {_dollars(reservation.amount_micro_usd)} reserved "
            f"({reservation.timeout_minutes} min of {reservation.flavor} at "
            f"{_dollars(price)}/min{storage}) but only {_dollars(remaining)} of the "
            f"{_dollars(self.budget_micro_usd)} budget remains "
            f"({_dollars(self.settled_micro_usd)} settled, "
            f"{_dollars(self.reserved_micro_usd)} reserved by live jobs)."
        )
        release = "wait for a live job to end (or cancel one) to release its reservation."
        compute_room = remaining - reservation.storage_micro_usd
        affordable = max(0, compute_room) // price if price > 0 else 0
        if reservation.kind == "dev":
            return f"{message} To evaluate, {release}"
        if affordable > 0:
            return (
                f"{message} Use timeout_minutes <= {affordable} on {reservation.flavor}, "
                f"a cheaper flavor, or {release}"
            )
        cheaper = f"Not even 1 minute of {reservation.flavor} fits: use a cheaper flavor"
        return f"{message} {cheaper}, or {release}"


def _dollars(micro_usd: int) -> str:
    """$0.29, $20.00, $0.000167: cents always, sub-cent digits only when there are some."""
    text = f"{usd(micro_usd):.6f}".rstrip("0")
    whole, _, frac = text.partition(".")
    return f"${whole}.{frac.ljust(2, '0')}"
