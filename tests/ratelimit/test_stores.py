"""Both stores, one contract: the same sequence gets the same decisions.

Time is real here (the Redis store runs on the server's clock), so the
limits are chosen to refill slowly (at most 100 a minute: a decision or a
``remaining`` header would need a stall of over half a second between two
steps to change): decisions, ``Retry-After`` and ``remaining`` headers are
exact; ``reset`` headers are not compared.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from gateway.core.errors import GatewayError
from gateway.ratelimit import Hold, LimitsStore, MemoryLimitsStore, TenantLimits
from gateway.ratelimit.core import seconds_until_midnight
from tests.ratelimit.conftest import StoreFactory, away_from_midnight, settled

_COMPARED = ("Retry-After", "x-ratelimit-remaining-requests", "x-ratelimit-remaining-tokens")


@dataclass(frozen=True)
class Step:
    """Reserve ``tokens`` (keeping the hold as ``name``), or settle hold ``name``."""

    name: str
    limits: TenantLimits | None = None
    tokens: int = 0
    used: int | None = None
    concurrent: bool = True
    tenant: str = "acme"


R3 = TenantLimits(requests_per_minute=3)
T60 = TenantLimits(tokens_per_minute=60)
D1000 = TenantLimits(tokens_per_day=1000)
C2 = TenantLimits(max_concurrent_requests=2)
ALL = TenantLimits(6, 100, 90, 2)
R1C1 = TenantLimits(requests_per_minute=1, max_concurrent_requests=1)

SEQUENCE = [
    # rpm: three, then a refusal
    *(Step(f"r{i}", R3) for i in range(4)),
    # tpm: settle refunds the unused part, once
    Step("t1", T60, 48),
    Step("t1", used=18),
    Step("t1", used=0),
    Step("t2", T60, 42),
    Step("t3", T60, 1),
    # clamped to the minute, then waits for a full bucket
    Step("big", T60, 500, tenant="other"),
    Step("big2", T60, 1, tenant="other"),
    Step("big", used=24, tenant="other"),
    Step("big3", T60, 36, tenant="other"),
    # the day
    Step("d1", D1000, 600),
    Step("d2", D1000, 400),
    Step("d3", D1000, 1),
    Step("d1", used=100),
    Step("d4", D1000, 500),
    Step("d5", D1000, 1),
    Step("up", D1000, 0, concurrent=False),
    # concurrency
    Step("c1", C2, 1),
    Step("c2", C2, 1),
    Step("c3", C2, 1),
    Step("up2", C2, 0, concurrent=False),
    Step("c1", used=1),
    Step("c4", C2, 1),
    Step("c5", C2, 1),
    # everything at once: the longest-lasting refusal is reported
    Step("a1", ALL, 50, tenant="mixed"),
    Step("a2", ALL, 40, tenant="mixed"),
    Step("a3", ALL, 10, tenant="mixed"),
    Step("a1", used=60, tenant="mixed"),
    Step("a4", ALL, 1, tenant="mixed"),
    Step("a2", used=0, tenant="mixed"),
    Step("a5", ALL, 30, tenant="mixed"),
    Step("a6", ALL, 1, tenant="mixed"),
    Step("b1", R1C1, 1, tenant="mixed2"),
    Step("b2", R1C1, 1, tenant="mixed2"),
]


async def play(store: LimitsStore, steps: list[Step]) -> list[tuple[str, ...]]:
    holds: dict[str, Hold] = {}
    out: list[tuple[str, ...]] = []
    for step in steps:
        if step.limits is None:
            assert step.used is not None
            await settled(store, holds[step.name], step.used)
            out.append(("settled", step.name))
            continue
        try:
            hold = await store.reserve(
                step.tenant, step.limits, step.tokens, concurrent=step.concurrent
            )
        except GatewayError as exc:
            headers = exc.headers
            if exc.code == "budget_exhausted":
                # seconds to midnight: equal within the test's own duration
                left = float(headers["Retry-After"])
                assert abs(left - seconds_until_midnight(time.time())) < 5
                headers = {**headers, "Retry-After": "<midnight>"}
            out.append((exc.code, *(f"{k}={headers.get(k)}" for k in _COMPARED)))
            continue
        holds[step.name] = hold
        head = hold.headers()
        out.append(("ok", str(hold.minute_tokens), str(hold.day_tokens), str(bool(hold.slot))))
        out[-1] += tuple(f"{k}={head.get(k)}" for k in _COMPARED[1:])
    return out


async def test_memory_and_redis_decide_alike(redis_stores: StoreFactory) -> None:
    away_from_midnight()
    memory = await play(MemoryLimitsStore(), SEQUENCE)
    redis = await play(await redis_stores(), SEQUENCE)
    assert redis == memory
    codes = [row[0] for row in memory if row[0] != "settled"]
    # the sequence exercises every answer
    assert {"ok", "rate_limited", "budget_exhausted", "concurrency_limited"} == set(codes)
    assert memory[3][:2] == ("rate_limited", "Retry-After=20")


def lim(rpm: int | None = None, tpm: int | None = None, **more: int) -> TenantLimits:
    return TenantLimits(rpm, tpm, more.get("tpd"), more.get("conc"))


async def refused(store: LimitsStore, limits: TenantLimits, tokens: int) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        await store.reserve("acme", limits, tokens)
    assert info.value.status == 429
    return info.value


async def test_settle_charges_overuse(store: LimitsStore) -> None:
    hold = await store.reserve("acme", lim(tpm=60), 10)
    await settled(store, hold, 100)  # 90 more than reserved: the bucket owes 40
    error = await refused(store, lim(tpm=60), 1)
    assert error.code == "rate_limited"
    assert error.headers["x-ratelimit-remaining-tokens"] == "0"
    assert error.headers["Retry-After"] == "41"


async def test_unlimited_tenant_gets_no_headers_and_no_slot(store: LimitsStore) -> None:
    hold = await store.reserve("acme", TenantLimits(), 10**9)
    assert hold.headers() == {}
    assert hold.slot is None
    store.settle(hold, 5)
    assert hold.settled


async def test_success_headers(store: LimitsStore) -> None:
    hold = await store.reserve("acme", lim(600, 60_000), 1000)
    headers = hold.headers()
    assert headers["x-ratelimit-limit-requests"] == "600"
    assert headers["x-ratelimit-remaining-requests"] == "599"
    assert headers["x-ratelimit-limit-tokens"] == "60000"
    assert headers["x-ratelimit-remaining-tokens"] == "59000"
    assert headers["x-ratelimit-reset-tokens"].endswith(("ms", "s"))
    assert "Retry-After" not in headers


async def test_concurrency_refusal(store: LimitsStore) -> None:
    first = await store.reserve("acme", lim(conc=1), 1)
    error = await refused(store, lim(conc=1), 1)
    assert (error.code, error.headers) == ("concurrency_limited", {"Retry-After": "1"})
    await settled(store, first, 1)
    await settled(store, first, 1)  # a second settle is a no-op
    again = await store.reserve("acme", lim(conc=1), 1)
    assert again.slot is not None and again.slot != first.slot
    await refused(store, lim(conc=1), 1)


async def test_day_refusal_says_midnight(store: LimitsStore) -> None:
    away_from_midnight()
    await store.reserve("acme", lim(tpd=10), 10)
    error = await refused(store, lim(tpd=10), 1)
    assert error.code == "budget_exhausted"
    assert abs(int(error.headers["Retry-After"]) - seconds_until_midnight(time.time())) <= 2
    assert store.healthy


async def test_tenant_names_never_share_limits(store: LimitsStore) -> None:
    """Names the policy refuses (spec §15 asks that none could collide anyway)."""
    from tests.ratelimit.test_redis import TRICKY_TENANTS

    limits = TenantLimits(1, 1000, 5000, 1)
    for tenant in TRICKY_TENANTS:
        await store.reserve(tenant, limits, 10)  # every tenant's first request fits
    for tenant in TRICKY_TENANTS:
        with pytest.raises(GatewayError) as info:
            await store.reserve(tenant, limits, 10)  # and only its first
        assert info.value.code == "rate_limited"
