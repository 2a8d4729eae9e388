"""The process-local limits store (``limits_store.backend: memory``).

Theory of operation
-------------------

State lives in dicts of this one process: per tenant a requests bucket, a
tokens bucket (``(level, time of that level)``), the current UTC day's
counter (``(day, used)``) and the held concurrency slots (``slot id ->
lease expiry``). Limits are per process: N replicas with this store admit N
times a tenant's limits (use the Redis store for shared limits).

Atomicity comes from the event loop: :meth:`MemoryLimitsStore.reserve` does
not await between reading and writing, so one decision is never interleaved
with another. Buckets and slot leases run on ``clock`` (monotonic by
default: a wall-clock step neither refills nor drains a bucket); the UTC day
comes from ``wall`` (Unix time). Both are injectable for tests.

:meth:`~MemoryLimitsStore.settle` applies at once (there is no I/O to wait
for): it refunds or charges the minute's bucket (never past its limit),
adjusts the counter of the hold's day if that day is still the current one
(never below 0), and frees the slot. A slot that is never settled is freed
when its lease (``lease_s``) ends, as in the shared store.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.ratelimit.base import Hold, NullMetrics, StoreMetrics
from gateway.ratelimit.core import (
    REFUSED_DAY,
    REFUSED_REQUESTS,
    REFUSED_SLOTS,
    REFUSED_TOKENS,
    TenantLimits,
    Verdict,
    charges,
    judge,
    refill,
    seconds_until_midnight,
    utc_day,
)

__all__ = ["MemoryLimitsStore"]


class MemoryLimitsStore:
    """Limits of one process, one event loop; see the module docstring."""

    def __init__(
        self,
        *,
        lease_s: float = 610.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        metrics: StoreMetrics | None = None,
    ) -> None:
        if lease_s <= 0:
            raise ValueError("lease_s must be positive")
        self._lease_s = lease_s
        self._clock = clock
        self._wall = wall
        self._metrics: StoreMetrics = metrics or NullMetrics()
        # (tenant, kind) -> (level, time of that level)
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}
        # tenant -> (UTC day, tokens charged that day)
        self._days: dict[str, tuple[int, int]] = {}
        # tenant -> slot id -> lease expiry (clock)
        self._slots: dict[str, dict[str, float]] = {}
        self._serial = 0

    @property
    def healthy(self) -> bool:
        return True

    @property
    def ready(self) -> bool:
        return True

    @property
    def pending_settlements(self) -> int:
        return 0  # settlements apply at once

    async def start(self) -> None:
        pass

    async def flush(self, timeout_s: float) -> bool:
        return True

    async def aclose(self, timeout_s: float = 5.0) -> int:
        return 0

    def _level(self, tenant: str, kind: str, limit: int, now: float) -> float:
        found = self._buckets.get((tenant, kind))
        if found is None:
            return float(limit)
        return refill(found[0], found[1], limit, now)

    def _day_used(self, tenant: str, day: int) -> int:
        found = self._days.get(tenant)
        return found[1] if found is not None and found[0] == day else 0

    def _active_slots(self, tenant: str, now: float) -> dict[str, float]:
        slots = self._slots.setdefault(tenant, {})
        for slot, expiry in list(slots.items()):
            if expiry <= now:
                del slots[slot]
        return slots

    async def reserve(
        self,
        tenant: str,
        limits: TenantLimits,
        tokens: int,
        *,
        concurrent: bool = True,
        wait_s: float = 0.0,
    ) -> Hold:
        return self.reserve_now(tenant, limits, tokens, concurrent=concurrent, wait_s=wait_s)

    def reserve_now(
        self,
        tenant: str,
        limits: TenantLimits,
        tokens: int,
        *,
        concurrent: bool = True,
        wait_s: float = 0.0,
    ) -> Hold:
        started = time.perf_counter()
        try:
            return self._reserve(tenant, limits, tokens, concurrent, wait_s)
        finally:
            self._metrics.limits_store_call("reserve", time.perf_counter() - started)

    def _reserve(
        self, tenant: str, limits: TenantLimits, tokens: int, concurrent: bool, wait_s: float
    ) -> Hold:
        want = charges(limits, tokens, concurrent=concurrent)
        if limits.unlimited:
            return Hold(tenant, limits)
        now, unix = self._clock(), self._wall()
        day = utc_day(unix)
        rpm, tpm, tpd = limits.requests_per_minute, limits.tokens_per_minute, limits.tokens_per_day
        refused = 0
        requests = tokens_level = None
        if rpm is not None:
            requests = self._level(tenant, "requests", rpm, now)
            if requests < 1:
                refused |= REFUSED_REQUESTS
        if tpm is not None:
            tokens_level = self._level(tenant, "tokens", tpm, now)
            if want.minute_tokens and tokens_level < want.minute_tokens:
                refused |= REFUSED_TOKENS
        used = self._day_used(tenant, day)
        if tpd is not None and want.day_tokens and used + want.day_tokens > tpd:
            refused |= REFUSED_DAY
        slots: dict[str, float] | None = None
        if want.slot:
            assert limits.max_concurrent_requests is not None
            slots = self._active_slots(tenant, now)
            if len(slots) >= limits.max_concurrent_requests:
                refused |= REFUSED_SLOTS
        if not refused:
            if requests is not None:
                requests -= 1
                self._buckets[(tenant, "requests")] = (requests, now)
            if tokens_level is not None:
                tokens_level -= want.minute_tokens
                self._buckets[(tenant, "tokens")] = (tokens_level, now)
            if tpd is not None:
                self._days[tenant] = (day, used + want.day_tokens)
        verdict = Verdict(refused, requests, tokens_level, seconds_until_midnight(unix))
        headers = judge(limits, want, verdict)  # raises on refusal
        self._serial += 1
        hold_id = f"m{self._serial}"
        slot = None
        if slots is not None:
            slot = hold_id
            slots[slot] = now + self._lease_s + wait_s
        return Hold(
            tenant,
            limits,
            minute_tokens=want.minute_tokens,
            day_tokens=want.day_tokens,
            day=day if tpd is not None else None,
            slot=slot,
            id=hold_id,
            _headers=headers,
        )

    def settle(self, hold: Hold, used_tokens: int) -> None:
        if not hold.claim_settlement(used_tokens) or not hold.checked:
            return
        now = self._clock()
        tenant, limits = hold.tenant, hold.limits
        tpm = limits.tokens_per_minute
        if tpm is not None and hold.minute_tokens != used_tokens:
            level = self._level(tenant, "tokens", tpm, now)
            level = min(float(tpm), level + hold.minute_tokens - used_tokens)
            self._buckets[(tenant, "tokens")] = (level, now)
        if hold.day is not None and hold.day_tokens != used_tokens:
            found = self._days.get(tenant)
            if found is not None and found[0] == hold.day:
                self._days[tenant] = (hold.day, max(0, found[1] - hold.day_tokens + used_tokens))
        if hold.slot is not None:
            self._slots.get(tenant, {}).pop(hold.slot, None)

    # -- for tests and diagnostics -------------------------------------------------

    def active_slots(self, tenant: str) -> int:
        return len(self._active_slots(tenant, self._clock()))

    def day_used(self, tenant: str) -> int:
        return self._day_used(tenant, utc_day(self._wall()))
