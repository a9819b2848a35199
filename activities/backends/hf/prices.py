"""Job prices from `list_jobs_hardware`, cached with a TTL and refreshed on an unknown flavor.

`unit_cost_micro_usd` is per `unit_label` (a minute today); another unit is converted to a
per-minute price, rounded up so a reservation never falls short. The episode locks the prices it
got at its start; this cache only decides how often the Hub is asked.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable

from huggingface_hub import JobHardwareInfo

from activities.backends.interface import TransientBackendError
from posttrain_env.models import FlavorPrice

log = logging.getLogger(__name__)

UNIT_SECONDS = {"second": 1, "minute": 60, "hour": 3600}
DEFAULT_TTL_S = 3600.0


def flavor_price(hw: JobHardwareInfo) -> FlavorPrice | None:
    """The flavor's price per minute, or None for a unit we cannot convert."""
    unit_s = UNIT_SECONDS.get((hw.unit_label or "").lower())
    if unit_s is None:
        return None
    per_minute = math.ceil(hw.unit_cost_micro_usd * 60 / unit_s)
    accelerators = 0
    model = None
    if hw.accelerator is not None:
        model = hw.accelerator.model
        digits = "".join(c for c in str(hw.accelerator.quantity) if c.isdigit())
        accelerators = int(digits) if digits else 1
    return FlavorPrice(
        name=hw.name, micro_usd_per_minute=per_minute, accelerators=accelerators, accelerator=model
    )


class PriceCache:
    def __init__(
        self,
        fetch: Callable[[], Awaitable[list[JobHardwareInfo]]],
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._ttl_s = ttl_s
        self._clock = clock
        self._prices: dict[str, FlavorPrice] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()  # one refresh at a time; concurrent callers share it

    async def prices(self, needed: Iterable[str] = ()) -> dict[str, FlavorPrice]:
        """The current prices; refreshed when stale or when a `needed` flavor is missing."""
        needed = list(needed)
        if self._fresh() and all(name in self._prices for name in needed):
            return dict(self._prices)
        async with self._lock:
            # Another caller may have refreshed while this one waited for the lock.
            if not self._fresh() or any(name not in self._prices for name in needed):
                await self._refresh()
        return dict(self._prices)

    async def price(self, flavor: str) -> FlavorPrice | None:
        return (await self.prices([flavor])).get(flavor)

    def _fresh(self) -> bool:
        return self._fetched_at is not None and self._clock() - self._fetched_at < self._ttl_s

    async def _refresh(self) -> None:
        try:
            hardware = await self._fetch()
        except TransientBackendError:
            if not self._prices:
                raise
            log.warning("could not refresh job prices; using the %d cached", len(self._prices))
            return
        prices = {}
        for hw in hardware:
            price = flavor_price(hw)
            if price is None:
                log.warning("flavor %s is priced per %r; left out", hw.name, hw.unit_label)
                continue
            prices[price.name] = price
        self._prices = prices
        self._fetched_at = self._clock()
