"""The Redis store on a server over ``maxmemory`` (``noeviction``): a store failure
for every tenant, before any write, and a clean recovery (spec §15).

Each test has a redis-server of its own, filled with ``tests.support.redis_full``.
"""

from __future__ import annotations

import pytest
from redis.exceptions import OutOfMemoryError

from gateway.core.errors import GatewayError
from gateway.ratelimit import RedisLimitsStore, TenantLimits, tenant_keys
from gateway.ratelimit.scripts import PROBE, RESERVE, SETTLE
from tests.ratelimit.conftest import Recorder, away_from_midnight
from tests.support.redis import RedisServer
from tests.support.redis_full import fill, keys_besides_filler, over_maxmemory, release

#: every shape of limits: the concurrency limit's first write (ZREMRANGEBYSCORE)
#: is not deny-oom, which is what let those tenants through a full server
SHAPES = {
    "rpm": TenantLimits(requests_per_minute=600),
    "tpm": TenantLimits(tokens_per_minute=10_000),
    "tpd": TenantLimits(tokens_per_day=100_000),
    "conc": TenantLimits(max_concurrent_requests=4),
    "rpm+conc": TenantLimits(requests_per_minute=600, max_concurrent_requests=4),
    "all": TenantLimits(
        requests_per_minute=600,
        tokens_per_minute=10_000,
        tokens_per_day=100_000,
        max_concurrent_requests=4,
    ),
}


async def make(server: RedisServer, recorder: Recorder, **kwargs: object) -> RedisLimitsStore:
    kwargs.setdefault("timeout_s", 1.0)
    store = RedisLimitsStore.from_url(server.url, metrics=recorder, **kwargs)  # type: ignore[arg-type]
    await store.start()
    return store


@pytest.mark.parametrize("script", [RESERVE, SETTLE, PROBE], ids=["reserve", "settle", "probe"])
def test_every_script_declares_its_flags_and_none_allows_oom(script: str) -> None:
    first, _, body = script.partition("\n")
    assert first == "#!lua"  # flags declared (none): refused up front when over maxmemory
    assert "allow-oom" not in script and "no-writes" not in script
    assert "redis.call(" in body


async def test_a_full_server_refuses_every_tenant_alike_and_nothing_is_written(
    own_redis: RedisServer,
) -> None:
    away_from_midnight()
    recorder = Recorder()
    store = await make(own_redis, recorder)
    fill(own_redis)
    # Interleaved, several rounds: the answer must not depend on who called last.
    for _ in range(3):
        for tenant, limits in SHAPES.items():
            with pytest.raises(GatewayError) as info:
                await store.reserve(tenant, limits, 10)
            assert (info.value.code, info.value.status) == ("limits_unavailable", 503)
            assert isinstance(info.value.__cause__, OutOfMemoryError)
            assert not store.healthy
        assert not await store.probe()
        assert not store.healthy
    assert recorder.errors.count("reserve") == 3 * len(SHAPES)
    # Refused before the script ran: no key written, no lost reply to void.
    assert keys_besides_filler(own_redis) == []
    assert store.pending_settlements == 0
    assert over_maxmemory(own_redis)
    release(own_redis)
    assert await store.probe() and store.healthy
    for tenant, limits in SHAPES.items():
        hold = await store.reserve(tenant, limits, 10)
        assert hold.checked
        store.settle(hold, 5)  # a refund: every hold's entry goes
    assert await store.flush(5)
    with own_redis.client() as client:
        for tenant in SHAPES:
            keys = tenant_keys("mrgw:", tenant)
            assert client.zcard(keys.slots) == 0
            assert client.zcard(keys.holds) == 0
            assert client.zcard(keys.void) == 0  # no tombstone of a refused call
    assert await store.aclose(5) == 0


async def test_under_open_a_full_server_serves_every_tenant_unchecked(
    own_redis: RedisServer,
) -> None:
    store = await make(own_redis, Recorder(), on_error="open")
    fill(own_redis)
    for tenant, limits in SHAPES.items():
        hold = await store.reserve(tenant, limits, 10)
        assert not hold.checked and hold.headers() == {}
        store.settle(hold, 10)  # nothing to settle
    assert not store.healthy
    assert store.pending_settlements == 0
    assert keys_besides_filler(own_redis) == []
    release(own_redis)
    assert (await store.reserve("conc", SHAPES["conc"], 10)).checked
    assert store.healthy
    await store.aclose(5)


async def test_settlements_wait_out_a_full_server_and_apply_once(own_redis: RedisServer) -> None:
    away_from_midnight()
    recorder = Recorder()
    store = await make(own_redis, recorder)
    limits = SHAPES["all"]
    holds = [await store.reserve("acme", limits, 1000) for _ in range(4)]
    keys = tenant_keys("mrgw:", "acme")
    with own_redis.client() as client:
        before = {k: client.dump(k) for k in keys_besides_filler(own_redis)}
    fill(own_redis)
    for hold in holds:
        store.settle(hold, 100)
    assert not await store.flush(0.5)  # refused whole, retried with backoff
    assert store.pending_settlements == 4
    assert "settle" in recorder.errors
    assert not store.healthy
    with own_redis.client() as client:
        # nothing half-written: every key of the tenant is as it was
        assert {k: client.dump(k) for k in before} == before
        assert client.zcard(keys.slots) == 4 and client.zcard(keys.holds) == 4
    release(own_redis)
    assert await store.flush(5)
    assert store.healthy
    with own_redis.client() as client:
        assert client.zcard(keys.slots) == 0 and client.zcard(keys.holds) == 0
        assert client.zcard(keys.void) == 0
        assert int(client.hget(keys.day, "u") or 0) == 4 * 100  # refunded once each
    hold = await store.reserve("acme", limits, 1)
    assert int(hold.headers()["x-ratelimit-remaining-tokens"]) >= 10_000 - 4 * 100 - 1
    store.settle(hold, 1)
    assert await store.aclose(5) == 0
