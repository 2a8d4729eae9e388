"""The memory store on fake clocks (spec §7, §12 "Rate limits", §15).

The tests of the old ``RateLimiter`` live on here against the store seam,
each with its original intent; the daily budget and concurrency slots
follow. What both stores must agree on is in ``test_stores.py``.
"""

from __future__ import annotations

import pytest

from gateway.core.errors import GatewayError
from gateway.ratelimit import Hold, MemoryLimitsStore, TenantLimits
from gateway.ratelimit.core import SECONDS_PER_DAY

NOON = 20_000 * SECONDS_PER_DAY + 43_200.0  # a UTC noon


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(500.0)


@pytest.fixture
def wall() -> FakeClock:
    return FakeClock(NOON)


@pytest.fixture
def limiter(clock: FakeClock, wall: FakeClock) -> MemoryLimitsStore:
    return MemoryLimitsStore(clock=clock, wall=wall, lease_s=30)


def lim(rpm: int | None = None, tpm: int | None = None, **more: int | None) -> TenantLimits:
    return TenantLimits(rpm, tpm, more.get("tpd"), more.get("conc"))


async def take(
    store: MemoryLimitsStore,
    rpm: int | None,
    tpm: int | None,
    tokens: int,
    tenant: str = "acme",
    **more: int | None,
) -> Hold:
    return await store.reserve(tenant, lim(rpm, tpm, **more), tokens)


async def refused(
    store: MemoryLimitsStore,
    rpm: int | None,
    tpm: int | None,
    tokens: int,
    tenant: str = "acme",
    code: str = "rate_limited",
    **more: int | None,
) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        await take(store, rpm, tpm, tokens, tenant, **more)
    assert info.value.code == code
    assert info.value.status == 429
    return info.value


async def test_buckets_start_full(limiter: MemoryLimitsStore) -> None:
    for _ in range(3):
        await take(limiter, 3, None, 0)
    await refused(limiter, 3, None, 0)
    # another tenant has its own buckets
    await take(limiter, 3, None, 0, tenant="other")


async def test_refill_is_continuous(limiter: MemoryLimitsStore, clock: FakeClock) -> None:
    await take(limiter, None, 600, 600)
    await refused(limiter, None, 600, 1)
    clock.now += 0.1  # 600/min is 10 a second: one token
    await take(limiter, None, 600, 1)
    clock.now += 0.5
    await take(limiter, None, 600, 5)
    await refused(limiter, None, 600, 1)
    clock.now += 3600  # refills only up to the limit
    await take(limiter, None, 600, 600)
    await refused(limiter, None, 600, 1)


async def test_retry_after_rounds_up_whole_seconds(
    limiter: MemoryLimitsStore, clock: FakeClock
) -> None:
    for _ in range(60):
        await take(limiter, 60, None, 0)
    # one a second: 1 s until the next request
    assert (await refused(limiter, 60, None, 0)).headers["Retry-After"] == "1"
    clock.now += 0.2
    # 0.8 s left still says 1
    assert (await refused(limiter, 60, None, 0)).headers["Retry-After"] == "1"
    await take(limiter, None, 120, 120)
    # 50 tokens at 2 a second: 25 s; at 2.5 s more, 22.5 s rounds up to 23
    assert (await refused(limiter, None, 120, 50)).headers["Retry-After"] == "25"
    clock.now += 2.5
    assert (await refused(limiter, None, 120, 50)).headers["Retry-After"] == "23"


async def test_retry_after_waits_for_both_buckets(limiter: MemoryLimitsStore) -> None:
    await take(limiter, 6, 60, 60)
    # requests bucket has 5 left; the tokens bucket needs 30 s for 30 tokens
    error = await refused(limiter, 6, 60, 30)
    assert error.headers["Retry-After"] == "30"


async def test_refused_request_takes_nothing_from_either_bucket(
    limiter: MemoryLimitsStore,
) -> None:
    await take(limiter, 10, 100, 90)
    error = await refused(limiter, 10, 100, 20)
    assert error.headers["x-ratelimit-remaining-requests"] == "9"
    assert error.headers["x-ratelimit-remaining-tokens"] == "10"
    # the request slot was not consumed by the refusal
    for _ in range(9):
        await take(limiter, 10, 100, 0)
    await refused(limiter, 10, 100, 0)


async def test_empty_requests_bucket_protects_the_tokens_bucket(
    limiter: MemoryLimitsStore,
) -> None:
    await take(limiter, 1, 100, 10)
    await refused(limiter, 1, 100, 10)
    ok = await take(limiter, 1, 100, 100, tenant="other")
    assert ok.headers()["x-ratelimit-remaining-tokens"] == "0"
    # acme's tokens were not taken by the refused request
    error = await refused(limiter, 1, 100, 90)
    assert error.headers["x-ratelimit-remaining-tokens"] == "90"


async def test_success_and_refusal_headers(limiter: MemoryLimitsStore) -> None:
    reservation = await take(limiter, 600, 60_000, 1000)
    assert reservation.headers() == {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "599",
        "x-ratelimit-reset-requests": "100ms",
        "x-ratelimit-limit-tokens": "60000",
        "x-ratelimit-remaining-tokens": "59000",
        "x-ratelimit-reset-tokens": "1s",
    }
    only_tokens = await take(limiter, None, 1000, 500, tenant="t2")
    assert set(only_tokens.headers()) == {
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    }
    assert only_tokens.headers()["x-ratelimit-reset-tokens"] == "30s"
    unlimited = await take(limiter, None, None, 10**9, tenant="t3")
    assert unlimited.headers() == {}
    limiter.settle(unlimited, 5)
    await take(limiter, 1, None, 0, tenant="t4")
    error = await refused(limiter, 1, None, 0, tenant="t4")
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    assert error.headers["x-ratelimit-reset-requests"] == "1m0s"
    assert error.headers["Retry-After"] == "60"


async def test_settle_refunds_the_unused_tokens_once(limiter: MemoryLimitsStore) -> None:
    reservation = await take(limiter, None, 1000, 800)
    limiter.settle(reservation, 300)
    limiter.settle(reservation, 0)
    assert reservation.settled
    # 1000 - 800 + 500 refunded
    await take(limiter, None, 1000, 700)
    await refused(limiter, None, 1000, 1)


async def test_settle_charges_overuse(limiter: MemoryLimitsStore, clock: FakeClock) -> None:
    reservation = await take(limiter, None, 60, 10)
    limiter.settle(reservation, 100)  # 90 more than reserved: the bucket owes 40
    error = await refused(limiter, None, 60, 1)
    assert error.headers["x-ratelimit-remaining-tokens"] == "0"
    assert error.headers["Retry-After"] == "41"
    clock.now += 41
    await take(limiter, None, 60, 1)


async def test_settle_with_zero_refunds_tokens_but_counts_the_request(
    limiter: MemoryLimitsStore,
) -> None:
    # used_tokens=0 is the old Reservation.cancel(): the request never reached the worker
    reservation = await take(limiter, 2, 100, 100)
    limiter.settle(reservation, 0)
    limiter.settle(reservation, 100)
    assert (await take(limiter, 2, 100, 100)).tokens == 100
    await refused(limiter, 2, 100, 0)


async def test_refunds_never_overfill(limiter: MemoryLimitsStore) -> None:
    first = await take(limiter, None, 100, 50)
    second = await take(limiter, None, 100, 50)
    limiter.settle(first, 0)
    limiter.settle(second, 0)
    limiter.settle(first, 0)
    await take(limiter, None, 100, 100)
    await refused(limiter, None, 100, 1)


async def test_reservation_beyond_the_minute_is_clamped(
    limiter: MemoryLimitsStore, clock: FakeClock
) -> None:
    big = await take(limiter, None, 1000, 5000)
    assert big.tokens == 1000
    error = await refused(limiter, None, 1000, 5000)
    assert error.headers["Retry-After"] == "60"
    clock.now += 60
    again = await take(limiter, None, 1000, 5000)
    limiter.settle(again, 400)
    assert (await take(limiter, None, 1000, 600)).tokens == 600


async def test_lowered_limit_applies_at_once(limiter: MemoryLimitsStore) -> None:
    await take(limiter, 100, None, 0)
    reservation = await take(limiter, 10, None, 0)
    assert reservation.headers()["x-ratelimit-remaining-requests"] == "9"


async def test_invalid_arguments(limiter: MemoryLimitsStore) -> None:
    with pytest.raises(ValueError):
        await take(limiter, 0, None, 0)
    with pytest.raises(ValueError):
        await take(limiter, None, 10, -1)
    with pytest.raises(ValueError):
        limiter.settle(await take(limiter, None, 10, 1), -1)
    with pytest.raises(ValueError):
        MemoryLimitsStore(lease_s=0)


async def test_take_is_all_or_nothing_and_refunds_are_capped(
    limiter: MemoryLimitsStore, clock: FakeClock
) -> None:
    # (was: the bucket store's take/adjust) the requests bucket is not taken
    # when the tokens bucket refuses, a refund stops at the limit, a charge
    # goes into debt
    await take(limiter, 10, 10, 4)
    error = await refused(limiter, 10, 10, 10)
    assert error.headers["x-ratelimit-remaining-requests"] == "9"
    assert error.headers["x-ratelimit-remaining-tokens"] == "6"
    hold = await take(limiter, 10, 10, 6)
    assert hold.headers()["x-ratelimit-remaining-tokens"] == "0"
    assert hold.headers()["x-ratelimit-remaining-requests"] == "8"
    clock.now += 60  # refilled to 10
    limiter.settle(hold, 0)  # 10 + 6 is capped at 10
    ten = await take(limiter, None, 10, 10)
    await refused(limiter, None, 10, 1)
    limiter.settle(ten, 18)  # 8 over: the bucket owes 8
    assert (await refused(limiter, None, 10, 1)).headers["Retry-After"] == "54"


# -- tokens_per_day ---------------------------------------------------------------


async def test_day_budget_refuses_until_utc_midnight(
    limiter: MemoryLimitsStore, wall: FakeClock
) -> None:
    await take(limiter, None, None, 600, tpd=1000)
    await take(limiter, None, None, 400, tpd=1000)
    assert limiter.day_used("acme") == 1000
    error = await refused(limiter, None, None, 1, code="budget_exhausted", tpd=1000)
    assert error.headers == {"Retry-After": "43200"}  # noon to midnight
    wall.now += 43_199.5
    error = await refused(limiter, None, None, 1, code="budget_exhausted", tpd=1000)
    assert error.headers == {"Retry-After": "1"}
    wall.now += 0.5  # midnight: a new day, a new budget
    await take(limiter, None, None, 1000, tpd=1000)


async def test_day_reservation_is_clamped_and_settled(limiter: MemoryLimitsStore) -> None:
    big = await take(limiter, None, None, 5000, tpd=1000)
    assert big.day_tokens == 1000
    limiter.settle(big, 300)
    assert limiter.day_used("acme") == 300
    hold = await take(limiter, None, None, 700, tpd=1000)
    limiter.settle(hold, 900)  # 200 over what it reserved
    assert limiter.day_used("acme") == 1200
    await refused(limiter, None, None, 1, code="budget_exhausted", tpd=1000)
    # an upload (0 tokens) is not refused for the day's debt
    await limiter.reserve("acme", lim(tpd=1000), 0, concurrent=False)


async def test_settlement_of_yesterdays_hold_leaves_today_alone(
    limiter: MemoryLimitsStore, wall: FakeClock
) -> None:
    yesterday = await take(limiter, None, None, 800, tpd=1000)
    wall.now += 43_200  # midnight
    today = await take(limiter, None, None, 100, tpd=1000)
    limiter.settle(yesterday, 0)  # refunds nothing today
    assert limiter.day_used("acme") == 100
    limiter.settle(today, 50)
    assert limiter.day_used("acme") == 50


async def test_day_refusal_wins_over_rate_and_concurrency(limiter: MemoryLimitsStore) -> None:
    hold = await take(limiter, 1, None, 10, tpd=10, conc=1)
    assert hold.slot is not None
    error = await refused(limiter, 1, None, 10, code="budget_exhausted", tpd=10, conc=1)
    assert "x-ratelimit-remaining-requests" not in error.headers
    # without the day budget, the rate limit is reported before concurrency
    error = await refused(limiter, 1, None, 10, conc=1)
    assert error.headers["x-ratelimit-remaining-requests"] == "0"


# -- max_concurrent_requests ------------------------------------------------------


async def test_concurrency_slots_are_held_until_settled(limiter: MemoryLimitsStore) -> None:
    holds = [await take(limiter, None, None, 1, conc=2) for _ in range(2)]
    error = await refused(limiter, None, None, 1, code="concurrency_limited", conc=2)
    assert error.headers == {"Retry-After": "1"}
    assert limiter.active_slots("acme") == 2
    # uploads take no slot
    await limiter.reserve("acme", lim(conc=2), 0, concurrent=False)
    limiter.settle(holds[0], 1)
    limiter.settle(holds[0], 1)  # idempotent: frees one slot, not two
    assert limiter.active_slots("acme") == 1
    await take(limiter, None, None, 1, conc=2)
    await refused(limiter, None, None, 1, code="concurrency_limited", conc=2)


async def test_an_unsettled_slot_expires_with_its_lease(
    limiter: MemoryLimitsStore, clock: FakeClock
) -> None:
    await take(limiter, None, 1000, 600, conc=1)  # never settled
    await refused(limiter, None, 1000, 1, code="concurrency_limited", conc=1)
    clock.now += 30  # the lease (and half a minute of refill: 500)
    assert limiter.active_slots("acme") == 0
    # its tokens stay charged: 400 + 500, not a full bucket
    error = await refused(limiter, None, 1000, 1000, conc=1)
    assert error.headers["x-ratelimit-remaining-tokens"] == "900"


async def test_a_slot_lasts_its_admission_wait_longer(
    limiter: MemoryLimitsStore, clock: FakeClock
) -> None:
    """A request that may still queue for admission keeps its slot for that long
    beyond the lease: a live request never outlives its slot."""
    await limiter.reserve("acme", lim(conc=1), 1, wait_s=20)
    clock.now += 30  # the lease alone
    assert limiter.active_slots("acme") == 1
    clock.now += 20  # and the wait
    assert limiter.active_slots("acme") == 0
