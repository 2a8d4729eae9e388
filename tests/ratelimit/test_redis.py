"""The Redis store against a real redis-server: replicas, keys, TTLs, restarts, crashes."""

from __future__ import annotations

import asyncio
import time
import unicodedata

import pytest

from gateway.core.errors import GatewayError
from gateway.ratelimit import Hold, RedisLimitsStore, TenantLimits, tenant_keys
from gateway.ratelimit.core import seconds_until_midnight
from tests.ratelimit.conftest import (
    Recorder,
    StoreFactory,
    away_from_midnight,
    gather_bounded,
    settled,
)
from tests.support.poll import eventually_async
from tests.support.redis import RedisServer


def outcome(result: object) -> str:
    if isinstance(result, Hold):
        return "ok"
    assert isinstance(result, GatewayError), result
    return result.code


async def replicas(make: StoreFactory, n: int = 3) -> list[RedisLimitsStore]:
    """``n`` stores on one Redis, each with a connection pool of its own."""
    return [await make() for _ in range(n)]


def all_keys(server: RedisServer) -> dict[str, int]:
    """Every tenant key in the server with its PTTL (ms; -1 = none); the
    readiness probe's own key is checked on its own."""
    with server.client() as client:
        found = {k.decode(): int(client.pttl(k)) for k in client.scan_iter(count=1000)}
    probe = found.pop("mrgw:probe", None)
    assert probe is None or 0 < probe <= 60_000  # the probe's key has a TTL too
    return found


async def test_replicas_admit_exactly_rpm_in_a_burst(redis_stores: StoreFactory) -> None:
    stores = await replicas(redis_stores)
    limits = TenantLimits(requests_per_minute=20)
    results = await gather_bounded([stores[i % 3].reserve("acme", limits, 0) for i in range(60)])
    codes = [outcome(r) for r in results]
    assert codes.count("ok") == 20
    assert codes.count("rate_limited") == 40


async def test_replicas_share_tokens_within_one_reservation(redis_stores: StoreFactory) -> None:
    stores = await replicas(redis_stores)
    limits = TenantLimits(tokens_per_minute=1000)
    results = await gather_bounded([stores[i % 3].reserve("acme", limits, 130) for i in range(30)])
    admitted = sum(130 for r in results if isinstance(r, Hold))
    # never more than the minute (plus a few ms of refill), never short of it by a whole request
    assert 1000 - 130 < admitted <= 1000


async def test_day_budget_is_shared_and_refuses_until_midnight(
    redis_stores: StoreFactory,
) -> None:
    away_from_midnight()
    a, b, c = await replicas(redis_stores)
    limits = TenantLimits(tokens_per_day=1000)
    await a.reserve("acme", limits, 600)
    await b.reserve("acme", limits, 400)
    with pytest.raises(GatewayError) as info:
        await c.reserve("acme", limits, 1)
    assert info.value.code == "budget_exhausted"
    assert info.value.status == 429
    retry = int(info.value.headers["Retry-After"])
    assert abs(retry - seconds_until_midnight(time.time())) <= 2
    # an upload counts no tokens and is not refused by the day
    await c.reserve("acme", limits, 0, concurrent=False)


async def test_concurrency_holds_under_50_concurrent_reserves(
    redis_stores: StoreFactory, shared_redis: RedisServer
) -> None:
    stores = await replicas(redis_stores)
    limits = TenantLimits(max_concurrent_requests=5)
    results = await gather_bounded([stores[i % 3].reserve("acme", limits, 1) for i in range(50)])
    codes = [outcome(r) for r in results]
    assert (codes.count("ok"), codes.count("concurrency_limited")) == (5, 45)
    for store, result in zip([stores[i % 3] for i in range(50)], results, strict=True):
        if isinstance(result, Hold):
            store.settle(result, 1)
    for store in stores:
        assert await store.flush(5)

    # churn: 50 workers reserve, hold briefly and settle; never more than 5 held at once
    held = 0
    peak = 0
    admitted = 0

    async def worker(store: RedisLimitsStore) -> None:
        nonlocal held, peak, admitted
        for _ in range(10):
            try:
                hold = await store.reserve("acme", limits, 1)
            except GatewayError as exc:
                assert exc.code == "concurrency_limited"
                await asyncio.sleep(0.001)
                continue
            held += 1
            admitted += 1
            peak = max(peak, held)
            await asyncio.sleep(0.002)
            held -= 1
            store.settle(hold, 1)

    await gather_bounded([worker(stores[i % 3]) for i in range(50)], timeout_s=60)
    assert 0 < peak <= 5
    assert admitted >= 5
    for store in stores:
        assert await store.flush(5)
    with shared_redis.client() as client:
        assert client.zcard(tenant_keys("mrgw:", "acme").slots) == 0  # no slot leaked


async def test_a_restarted_gateway_sees_the_remaining_budget(
    redis_stores: StoreFactory,
) -> None:
    away_from_midnight()
    limits = TenantLimits(tokens_per_minute=1200, tokens_per_day=1000)
    first = await redis_stores()
    hold = await first.reserve("acme", limits, 900)
    first.settle(hold, 700)
    assert await first.aclose(5) == 0  # the replica stops (its settlement applied)
    second = await redis_stores()
    with pytest.raises(GatewayError) as info:
        await second.reserve("acme", limits, 301)
    assert info.value.code == "budget_exhausted"
    ok = await second.reserve("acme", limits, 300)
    # the minute's bucket too: 1200 - 700 - 300, plus a few ms of refill (20 a second)
    assert 200 <= int(ok.headers()["x-ratelimit-remaining-tokens"]) < 220


async def _first_admitted(
    store: RedisLimitsStore, limits: TenantLimits, tokens: int, timeout_s: float
) -> Hold | None:
    """Reserve again and again (a caller retrying) until admitted; None past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return await store.reserve("acme", limits, tokens)
        except GatewayError as exc:
            assert exc.code == "concurrency_limited"
            await asyncio.sleep(0.02)  # the caller's pause between attempts
    return None


async def test_a_killed_replicas_slot_expires_but_its_tokens_stay_charged(
    redis_stores: StoreFactory, shared_redis: RedisServer
) -> None:
    limits = TenantLimits(tokens_per_minute=1000, max_concurrent_requests=1)
    # lease_s (its holds) far longer than the slot's lease: only renewal keeps a slot
    ttl, renew = 0.6, 0.1
    doomed = await redis_stores(lease_s=600, lease_ttl_s=ttl, lease_renew_s=renew)
    taken_at = time.monotonic()
    hold = await doomed.reserve("acme", limits, 600)
    assert hold.slot is not None and doomed.leases_held == 1
    survivor = await redis_stores()
    # alive, it keeps its slot past the lease by renewing it
    held_until = time.monotonic() + 3 * ttl
    while time.monotonic() < held_until:
        with pytest.raises(GatewayError) as info:
            await survivor.reserve("acme", limits, 100)
        assert info.value.code == "concurrency_limited"
        await asyncio.sleep(0.05)
    # SIGKILL: never settled, and nothing renews its slot any more
    await doomed.aclose(1)
    died_at = time.monotonic()
    admitted = await _first_admitted(survivor, limits, 100, timeout_s=ttl + 5)
    assert admitted is not None, "the dead replica's slot never expired"
    freed_after = time.monotonic() - died_at
    since_taken = time.monotonic() - taken_at
    # its last renewal was at most one interval before it died (Redis' clock vs ours)
    assert ttl - 2 * renew <= freed_after <= ttl + 1
    # 400 left + refill since (1000/min) - 100: nothing of the 600 came back
    remaining = int(admitted.headers()["x-ratelimit-remaining-tokens"])
    assert remaining <= 400 + since_taken * 1000 / 60 + 2 - 100
    with shared_redis.client() as client:
        keys = tenant_keys("mrgw:", "acme")
        assert client.zcard(keys.slots) == 1  # the survivor's only
        # the dead hold's entry is pruned only after its own lease (lease_s);
        # its tokens stay charged either way
        assert client.zcard(keys.holds) == 2


def _renewals(recorder: Recorder) -> int:
    return sum(1 for op, _ in recorder.calls if op == "renew")


async def test_one_renewal_call_per_interval_renews_every_slot_held(
    redis_stores: StoreFactory, shared_redis: RedisServer
) -> None:
    recorder = Recorder()
    ttl, renew = 1.0, 0.1
    store = await redis_stores(lease_ttl_s=ttl, lease_renew_s=renew, metrics=recorder)
    limits = TenantLimits(max_concurrent_requests=5)
    tenants = ("a", "b", "c")
    holds = [await store.reserve(t, limits, 1) for t in tenants for _ in range(3)]
    assert store.leases_held == 9
    started = time.monotonic()
    await eventually_async(lambda: _renewals(recorder) >= 5, "five renewals")
    window = time.monotonic() - started
    # one pipelined call an interval for all nine slots of three tenants, not one per slot
    assert _renewals(recorder) <= window / renew + 1
    with shared_redis.client() as client:
        seconds, micros = client.time()
        now_ms = seconds * 1000 + micros // 1000
        for tenant in tenants:
            scores = client.zrange(tenant_keys("mrgw:", tenant).slots, 0, -1, withscores=True)
            assert len(scores) == 3
            # each renewed within the last intervals (load may delay one)
            assert all(
                ttl * 1000 - 5 * renew * 1000 < ms - now_ms <= ttl * 1000 for _, ms in scores
            )
    for hold in holds:
        store.settle(hold, 1)
    assert store.leases_held == 0
    assert await store.flush(5)
    sent = _renewals(recorder)
    await asyncio.sleep(3 * renew)  # (the absence of calls: nothing is held)
    assert _renewals(recorder) == sent
    assert recorder.errors == []
    with shared_redis.client() as client:
        assert all(client.zcard(tenant_keys("mrgw:", t).slots) == 0 for t in tenants)


async def test_a_renewal_in_flight_never_revives_the_slot_settled_meanwhile(
    redis_stores: StoreFactory, shared_redis: RedisServer
) -> None:
    """The renewal named the slot, then the request ended: the settlement is
    applied after the renewal (under the same lock), so the slot does not come
    back for a lease."""
    store = await redis_stores(lease_ttl_s=50, lease_renew_s=40)  # renewed by hand only
    slots = tenant_keys("mrgw:", "acme").slots
    hold = await store.reserve("acme", TenantLimits(max_concurrent_requests=1), 1)
    sending, send = asyncio.Event(), store._evalsha_all

    async def slow_send(sha: str, calls: list[tuple[object, ...]]) -> list[object]:
        if sha == store._renew.sha:
            sending.set()
            await asyncio.sleep(0.3)  # the renewal on its way, slowly
        return await send(sha, calls)

    store._evalsha_all = slow_send  # type: ignore[method-assign]
    renewal = asyncio.create_task(store._leases.renew_now())
    await asyncio.wait_for(sending.wait(), 5)
    store.settle(hold, 1)  # the request ends while its renewal travels
    assert await store.flush(5)
    assert await renewal
    with shared_redis.client() as client:
        assert client.zcard(slots) == 0


async def test_renewals_under_churn_leak_no_slot(
    redis_stores: StoreFactory, shared_redis: RedisServer
) -> None:
    """Renewals every 5 ms while 30 callers reserve and settle on three replicas."""
    stores = [await redis_stores(lease_ttl_s=5, lease_renew_s=0.005) for _ in range(3)]
    limits = TenantLimits(max_concurrent_requests=5)

    async def worker(store: RedisLimitsStore) -> None:
        for _ in range(20):
            try:
                hold = await store.reserve("acme", limits, 1)
            except GatewayError as exc:
                assert exc.code == "concurrency_limited"
                await asyncio.sleep(0.001)
                continue
            await asyncio.sleep(0.003)
            store.settle(hold, 1)

    await gather_bounded([worker(stores[i % 3]) for i in range(30)], timeout_s=60)
    for store in stores:
        assert store.leases_held == 0
        assert await store.flush(5)
    with shared_redis.client() as client:
        assert client.zcard(tenant_keys("mrgw:", "acme").slots) == 0


TRICKY_TENANTS = [
    "a:b",
    "a",
    "A",
    ":b",
    "a:",
    "b",
    "*",
    "a*",
    "?",
    "[ab]",
    "{x}",
    "x",
    "{x",
    "x}",
    "}{",
    "a b",
    "a\tb",
    "",
    "ünï",
    unicodedata.normalize("NFD", "ünï"),
    "mrgw:{61}:rpm",
    "61",
    "6",
    "\x00",
    "🦀",
]


async def test_a_hold_lasts_its_admission_wait_longer_and_a_slot_its_lease_ttl(
    redis_stores: StoreFactory, shared_redis: RedisServer
) -> None:
    store = await redis_stores(lease_s=30, lease_ttl_s=15)
    limits = TenantLimits(tokens_per_minute=1000, max_concurrent_requests=1)
    await store.reserve("acme", limits, 1, wait_s=20)
    keys = tenant_keys("mrgw:", "acme")
    with shared_redis.client() as client:
        [(_, hold_ms)] = client.zrange(keys.holds, 0, -1, withscores=True)
        [(_, slot_ms)] = client.zrange(keys.slots, 0, -1, withscores=True)
        seconds, micros = client.time()
        server_ms = seconds * 1000 + micros // 1000
    assert 49_000 < hold_ms - server_ms <= 50_000  # lease 30 s + wait 20 s
    assert 14_000 < slot_ms - server_ms <= 15_000  # renewed from now on, not the wait


async def test_the_probe_needs_writes_not_just_an_answer(
    redis_stores: StoreFactory, shared_redis: RedisServer
) -> None:
    """A Redis that answers PING but refuses writes (a full server under
    noeviction, a read-only replica) refuses every reservation: the probe says so."""
    store = await redis_stores()
    assert await store.probe() and store.healthy
    with shared_redis.client() as client:
        client.config_set("maxmemory", "1")
        try:
            assert client.ping()
            assert not await store.probe()
            assert not store.healthy
        finally:
            client.config_set("maxmemory", "0")
    assert await store.probe() and store.healthy


async def test_a_read_only_server_keeps_settlements_queued_until_it_is_writable(
    redis_stores: StoreFactory, shared_redis: RedisServer
) -> None:
    """After a failover the old primary answers READONLY: settlements are retried,
    not dropped, so the slot comes back once the server takes writes again."""
    store = await redis_stores()
    limits = TenantLimits(max_concurrent_requests=1)
    hold = await store.reserve("acme", limits, 1)
    with shared_redis.client() as client:
        client.execute_command("REPLICAOF", "127.0.0.1", "1")  # nothing listens: read-only
        try:
            store.settle(hold, 1)
            assert not await store.flush(0.5)
            assert store.pending_settlements == 1
            assert not store.healthy
        finally:
            client.execute_command("REPLICAOF", "NO", "ONE")
    assert await store.flush(5)
    again = await store.reserve("acme", limits, 1)  # the slot came back
    await settled(store, again, 1)


async def test_tenant_names_never_share_keys(
    redis_stores: StoreFactory, shared_redis: RedisServer
) -> None:
    assert len(set(TRICKY_TENANTS)) == len(TRICKY_TENANTS)
    store = await redis_stores()
    limits = TenantLimits(1, 1000, 5000, 1)
    for tenant in TRICKY_TENANTS:
        await store.reserve(tenant, limits, 10)  # every tenant's first request fits
    for tenant in TRICKY_TENANTS:
        with pytest.raises(GatewayError):
            await store.reserve(tenant, limits, 10)  # and only its first
    keys = all_keys(shared_redis)
    owners: dict[str, set[str]] = {}
    for key in keys:
        assert key.startswith("mrgw:{"), key
        tag, kind = key[len("mrgw:{") :].split("}:")
        assert kind in {"rpm", "tpm", "day", "slots", "holds"}
        owners.setdefault(bytes.fromhex(tag).decode("utf-8"), set()).add(kind)
    assert set(owners) == set(TRICKY_TENANTS)
    assert all(kinds == {"rpm", "tpm", "day", "slots", "holds"} for kinds in owners.values())
    assert len(keys) == 5 * len(TRICKY_TENANTS)


async def test_every_key_has_a_ttl(redis_stores: StoreFactory, shared_redis: RedisServer) -> None:
    store = await redis_stores(lease_s=30)
    limits = TenantLimits(10, 1000, 5000, 2)
    hold = await store.reserve("acme", limits, 100)
    await store.reserve("acme", limits, 10)  # held
    await settled(store, hold, 1500)  # 1400 over: the minute's bucket owes 510
    await store.reserve("acme", limits, 0, concurrent=False)
    keys = all_keys(shared_redis)
    assert len(keys) == 5
    k = tenant_keys("mrgw:", "acme")
    day_left_ms = seconds_until_midnight(time.time()) * 1000
    for key, ttl in keys.items():
        assert ttl > 0, key
    # a bucket lives while it refills to full plus a minute
    assert 60_000 < keys[k.requests] <= 2 * 60_000
    assert 60_000 + 90_000 < keys[k.tokens] <= 60_000 + 91_000  # from -510: 91 s
    # the day counter until an hour after the day; slots and holds: lease + margin
    assert day_left_ms < keys[k.day] <= day_left_ms + 3_600_000 + 1000
    assert 60_000 < keys[k.slots] <= 90_000
    assert 60_000 < keys[k.holds] <= 90_000
    # a tenant's sets go with their last member
    done = await store.reserve("other", limits, 10)
    await settled(store, done, 5)
    other = tenant_keys("mrgw:", "other")
    assert {other.requests, other.tokens, other.day} == set(all_keys(shared_redis)) - set(keys)


async def test_settlements_apply_once_even_when_retried(
    redis_stores: StoreFactory, shared_redis: RedisServer
) -> None:
    store = await redis_stores()
    limits = TenantLimits(tokens_per_minute=1000, max_concurrent_requests=2)
    hold = await store.reserve("acme", limits, 800)
    store.settle(hold, 0)
    assert store.pending_settlements == 1
    # a batch whose reply was lost is sent again: the server applies it once
    batch = list(store._flusher._pending)
    await store._apply(batch + batch)
    assert await store.flush(5)
    after = await store.reserve("acme", limits, 1000)  # 1000 back, not 1800 capped
    with pytest.raises(GatewayError) as info:
        await store.reserve("acme", limits, 1)
    assert info.value.code == "rate_limited"
    await settled(store, after, 1000)


async def test_settlements_survive_a_flushed_script_cache(
    redis_stores: StoreFactory, shared_redis: RedisServer
) -> None:
    """A Redis restarted without its scripts (or SCRIPT FLUSH): the settle script
    is loaded again and the batch applied, with no error counted."""
    store = await redis_stores()
    limits = TenantLimits(max_concurrent_requests=1)
    hold = await store.reserve("acme", limits, 10)
    with shared_redis.client() as client:
        client.script_flush()
    store.settle(hold, 1)
    assert await store.flush(5)
    assert store.healthy
    again = await store.reserve("acme", limits, 10)  # the one slot came back
    await settled(store, again, 1)
    with shared_redis.client() as client:
        assert client.zcard(tenant_keys("mrgw:", "acme").slots) == 0


async def test_password_from_the_environment_and_never_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from tests.support.redis import redis_server

    secret = "s3cret-Pa55word-not-to-be-logged"
    with redis_server(password=secret) as server:
        good = RedisLimitsStore.from_url(server.url, password=secret, timeout_s=2)
        await good.start()
        assert good.healthy
        await good.reserve("acme", TenantLimits(requests_per_minute=5), 0)
        await good.aclose(2)
        bad = RedisLimitsStore.from_url(server.url, password=secret + "x", timeout_s=2)
        await bad.start()
        assert not bad.healthy
        with pytest.raises(GatewayError) as info:
            await bad.reserve("acme", TenantLimits(requests_per_minute=5), 0)
        assert info.value.code == "limits_unavailable"
        assert info.value.status == 503
        await bad.aclose(2)
    assert "limits store unavailable" in caplog.text
    assert secret not in caplog.text


async def test_a_void_that_overtakes_its_lost_reservation_leaves_nothing_taken(
    redis_stores: StoreFactory, shared_redis: RedisServer
) -> None:
    """The void of a lost reserve travels on another connection and may reach the
    server first (e.g. both queued behind a pause): the reservation then takes nothing."""
    from gateway.ratelimit.redis_store import _Settlement

    store = await redis_stores(lease_s=30)
    keys = tenant_keys("mrgw:", "acme")
    await store._apply([_Settlement(keys, "lost-1", 0, 0, -1, 0, void=True)])
    with shared_redis.client() as client:
        assert client.zcard(keys.void) == 1
        assert 60_000 < client.pttl(keys.void) <= 90_000  # a TTL, like every key
    # the lost reservation arrives now: rpm 5, tpm 1000 (100), 1 slot, registered
    args = (5, 1000, 100, 0, 0, 1, "lost-1", 30_000, 1, 15_000)
    raw = await store._reserve(keys=keys.reserve, args=args)
    assert int(raw[0]) == 16  # voided: nothing taken
    with shared_redis.client() as client:
        assert client.zcard(keys.slots) == client.zcard(keys.holds) == 0
        assert not client.exists(keys.requests, keys.tokens, keys.void)
    # the tenant's whole budget and its one slot are there
    hold = await store.reserve("acme", TenantLimits(5, 1000, None, 1), 100)
    assert hold.headers()["x-ratelimit-remaining-requests"] == "4"
    assert hold.headers()["x-ratelimit-remaining-tokens"] == "900"
    await settled(store, hold, 100)


async def test_a_void_after_its_reservation_frees_the_slot_and_keeps_the_tokens(
    redis_stores: StoreFactory, shared_redis: RedisServer
) -> None:
    from gateway.ratelimit.redis_store import _Settlement

    store = await redis_stores(lease_s=30)
    keys = tenant_keys("mrgw:", "acme")
    hold = await store.reserve("acme", TenantLimits(5, 1000, None, 1), 100)
    assert hold.slot is not None
    await store._apply([_Settlement(keys, hold.slot, 0, 0, -1, 0, void=True)])
    with shared_redis.client() as client:
        assert client.zcard(keys.slots) == client.zcard(keys.holds) == 0
        assert not client.exists(keys.void)  # it found its reservation: no tombstone
    again = await store.reserve("acme", TenantLimits(5, 1000, None, 1), 100)  # the slot is free
    assert int(again.headers()["x-ratelimit-remaining-tokens"]) < 900  # 100 stayed charged
    await settled(store, again, 100)


async def test_a_cancelled_call_is_never_swallowed(redis_stores: StoreFactory) -> None:
    """A cancel landing anywhere in a store call propagates (redis-py's socket
    timeout used asyncio.wait_for, which on 3.11 could swallow it), so a
    cancelled request stops and a closing flusher stops."""
    store = await redis_stores()
    limits = TenantLimits(10**6, 10**9, None, 10**3)
    for steps in range(16):
        task = asyncio.create_task(store.reserve("acme", limits, 1))
        for _ in range(steps):
            await asyncio.sleep(0)
        if task.done():
            store.settle(task.result(), 1)
            continue
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    # the flusher, closed while it applies a batch: every interruption point
    for steps in range(16):
        closing = await redis_stores()
        hold = await closing.reserve("acme", limits, 1)
        closing.settle(hold, 1)
        for _ in range(steps):
            await asyncio.sleep(0)
        async with asyncio.timeout(10):
            assert await closing.aclose(0) in (0, 1)
