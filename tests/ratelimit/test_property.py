"""Property: random interleavings across replicas never exceed a tenant's limits.

Three Redis stores ("replicas", each with its own pool) share one tenant.
Hypothesis draws sequences of reserve (on any replica), settle (on the
replica that reserved) and expire (the replica dies: the hold's lease ends
without a settlement; simulated by moving the hold's lease expiry into the
past, as time would). A reference model of the limits (integer levels)
predicts every decision; the limits refill slowly enough (12 requests and
60 tokens a minute) that the few milliseconds an example takes cannot flip
an integer decision. After every example all holds are settled or expired
and no slot may be left.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.errors import GatewayError
from gateway.ratelimit import Hold, RedisLimitsStore, TenantLimits, tenant_keys
from tests.fuzz.budget import budget
from tests.support.redis import RedisServer

RPM, TPM, TPD, CONC = 12, 60, 150, 3
LIMITS = TenantLimits(RPM, TPM, TPD, CONC)

reserve_op = st.tuples(st.just("reserve"), st.integers(0, 2), st.integers(0, 80), st.booleans())
settle_op = st.tuples(st.just("settle"), st.integers(0, 50), st.integers(0, 100))
expire_op = st.tuples(st.just("expire"), st.integers(0, 50))
ops_strategy = st.lists(st.one_of(reserve_op, reserve_op, settle_op, expire_op), max_size=40)


@dataclass
class Model:
    requests: int = RPM
    tokens: int = TPM
    day: int = 0
    slots: int = 0
    admitted: int = 0
    #: live holds: (replica, hold)
    live: list[tuple[int, Hold]] = field(default_factory=list)

    def decide(self, tokens: int, concurrent: bool) -> str:
        minute, daily = min(tokens, TPM), min(tokens, TPD)
        if daily and self.day + daily > TPD:
            return "budget_exhausted"
        if self.requests < 1 or (minute and self.tokens < minute):
            return "rate_limited"
        if concurrent and self.slots >= CONC:
            return "concurrency_limited"
        self.requests -= 1
        self.tokens -= minute
        self.day += daily
        self.slots += 1 if concurrent else 0
        self.admitted += 1
        return "ok"

    def settle(self, hold: Hold, used: int) -> None:
        self.tokens = min(TPM, self.tokens + hold.minute_tokens - used)
        self.day = max(0, self.day - hold.day_tokens + used)
        self.slots -= 1 if hold.slot else 0

    def check(self) -> None:
        assert 0 <= self.slots <= CONC
        assert self.admitted <= RPM  # no refill worth a request within an example
        assert self.requests >= 0


async def expire(server: RedisServer, tenant: str, hold: Hold) -> None:
    keys = tenant_keys("mrgw:", tenant)
    with server.client() as client:
        for key in (keys.slots, keys.holds):
            client.zadd(key, {hold.id or hold.slot or "": 0}, xx=True)


async def run(server: RedisServer, ops: list[tuple[object, ...]]) -> None:
    tenant = "prop-" + uuid.uuid4().hex
    # Renewal far slower than an example: an "expired" hold stays expired (its
    # replica died), as no live replica's renewal brings it back.
    stores = [
        RedisLimitsStore.from_url(server.url, timeout_s=2.0, lease_renew_s=300, lease_ttl_s=600)
        for _ in range(3)
    ]
    for store in stores:
        await store.start()
    model = Model()
    try:
        for op in ops:
            if op[0] == "reserve":
                replica, tokens, concurrent = op[1], op[2], op[3]
                assert isinstance(replica, int) and isinstance(tokens, int)
                expected = model.decide(tokens, bool(concurrent))
                try:
                    hold = await stores[replica].reserve(
                        tenant, LIMITS, tokens, concurrent=bool(concurrent)
                    )
                    got = "ok"
                except GatewayError as exc:
                    got = exc.code
                assert got == expected, (op, model)
                if got == "ok":
                    model.live.append((replica, hold))
            elif model.live:
                index = op[1]
                assert isinstance(index, int)
                replica, hold = model.live.pop(index % len(model.live))
                if op[0] == "settle":
                    used = op[2]
                    assert isinstance(used, int)
                    stores[replica].settle(hold, used)
                    assert await stores[replica].flush(5)
                    model.settle(hold, used)
                else:  # the replica died: tokens stay charged, the slot's lease ends
                    await expire(server, tenant, hold)
                    model.slots -= 1 if hold.slot else 0
            model.check()
        for replica, hold in model.live:
            stores[replica].settle(hold, hold.minute_tokens)
        for store in stores:
            assert await store.flush(5)
        # nothing leaked: every slot can be taken again, and the set is then emptied
        free = TenantLimits(max_concurrent_requests=CONC)
        again = [await stores[i].reserve(tenant, free, 0) for i in range(CONC)]
        for i, hold in enumerate(again):
            stores[i].settle(hold, 0)
        for store in stores:
            assert await store.flush(5)
        with server.client() as client:
            assert client.zcard(tenant_keys("mrgw:", tenant).slots) == 0
    finally:
        for store in stores:
            assert await store.aclose(5) == 0


@pytest.mark.fuzz
@budget(100)
@given(ops=ops_strategy)
def test_replicas_never_exceed_limits_or_leak_slots(
    shared_redis: RedisServer, ops: list[tuple[object, ...]]
) -> None:
    asyncio.run(asyncio.wait_for(run(shared_redis, ops), 60))
