"""The Redis store when Redis goes away, stalls, or comes back (spec §15).

Each test has a redis-server of its own, stopped (by PID), paused with
``CLIENT PAUSE`` or restarted on the same port.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from gateway.core.errors import GatewayError
from gateway.ratelimit import RedisLimitsStore, TenantLimits, tenant_keys
from tests.ratelimit.conftest import Recorder
from tests.support.redis import RedisServer

LIMITS = TenantLimits(requests_per_minute=600, tokens_per_minute=10_000, max_concurrent_requests=4)


async def make(server: RedisServer, recorder: Recorder, **kwargs: object) -> RedisLimitsStore:
    kwargs.setdefault("timeout_s", 0.2)
    store = RedisLimitsStore.from_url(server.url, metrics=recorder, **kwargs)  # type: ignore[arg-type]
    await store.start()
    return store


@contextmanager
def paused(server: RedisServer, ms: int) -> Iterator[float]:
    """``CLIENT PAUSE ms ALL``; yields when the pause ends (monotonic)."""
    with server.client() as client:
        client.execute_command("CLIENT", "PAUSE", ms, "ALL")
        yield time.monotonic() + ms / 1000


async def recovered(store: RedisLimitsStore, timeout_s: float = 5) -> bool:
    """Poll the store's own PING until it answers (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await store.probe():
            return True
        await asyncio.sleep(0.02)
    return False


async def test_closed_refuses_while_redis_is_down_and_recovers(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "gateway.limits")
    recorder = Recorder()
    store = await make(own_redis, recorder)
    hold = await store.reserve("acme", LIMITS, 10)
    store.settle(hold, 10)
    assert await store.flush(5)
    own_redis.stop()
    for _ in range(3):
        started = time.monotonic()
        with pytest.raises(GatewayError) as info:
            await store.reserve("acme", LIMITS, 10)
        assert time.monotonic() - started < 1
        assert (info.value.code, info.value.status) == ("limits_unavailable", 503)
    assert not store.healthy
    assert recorder.errors.count("reserve") == 3
    # logged once for the episode, with the reason
    warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(warnings) == 1
    assert "ConnectionError" in warnings[0].getMessage()
    own_redis.start()  # the same port, an empty server
    hold = await store.reserve("acme", LIMITS, 10)
    assert store.healthy and hold.checked
    assert any("available again" in r.getMessage() for r in caplog.records)
    store.settle(hold, 10)
    assert await store.aclose(5) == 0


async def test_open_serves_unchecked_while_redis_is_down(own_redis: RedisServer) -> None:
    recorder = Recorder()
    store = await make(own_redis, recorder, on_error="open")
    own_redis.stop()
    hold = await store.reserve("acme", LIMITS, 10)
    assert not hold.checked
    assert hold.headers() == {}
    queued = store.pending_settlements  # (the void of the lost reservation)
    store.settle(hold, 10)  # nothing to settle
    assert store.pending_settlements == queued
    assert recorder.errors == ["reserve"]
    assert not store.healthy
    own_redis.start()
    checked = await store.reserve("acme", LIMITS, 10)
    assert checked.checked and checked.headers()
    assert store.healthy
    store.settle(checked, 10)
    assert await store.aclose(5) == 0


@pytest.mark.parametrize("on_error", ["closed", "open"])
async def test_a_store_slower_than_timeout_ms_is_a_failure(
    own_redis: RedisServer, on_error: str
) -> None:
    recorder = Recorder()
    store = await make(own_redis, recorder, timeout_s=0.05, on_error=on_error)
    await store.reserve("acme", LIMITS, 10)
    with paused(own_redis, 400):
        started = time.monotonic()
        if on_error == "closed":
            with pytest.raises(GatewayError) as info:
                await store.reserve("acme", LIMITS, 10)
            assert info.value.code == "limits_unavailable"
        else:
            assert not (await store.reserve("acme", LIMITS, 10)).checked
        elapsed = time.monotonic() - started
        assert 0.04 < elapsed < 0.3  # the 50 ms timeout, not the 400 ms pause
    assert recorder.errors.count("reserve") == 1
    assert await recovered(store)
    hold = await store.reserve("acme", LIMITS, 10)
    assert hold.checked
    await store.aclose(5)


async def test_settle_never_blocks_and_is_applied_after_a_pause(own_redis: RedisServer) -> None:
    recorder = Recorder()
    store = await make(own_redis, recorder, timeout_s=0.05)
    holds = [await store.reserve("acme", LIMITS, 100) for _ in range(4)]
    slots = tenant_keys("mrgw:", "acme").slots
    with paused(own_redis, 700) as until:
        started = time.perf_counter()
        for hold in holds:
            store.settle(hold, 50)
        assert time.perf_counter() - started < 0.05  # the pause lasts 700 ms
        assert store.pending_settlements == 4
        assert await store.flush(5)  # the flusher retried until Redis answered
        assert time.monotonic() > until - 0.1
    assert "settle" in recorder.errors
    with own_redis.client() as client:
        assert client.zcard(slots) == 0
    # 4 x 50 came back: 9600 + refill
    hold = await store.reserve("acme", LIMITS, 1)
    assert int(hold.headers()["x-ratelimit-remaining-tokens"]) >= 9800 - 1
    store.settle(hold, 1)
    assert await store.aclose(5) == 0


async def test_close_is_bounded_and_counts_what_it_could_not_apply(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    store = await make(own_redis, Recorder())
    holds = [await store.reserve("acme", LIMITS, 100) for _ in range(3)]
    own_redis.stop()
    for hold in holds:
        store.settle(hold, 0)
    started = time.monotonic()
    assert await store.aclose(0.3) == 3
    assert time.monotonic() - started < 1.5
    assert "3 settlements not applied" in caplog.text


async def test_a_lost_reservation_does_not_leak_its_slot(own_redis: RedisServer) -> None:
    store = await make(own_redis, Recorder(), timeout_s=0.05)
    limits = TenantLimits(max_concurrent_requests=1)
    with paused(own_redis, 300):
        with pytest.raises(GatewayError):
            await store.reserve("acme", limits, 1)
        assert store.pending_settlements == 1  # the void of the lost answer
    assert await store.flush(5)
    hold = await store.reserve("acme", limits, 1)  # the slot is free
    store.settle(hold, 1)
    assert await store.aclose(5) == 0


async def test_a_cancelled_reserve_voids_its_slot(own_redis: RedisServer) -> None:
    store = await make(own_redis, Recorder(), timeout_s=2)
    limits = TenantLimits(max_concurrent_requests=1)
    with paused(own_redis, 400):
        task = asyncio.create_task(store.reserve("acme", limits, 1))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await store.flush(5)
    hold = await store.reserve("acme", limits, 1)
    store.settle(hold, 1)
    assert await store.aclose(5) == 0


async def test_renewal_outlives_an_outage_and_takes_back_the_slots_still_running(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis away for longer than the lease, then back empty: the renewal task
    keeps trying (every failure counted, one warning), and its first success
    takes back the slots of the requests still running; a settled one stays gone."""
    caplog.set_level(logging.INFO, "gateway.limits")
    recorder = Recorder()
    store = await make(own_redis, recorder, lease_ttl_s=0.6, lease_renew_s=0.1)
    running = await store.reserve("acme", LIMITS, 10)
    ending = await store.reserve("acme", LIMITS, 10)
    slots = tenant_keys("mrgw:", "acme").slots
    own_redis.stop()
    assert await _eventually(lambda: recorder.errors.count("renew") >= 5)
    assert "limits-leases" in [t.get_name() for t in asyncio.all_tasks()]  # still renewing
    store.settle(ending, 10)  # one request ends during the outage
    own_redis.start()  # the same port, an empty server: both slots are gone
    with own_redis.client() as client:
        assert await _eventually(lambda: client.zcard(slots) == 1)
        [(slot, _)] = client.zrange(slots, 0, -1, withscores=True)
    assert slot.decode() == running.slot
    assert store.healthy
    said = [r.getMessage() for r in caplog.records]
    assert sum("limits store unavailable" in m for m in said) == 1, said  # once per episode
    assert any("during renew" in m for m in said)
    assert any("1 expired slots of running requests taken again" in m for m in said)
    store.settle(running, 10)
    assert await store.flush(5)
    assert store.leases_held == 0
    with own_redis.client() as client:
        assert client.zcard(slots) == 0
    assert await store.aclose(5) == 0


def test_the_server_helper_restarts_on_the_same_port(own_redis: RedisServer) -> None:
    port, pid = own_redis.port, own_redis.pid
    own_redis.restart()
    assert (own_redis.port, own_redis.running) == (port, True)
    assert own_redis.pid != pid
    with own_redis.client() as client:
        assert client.ping()


async def test_the_probe_follows_redis_without_traffic(own_redis: RedisServer) -> None:
    recorder = Recorder()
    store = await make(own_redis, recorder, probe_interval_s=0.02)
    assert store.healthy
    own_redis.stop()
    assert await _eventually(lambda: not store.healthy)
    assert "probe" in recorder.errors and "reserve" not in recorder.errors
    own_redis.start()  # the same port
    assert await _eventually(lambda: store.healthy)
    assert [t.get_name() for t in asyncio.all_tasks()].count("limits-probe") == 1
    assert await store.aclose(5) == 0
    assert "limits-probe" not in [t.get_name() for t in asyncio.all_tasks()]


def test_the_probe_interval_must_be_positive(own_redis: RedisServer) -> None:
    with pytest.raises(ValueError, match="probe_interval_s"):
        RedisLimitsStore.from_url(own_redis.url, probe_interval_s=0)


@pytest.mark.parametrize(("renew", "ttl"), [(0, 15), (15, 15), (20, 15), (-1, 15)])
def test_a_slot_lease_must_outlast_its_renewal_interval(renew: float, ttl: float) -> None:
    with pytest.raises(ValueError, match="lease_renew_s"):
        # (refused before any connection)
        RedisLimitsStore.from_url("redis://127.0.0.1:1/0", lease_renew_s=renew, lease_ttl_s=ttl)


async def _eventually(predicate: Callable[[], bool], timeout_s: float = 5) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_one_slow_answer_fails_its_request_never_readiness(own_redis: RedisServer) -> None:
    """Spec §24: a call past ``timeout_ms`` is that request's 503, and the store
    stays ``ready``; only a store failing every call for ``unready_after_s`` is
    unready (a probe every 20 ms keeps failing meanwhile), ready again at once."""
    recorder = Recorder()
    store = await make(
        own_redis, recorder, timeout_s=0.05, probe_interval_s=0.02, unready_after_s=0.6
    )
    with paused(own_redis, 150):
        with pytest.raises(GatewayError) as info:
            await store.reserve("acme", LIMITS, 10)
        assert info.value.code == "limits_unavailable"
        assert not store.healthy and store.ready
    assert await _eventually(lambda: store.healthy)
    assert store.ready
    stopped = time.monotonic()
    own_redis.stop()
    assert await _eventually(lambda: not store.healthy)
    assert store.ready  # failing, not for long enough yet
    assert await _eventually(lambda: not store.ready)
    assert time.monotonic() - stopped >= 0.6
    assert recorder.errors.count("probe") >= 5
    own_redis.start()
    assert await _eventually(lambda: store.ready and store.healthy)
    assert await store.aclose(5) == 0


async def test_unready_after_zero_is_unready_at_the_first_failure(own_redis: RedisServer) -> None:
    store = await make(own_redis, Recorder(), timeout_s=0.05, unready_after_s=0)
    with paused(own_redis, 150):
        with pytest.raises(GatewayError):
            await store.reserve("acme", LIMITS, 10)
        assert not store.ready
    assert await recovered(store)
    assert store.ready
    assert await store.aclose(5) == 0


#: a slot expires 2 s after its last renewal; renewals every 1.8 s (the next one
#: after the stall below comes 1.3 s after it ended)
_LEASE = {"lease_ttl_s": 2.0, "lease_renew_s": 1.8, "timeout_s": 0.1}
_TWO = TenantLimits(requests_per_minute=600, max_concurrent_requests=2)


async def test_after_a_stall_longer_than_the_lease_held_slots_come_back_before_new_admissions(
    own_redis: RedisServer,
) -> None:
    """Two requests hold the tenant's two slots; Redis stalls past their lease
    (a renewal fails meanwhile), so on the server they expired. The first
    reservation after the stall renews them before its own script: it is
    refused ``concurrency_limited`` instead of taking a third slot (the fleet
    ran 5 streams against a limit of 4 until the next renewal)."""
    recorder = Recorder()
    store = await make(own_redis, recorder, **_LEASE)
    running = [await store.reserve("acme", _TWO, 1) for _ in range(2)]
    with paused(own_redis, 2300) as until:
        assert await _eventually(lambda: "renew" in recorder.errors, 3)
        await asyncio.sleep(max(0.0, until - time.monotonic()) + 0.05)  # the stall's own end
    with pytest.raises(GatewayError) as info:
        await store.reserve("acme", _TWO, 1)
    assert info.value.code == "concurrency_limited"
    with own_redis.client() as client:
        [now_s, now_us] = client.time()
        scores = [
            s for _, s in client.zrange(tenant_keys("mrgw:", "acme").slots, 0, -1, withscores=True)
        ]
    assert len(scores) == 2 and all(s > now_s * 1000 + now_us / 1000 for s in scores)
    for hold in running:
        store.settle(hold, 1)
    assert await store.aclose(5) == 0


async def test_a_replica_reports_the_store_back_only_with_its_slots_renewed(
    own_redis: RedisServer,
) -> None:
    """Another replica's reservation after the stall: once this replica's probe
    saw Redis answer, its running requests hold their slots again, so the
    other replica is refused rather than admitted past the limit."""
    holder = await make(own_redis, Recorder(), probe_interval_s=0.02, **_LEASE)
    other = await make(own_redis, Recorder(), **_LEASE)
    running = [await holder.reserve("acme", _TWO, 1) for _ in range(2)]
    with paused(own_redis, 2300):
        assert await _eventually(lambda: not holder.healthy, 3)
    assert await _eventually(lambda: holder.healthy, 3)
    with pytest.raises(GatewayError) as info:
        await other.reserve("acme", _TWO, 1)
    assert info.value.code == "concurrency_limited"
    for hold in running:
        holder.settle(hold, 1)
    assert await holder.aclose(5) == 0
    assert await other.aclose(5) == 0
