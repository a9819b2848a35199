"""The budget ledger (DESIGN §5): pure, so plain pytest and hypothesis, no Temporal."""

from __future__ import annotations

import math
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from posttrain_env.errors import ErrorType, ToolError
from posttrain_env.models import FlavorPrice, ServiceSpend
from workflows.episode.ledger import (
    Ledger,
    Reservation,
    Settlement,
    StorageHold,
    storage_cost_micro_usd,
)

CPU = FlavorPrice(name="cpu-basic", micro_usd_per_minute=167)
T4 = FlavorPrice(name="t4-small", micro_usd_per_minute=6_667, accelerators=1, accelerator="T4")
L4X4 = FlavorPrice(name="l4x4", micro_usd_per_minute=63_333, accelerators=4, accelerator="L4")


def test_reservation_amount_is_price_times_timeout() -> None:
    ledger = Ledger(budget_micro_usd=1_000_000)
    reservation = ledger.reserve("job-a", "job", T4, 30)
    assert reservation == Reservation(
        key="job-a",
        kind="job",
        flavor="t4-small",
        micro_usd_per_minute=6_667,
        timeout_minutes=30,
        accelerators=1,
    )
    assert reservation.amount_micro_usd == 200_010
    assert ledger.reserved_micro_usd == 200_010
    assert ledger.committed_micro_usd == 200_010
    assert ledger.settled_micro_usd == 0


def test_budget_boundary_is_exact_to_the_micro_dollar() -> None:
    # 10 minutes at 1,000 micro-USD/min: a budget of exactly 10,000 fits, 9,999 does not.
    price = FlavorPrice(name="cpu-basic", micro_usd_per_minute=1_000)
    exact = Ledger(budget_micro_usd=10_000)
    exact.reserve("job-a", "job", price, 10)
    assert exact.committed_micro_usd == exact.budget_micro_usd == 10_000

    short = Ledger(budget_micro_usd=9_999)
    with pytest.raises(ToolError) as caught:
        short.reserve("job-a", "job", price, 10)
    assert caught.value.type is ErrorType.budget_exhausted
    assert short.reservations == {}
    assert short.reserved_micro_usd == 0


def test_budget_boundary_counts_settled_and_reserved() -> None:
    price = FlavorPrice(name="cpu-basic", micro_usd_per_minute=1_000)
    ledger = Ledger(budget_micro_usd=10_000)
    ledger.reserve("job-a", "job", price, 4)
    ledger.settle("job-a", 180.0)  # 3 minutes: 3,000 settled
    ledger.reserve("job-b", "job", price, 5)  # 5,000 reserved: 8,000 committed
    assert ledger.can_reserve(2_000)
    assert not ledger.can_reserve(2_001)
    ledger.reserve("job-c", "dev", price, 2)  # exactly 10,000
    assert ledger.committed_micro_usd == 10_000
    with pytest.raises(ToolError):
        ledger.reserve("job-d", "job", price, 1)


def test_refusal_reports_the_amounts_and_what_to_do() -> None:
    ledger = Ledger(budget_micro_usd=500_000)
    ledger.reserve("job-a", "job", CPU, 2_000)  # 334,000 reserved, 166,000 left
    with pytest.raises(ToolError) as caught:
        ledger.reserve("job-b", "job", CPU, 2_000)
    error = caught.value
    assert error.type is ErrorType.budget_exhausted
    assert error.details == {
        "budget_usd": 0.5,
        "settled_usd": 0.0,
        "reserved_usd": 0.334,
        "requested_usd": 0.334,
        "remaining_usd": 0.166,
    }
    # 166,000 // 167 = 994 minutes still fit on this flavor.
    assert "timeout_minutes <= 994" in error.message
    assert "$0.166" in error.message
    assert "cheaper flavor" in error.message
    assert error.envelope()["error"]["type"] == "budget_exhausted"


def test_refusal_when_not_one_minute_fits_suggests_a_cheaper_flavor() -> None:
    ledger = Ledger(budget_micro_usd=60_000)
    with pytest.raises(ToolError) as caught:
        ledger.reserve("job-a", "job", L4X4, 1)
    assert "Not even 1 minute of l4x4 fits" in caught.value.message
    assert "timeout_minutes <=" not in caught.value.message


def test_a_refused_reservation_changes_nothing() -> None:
    ledger = Ledger(budget_micro_usd=100_000)
    ledger.reserve("job-a", "job", T4, 10)
    before = ledger.model_copy(deep=True)
    with pytest.raises(ToolError):
        ledger.reserve("job-b", "job", T4, 10)
    assert ledger == before


def test_duplicate_key_and_non_positive_timeout_are_refused_as_value_errors() -> None:
    ledger = Ledger(budget_micro_usd=10_000_000)
    ledger.reserve("job-a", "job", T4, 10)
    with pytest.raises(ValueError, match="already reserved"):
        ledger.reserve("job-a", "job", T4, 10)
    with pytest.raises(ValueError, match="timeout_minutes"):
        ledger.reserve("job-b", "job", T4, 0)
    with pytest.raises(ValueError, match="timeout_minutes"):
        ledger.reserve("job-b", "job", T4, -5)
    assert list(ledger.reservations) == ["job-a"]
    assert ledger.reserved_micro_usd == 66_670


@pytest.mark.parametrize(
    ("running_s", "minutes"),
    [
        (0.0, 0),
        (5e-324, 1),  # the smallest positive float: a started minute, though 5e-324 / 60 == 0.0
        (0.001, 1),
        (59.9, 1),
        (60.0, 1),
        (math.nextafter(60.0, math.inf), 2),
        (61.0, 2),
        (120.0, 2),
        (3600.0, 60),
    ],
)
def test_running_time_is_billed_per_started_minute(running_s: float, minutes: int) -> None:
    ledger = Ledger(budget_micro_usd=10_000_000)
    ledger.reserve("job-a", "job", T4, 60)
    settlement = ledger.settle("job-a", running_s)
    assert settlement.billed_minutes == minutes
    assert settlement.cost_micro_usd == 6_667 * minutes


def test_61_seconds_settles_as_2_minutes() -> None:
    ledger = Ledger(budget_micro_usd=1_000_000)
    ledger.reserve("job-a", "job", T4, 10)
    settlement = ledger.settle("job-a", 61.0)
    assert settlement == Settlement(
        key="job-a",
        kind="job",
        running_s=61.0,
        billed_minutes=2,
        cost_micro_usd=13_334,
        reserved_micro_usd=66_670,
        overrun_micro_usd=0,
    )
    assert ledger.settled_micro_usd == 13_334


def test_a_job_whose_running_time_is_unknown_settles_at_its_whole_reservation() -> None:
    ledger = Ledger(budget_micro_usd=1_000_000)
    ledger.reserve("job-a", "job", T4, 10)
    settlement = ledger.settle_at_reservation("job-a")
    assert settlement.worst_case and settlement.billed_minutes == 10
    assert settlement.cost_micro_usd == settlement.reserved_micro_usd == 66_670
    assert ledger.settled_micro_usd == 66_670 and not ledger.reservations
    assert ledger.settled_gpu_s == 600.0  # T4's one accelerator for the whole timeout
    with pytest.raises(KeyError):
        ledger.settle_at_reservation("job-a")


def test_zero_seconds_settles_as_nothing() -> None:
    ledger = Ledger(budget_micro_usd=1_000_000)
    ledger.reserve("job-a", "job", T4, 10)
    settlement = ledger.settle("job-a", 0.0)
    assert settlement.billed_minutes == 0
    assert settlement.cost_micro_usd == 0
    assert ledger.settled_micro_usd == 0
    assert ledger.settled_jobs == 1


def test_settle_releases_the_reservation() -> None:
    ledger = Ledger(budget_micro_usd=1_000_000)
    ledger.reserve("job-a", "job", T4, 10)
    ledger.reserve("job-b", "job", T4, 20)
    assert ledger.reserved_micro_usd == 66_670 + 133_340
    ledger.settle("job-a", 300.0)
    assert list(ledger.reservations) == ["job-b"]
    assert ledger.reserved_micro_usd == 133_340
    assert ledger.settled_micro_usd == 5 * 6_667
    assert ledger.committed_micro_usd == 133_340 + 33_335
    # The released money can be reserved again: 1,000,000 - 166,675 = 833,325 left.
    assert ledger.can_reserve(833_325)
    assert not ledger.can_reserve(833_326)


def test_settling_twice_or_an_unknown_key_is_a_key_error() -> None:
    ledger = Ledger(budget_micro_usd=1_000_000)
    ledger.reserve("job-a", "job", T4, 10)
    ledger.settle("job-a", 60.0)
    with pytest.raises(KeyError):
        ledger.settle("job-a", 60.0)
    with pytest.raises(KeyError):
        ledger.settle("job-never", 60.0)
    assert ledger.settled_micro_usd == 6_667
    assert ledger.settled_jobs == 1


@pytest.mark.parametrize("running_s", [-0.001, -60.0, float("nan"), float("inf")])
def test_a_negative_or_non_finite_running_time_is_refused_and_keeps_the_reservation(
    running_s: float,
) -> None:
    ledger = Ledger(budget_micro_usd=1_000_000)
    ledger.reserve("job-a", "job", T4, 10)
    with pytest.raises(ValueError, match="running_s"):
        ledger.settle("job-a", running_s)
    assert list(ledger.reservations) == ["job-a"]
    assert ledger.settled_micro_usd == 0
    assert ledger.settled_jobs == 0


def test_overrun_is_settled_at_real_cost_and_reported() -> None:
    # Reserved 10 minutes; the provider stopped it after 12 min 30 s: 13 minutes are billed.
    ledger = Ledger(budget_micro_usd=100_000)
    ledger.reserve("job-a", "job", T4, 10)
    settlement = ledger.settle("job-a", 750.0)
    assert settlement.billed_minutes == 13
    assert settlement.cost_micro_usd == 86_671
    assert settlement.reserved_micro_usd == 66_670
    assert settlement.overrun_micro_usd == 20_001
    assert ledger.settled_micro_usd == 86_671
    assert ledger.reserved_micro_usd == 0


def test_overrun_past_the_budget_is_still_charged_and_blocks_new_reservations() -> None:
    ledger = Ledger(budget_micro_usd=66_670)
    ledger.reserve("job-a", "job", T4, 10)  # the whole budget
    ledger.settle("job-a", 660.0)  # 11 minutes
    assert ledger.settled_micro_usd == 73_337
    assert ledger.committed_micro_usd > ledger.budget_micro_usd
    assert ledger.remaining_micro_usd == 0
    free = FlavorPrice(name="free", micro_usd_per_minute=0)
    with pytest.raises(ToolError) as caught:
        ledger.reserve("job-b", "job", CPU, 1)
    assert caught.value.details["remaining_usd"] == 0.0
    # A zero-priced reservation adds nothing, so it is still refused: spend is already over.
    assert not ledger.can_reserve(0)
    with pytest.raises(ToolError):
        ledger.reserve("job-c", "job", free, 1)


def test_the_price_is_locked_at_reservation() -> None:
    ledger = Ledger(budget_micro_usd=10_000_000)
    ledger.reserve("job-a", "job", T4, 10)
    # A later price for the same flavor never reaches this job's settlement.
    ledger.reserve("job-b", "job", T4.model_copy(update={"micro_usd_per_minute": 9_999}), 10)
    assert ledger.settle("job-a", 120.0).cost_micro_usd == 2 * 6_667
    assert ledger.settle("job-b", 120.0).cost_micro_usd == 2 * 9_999


def test_jobs_and_calls_counters() -> None:
    ledger = Ledger(budget_micro_usd=10_000_000)
    ledger.reserve("job-a", "job", T4, 10)
    ledger.reserve("job-b", "job", CPU, 10)
    ledger.reserve("dev-a", "dev", CPU, 10)
    ledger.settle("job-a", 30.0)
    ledger.settle("dev-a", 30.0)
    assert (ledger.settled_jobs, ledger.settled_calls) == (1, 1)
    ledger.settle("job-b", 0.0)
    assert (ledger.settled_jobs, ledger.settled_calls) == (2, 1)
    spend = ledger.service_spend(final=True)
    assert (spend.settled.jobs, spend.settled.calls) == (2, 1)


def test_dev_evaluations_are_reserved_and_charged_like_jobs() -> None:
    ledger = Ledger(budget_micro_usd=10_000_000)
    ledger.reserve("dev-a", "dev", T4, 30)
    assert ledger.reserved_micro_usd == 200_010
    settlement = ledger.settle("dev-a", 601.0)
    assert settlement.kind == "dev"
    assert settlement.cost_micro_usd == 11 * 6_667
    assert ledger.settled_micro_usd == 73_337


def test_gpu_seconds_count_accelerators() -> None:
    ledger = Ledger(budget_micro_usd=10_000_000)
    ledger.reserve("cpu", "job", CPU, 10)
    ledger.reserve("t4", "job", T4, 10)
    ledger.reserve("l4x4", "dev", L4X4, 10)
    ledger.settle("cpu", 100.0)  # no accelerator: 0
    ledger.settle("t4", 90.5)  # 1 × 90.5
    ledger.settle("l4x4", 30.0)  # 4 × 30
    assert ledger.settled_gpu_s == pytest.approx(210.5)
    assert ledger.service_spend(final=True).settled.gpu_s == pytest.approx(210.5)


def test_settled_usd_is_micro_over_a_million() -> None:
    ledger = Ledger(budget_micro_usd=290_000)  # $0.29
    ledger.reserve("job-a", "job", T4, 10)
    ledger.reserve("job-b", "job", CPU, 60)
    ledger.settle("job-a", 61.0)  # 13,334
    spend = ledger.service_spend(final=False)
    assert spend == ServiceSpend.model_validate(
        {
            "version": 2,
            "settled": {"usd": 0.013334, "gpu_s": 61.0, "jobs": 1, "calls": 0},
            "reserved": {"usd": 0.01002},
            "final": False,
        }
    )
    assert spend.settled.usd == 13_334 / 1_000_000
    assert ledger.service_spend(final=True).final is True


def test_an_empty_ledger_reports_zero_spend() -> None:
    spend = Ledger(budget_micro_usd=500_000).service_spend(final=True)
    assert spend.model_dump() == {
        "version": 2,
        "settled": {"usd": 0.0, "gpu_s": 0.0, "jobs": 0, "calls": 0},
        "reserved": {"usd": 0.0},
        "storage": {"bytes": 0, "reserved_bytes": 0, "cap_bytes": None, "usd": 0.0},
        "final": True,
    }


def test_the_ledger_survives_a_json_round_trip() -> None:
    # Workflow state goes through Temporal's pydantic data converter (and continue-as-new).
    ledger = Ledger(budget_micro_usd=20_000_000)
    ledger.reserve("job-a", "job", T4, 30)
    ledger.reserve("dev-a", "dev", L4X4, 30)
    ledger.reserve("job-b", "job", CPU, 5)
    ledger.settle("job-b", 61.0)
    copy = Ledger.model_validate_json(ledger.model_dump_json())
    assert copy == ledger
    assert copy.reserved_micro_usd == ledger.reserved_micro_usd == 200_010 + 1_899_990
    assert copy.settle("dev-a", 60.0).cost_micro_usd == 63_333


# ---------------------------------------------------------------------------------------------
# Properties over random sequences of reservations and settlements
# ---------------------------------------------------------------------------------------------

prices = st.builds(
    FlavorPrice,
    name=st.sampled_from(["cpu-basic", "cpu-upgrade", "t4-small", "l4x1", "a100-large"]),
    micro_usd_per_minute=st.integers(min_value=0, max_value=200_000),
    accelerators=st.integers(min_value=0, max_value=8),
)
kinds = st.sampled_from(["job", "dev"])
timeouts = st.integers(min_value=1, max_value=24 * 60)


class WithinTimeoutLedger(RuleBasedStateMachine):
    """Every job runs at most its timeout: the ledger never goes over budget, nor negative.

    A shadow model recomputes every total independently, so each step checks real values.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger(budget_micro_usd=0)
        self.next_key = 0
        self.shadow_reserved: dict[str, int] = {}
        self.shadow_settled = 0
        self.shadow_gpu_s = 0.0
        self.shadow_jobs = 0
        self.shadow_calls = 0

    @initialize(budget=st.integers(min_value=0, max_value=50_000_000))
    def start(self, budget: int) -> None:
        self.ledger = Ledger(budget_micro_usd=budget)

    @rule(kind=kinds, price=prices, timeout=timeouts)
    def reserve(self, kind: Literal["job", "dev"], price: FlavorPrice, timeout: int) -> None:
        key = f"job-{self.next_key:012x}"
        self.next_key += 1
        amount = price.micro_usd_per_minute * timeout
        fits = self.shadow_settled + sum(self.shadow_reserved.values()) + amount
        fits_budget = fits <= self.ledger.budget_micro_usd
        assert self.ledger.can_reserve(amount) == fits_budget
        try:
            self.ledger.reserve(key, kind, price, timeout)
        except ToolError as error:
            assert not fits_budget
            assert error.type is ErrorType.budget_exhausted
            return
        assert fits_budget
        self.shadow_reserved[key] = amount

    def _settle_in_time(self, key: str, running_s: float) -> None:
        reservation = self.ledger.reservations[key]
        settlement = self.ledger.settle(key, running_s)
        assert settlement.reserved_micro_usd == self.shadow_reserved.pop(key)
        assert 0 <= settlement.billed_minutes <= reservation.timeout_minutes
        assert settlement.billed_minutes * 60 >= running_s
        assert settlement.cost_micro_usd == (
            reservation.micro_usd_per_minute * settlement.billed_minutes
        )
        assert settlement.overrun_micro_usd == 0
        self.shadow_settled += settlement.cost_micro_usd
        self.shadow_gpu_s += reservation.accelerators * running_s
        if reservation.kind == "job":
            self.shadow_jobs += 1
        else:
            self.shadow_calls += 1

    @precondition(lambda self: bool(self.shadow_reserved))
    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.shadow_reserved)))
        timeout_s = self.ledger.reservations[key].timeout_minutes * 60
        running_s = data.draw(st.floats(min_value=0, max_value=timeout_s, allow_nan=False))
        self._settle_in_time(key, running_s)

    @rule()
    def settle_everything_at_its_timeout(self) -> None:
        for key in sorted(self.shadow_reserved):
            self._settle_in_time(key, self.ledger.reservations[key].timeout_minutes * 60.0)
        assert self.ledger.reservations == {}
        assert self.ledger.reserved_micro_usd == 0
        assert self.ledger.committed_micro_usd == self.ledger.settled_micro_usd

    @invariant()
    def never_negative(self) -> None:
        assert self.ledger.settled_micro_usd >= 0
        assert self.ledger.reserved_micro_usd >= 0
        assert self.ledger.settled_gpu_s >= 0
        assert self.ledger.remaining_micro_usd >= 0
        spend = self.ledger.service_spend(final=False)
        assert spend.settled.usd >= 0
        assert spend.reserved.usd >= 0

    @invariant()
    def never_over_budget(self) -> None:
        assert self.ledger.committed_micro_usd <= self.ledger.budget_micro_usd

    @invariant()
    def totals_match_the_shadow(self) -> None:
        assert set(self.ledger.reservations) == set(self.shadow_reserved)
        assert self.ledger.reserved_micro_usd == sum(self.shadow_reserved.values())
        assert self.ledger.settled_micro_usd == self.shadow_settled
        assert self.ledger.settled_gpu_s == pytest.approx(self.shadow_gpu_s)
        assert self.ledger.settled_jobs == self.shadow_jobs
        assert self.ledger.settled_calls == self.shadow_calls


WithinTimeoutLedger.TestCase.settings = settings(max_examples=60, stateful_step_count=40)
test_within_timeouts_the_ledger_is_never_over_budget_nor_negative = WithinTimeoutLedger.TestCase


operations = st.lists(
    st.tuples(kinds, prices, timeouts, st.floats(min_value=0, max_value=48 * 3600)),
    max_size=40,
)


@settings(max_examples=150)
@given(budget=st.integers(min_value=0, max_value=50_000_000), ops=operations)
def test_reserved_returns_to_zero_once_everything_is_settled_even_with_overruns(
    budget: int, ops: list[tuple[Literal["job", "dev"], FlavorPrice, int, float]]
) -> None:
    ledger = Ledger(budget_micro_usd=budget)
    running: dict[str, float] = {}
    expected_settled = 0
    expected_overrun = 0
    for index, (kind, price, timeout, running_s) in enumerate(ops):
        key = f"job-{index:012x}"
        try:
            ledger.reserve(key, kind, price, timeout)
        except ToolError:
            assert ledger.committed_micro_usd + price.micro_usd_per_minute * timeout > budget
            continue
        running[key] = running_s
        # Settle every other one at once, so settlements interleave with reservations.
        if index % 2 == 0:
            settlement = ledger.settle(key, running.pop(key))
            expected_settled += settlement.cost_micro_usd
            expected_overrun += settlement.overrun_micro_usd
        assert ledger.reserved_micro_usd >= 0
        assert ledger.settled_micro_usd >= 0
    for key, running_s in running.items():
        settlement = ledger.settle(key, running_s)
        assert settlement.overrun_micro_usd == max(
            0, settlement.cost_micro_usd - settlement.reserved_micro_usd
        )
        expected_settled += settlement.cost_micro_usd
        expected_overrun += settlement.overrun_micro_usd
    assert ledger.reservations == {}
    assert ledger.reserved_micro_usd == 0
    assert ledger.service_spend(final=True).reserved.usd == 0.0
    assert ledger.settled_micro_usd == expected_settled
    # Spend can pass the budget only by overruns: never by more than their sum.
    assert ledger.settled_micro_usd <= budget + expected_overrun


def test_a_late_job_is_charged_its_real_cost_even_past_the_budget_without_a_reservation() -> None:
    ledger = Ledger(budget_micro_usd=10_000)
    ledger.reserve("job-a", "job", T4, 1)
    late = ledger.settle_late("job-b+late:x", "job", T4, 61.0)  # a create that landed late
    assert late.billed_minutes == 2 and late.cost_micro_usd == 2 * 6_667
    assert late.reserved_micro_usd == 0 and late.overrun_micro_usd == late.cost_micro_usd
    assert ledger.settled_micro_usd == 2 * 6_667 and ledger.settled_gpu_s == 61.0
    assert ledger.settled_jobs == 0  # the agent never had this job
    assert ledger.remaining_micro_usd == 0  # spent is spent: past the budget, never negative
    assert "job-a" in ledger.reservations  # the agent's own job is untouched
    with pytest.raises(ValueError):
        ledger.settle_late("job-c+late:y", "dev", CPU, -1.0)
    assert ledger.settled_micro_usd == 2 * 6_667  # nothing changed


def test_a_replayed_settlement_is_charged_as_any_and_counted_apart() -> None:
    ledger = Ledger(budget_micro_usd=10_000)
    assert "replayed" not in ledger.service_spend(final=True).model_dump()
    ledger.reserve("job-1", "job", CPU, 5)
    ledger.reserve("eval-1", "dev", CPU, 5)
    ledger.reserve("job-2", "job", CPU, 5)
    ledger.settle("job-1", 61, replayed=True)
    ledger.settle("eval-1", 30, replayed=True)
    ledger.settle("job-2", 120)
    spend = ledger.service_spend(final=True)
    assert spend.settled.usd == 5 * 167 / 1e6 and ledger.remaining_micro_usd == 10_000 - 5 * 167
    assert spend.replayed is not None
    assert spend.replayed.model_dump() == {"usd": 3 * 167 / 1e6, "jobs": 1, "calls": 1}
    assert ServiceSpend.model_validate(spend.model_dump()) == spend


# -- storage (issue 41: storage is part of the ledger) -------------------------------------------

GB = 10**9
# $25 per TB and month (the default price), 15 days: half a month.
HALF_MONTH = {"micro_usd_per_tb_month": 25_000_000, "billed_days": 15.0}


def test_storage_cost_is_bytes_times_price_times_days_rounded_up_to_a_micro_usd() -> None:
    assert storage_cost_micro_usd(10**12, 25_000_000, 30) == 25_000_000  # 1 TB, a month
    assert storage_cost_micro_usd(2 * GB, 25_000_000, 15) == 25_000  # 2 GB, half a month
    assert storage_cost_micro_usd(1, 25_000_000, 14) == 1  # anything kept costs at least 1
    assert storage_cost_micro_usd(0, 25_000_000, 14) == 0
    for bad in ((-1, 1, 1.0), (1, 1, -1.0), (1, 1, float("nan"))):
        with pytest.raises(ValueError):
            storage_cost_micro_usd(*bad)


def test_a_job_reserves_its_storage_and_settles_at_what_its_artifact_kept() -> None:
    ledger = Ledger(budget_micro_usd=1_000_000, storage_cap_bytes=10 * GB)
    hold = StorageHold(bytes=4 * GB, **HALF_MONTH)
    reservation = ledger.reserve("job-a", "job", CPU, 10, storage=hold)
    assert reservation.amount_micro_usd == 167 * 10 + 50_000
    assert ledger.storage_left_bytes == 6 * GB
    spend = ledger.service_spend(final=False)
    assert (spend.storage.reserved_bytes, spend.storage.cap_bytes) == (4 * GB, 10 * GB)
    assert spend.reserved.usd == (1_670 + 50_000) / 1e6
    settled = ledger.settle("job-a", 61.0, stored_bytes=GB)
    assert (settled.stored_bytes, settled.storage_micro_usd) == (GB, 12_500)
    assert settled.cost_micro_usd == 2 * 167 + 12_500
    spend = ledger.service_spend(final=True)
    assert spend.storage.bytes == GB and spend.storage.usd == 0.0125
    assert spend.settled.usd == (334 + 12_500) / 1e6  # storage is part of the settled spend
    assert ledger.storage_left_bytes == 9 * GB


def test_storage_counts_in_the_budget_rule_and_says_so_when_it_refuses() -> None:
    ledger = Ledger(budget_micro_usd=40_000, storage_cap_bytes=100 * GB)
    with pytest.raises(ToolError) as refused:
        ledger.reserve("job-a", "job", CPU, 10, storage=StorageHold(bytes=4 * GB, **HALF_MONTH))
    assert refused.value.type is ErrorType.budget_exhausted
    assert f"for the {4 * GB} bytes its artifact may keep" in refused.value.message
    assert ledger.reservations == {}


def test_a_lost_job_settles_its_storage_at_the_most_it_could_keep() -> None:
    ledger = Ledger(budget_micro_usd=1_000_000, storage_cap_bytes=10 * GB)
    ledger.reserve("job-a", "job", CPU, 10, storage=StorageHold(bytes=2 * GB, **HALF_MONTH))
    settled = ledger.settle_at_reservation("job-a")
    assert settled.worst_case and settled.stored_bytes == 2 * GB
    assert ledger.stored_bytes == 2 * GB and ledger.storage_micro_usd == 25_000


def test_a_ledger_without_a_storage_cap_counts_no_storage() -> None:
    ledger = Ledger(budget_micro_usd=1_000_000)
    ledger.reserve("job-a", "job", CPU, 10)
    assert ledger.storage_left_bytes is None
    settled = ledger.settle("job-a", 60.0, stored_bytes=5 * GB)
    assert (settled.stored_bytes, ledger.stored_bytes, ledger.storage_micro_usd) == (0, 0, 0)
    with pytest.raises(ValueError):
        ledger.reserve("job-b", "job", CPU, 10)
        ledger.settle("job-b", 60.0, stored_bytes=-1)
