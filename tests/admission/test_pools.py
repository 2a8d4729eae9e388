"""Admission's asyncio pools: permits, waiters, timeouts, cancellation, groups."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from gateway.admission.pools import Admission, AdmissionGroup
from gateway.core.errors import GatewayError


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# -- the asyncio wrapper -----------------------------------------------------


async def test_acquire_and_release_track_units_and_notify() -> None:
    changes: list[tuple[int, int]] = []
    adm = Admission(4, 8, on_change=lambda used, depth: changes.append((used, depth)))
    permit = await adm.acquire("a", 3, share=1, max_permits=4, timeout_s=1)
    assert (permit.weight, adm.in_use, adm.held("a"), adm.queue_depth) == (3, 3, 3, 0)
    assert changes[-1] == (3, 0)
    permit.release()
    permit.release()
    assert permit.released
    assert adm.in_use == 0
    assert changes[-1] == (0, 0)


async def test_waiter_is_admitted_on_release_and_reports_wait() -> None:
    clock = FakeClock()
    adm = Admission(2, 8, clock=clock)
    first = await adm.acquire("a", 2, share=1, max_permits=2, timeout_s=60)
    waiter = asyncio.create_task(adm.acquire("b", 1, share=1, max_permits=2, timeout_s=60))
    await asyncio.sleep(0)
    assert adm.queue_depth == 1
    clock.advance(2.5)
    first.release()
    second = await waiter
    assert second.waited_s == pytest.approx(2.5)
    assert adm.in_use == 1
    second.release()


async def test_a_group_counts_max_permits_across_its_pools() -> None:
    changes: list[tuple[str, int, int]] = []
    group = AdmissionGroup(
        {"a": 2, "b": 2}, 8, on_change=lambda name, used, depth: changes.append((name, used, depth))
    )
    first = await group["a"].acquire("t", 1, share=1, max_permits=2, timeout_s=60)
    second = await group["a"].acquire("t", 1, share=1, max_permits=2, timeout_s=60)
    # Pool b has room, but the tenant holds its max_permits in pool a.
    waiter = asyncio.create_task(group["b"].acquire("t", 1, share=1, max_permits=2, timeout_s=60))
    await asyncio.sleep(0)
    assert group["b"].queue_depth == 1 and group["b"].in_use == 0
    assert group.held == {"t": 2}
    other = await group["b"].acquire("u", 2, share=1, max_permits=2, timeout_s=60)
    changes.clear()
    other.release()  # another tenant's release in b does not admit t
    assert group["b"].queue_depth == 1
    # ...and pool a, where u has nothing, is left alone.
    assert [name for name, _, _ in changes] == ["b"]
    changes.clear()
    first.release()  # t's units come back in a: its head in b goes
    third = await waiter
    assert group["b"].in_use == 1 and group.in_use == 2 and group.held["t"] == 2
    assert ("b", 1, 0) in changes
    for permit in (second, third):
        permit.release()
    assert group.in_use == 0 and group.held == {"t": 0, "u": 0}


async def test_timeout_is_429_with_retry_after() -> None:
    adm = Admission(1, 8)
    held = await adm.acquire("a", 1, share=1, max_permits=1, timeout_s=1)
    with pytest.raises(GatewayError) as info:
        await adm.acquire("b", 1, share=1, max_permits=1, timeout_s=0.01)
    assert info.value.code == "admission_timeout"
    assert info.value.status == 429
    assert int(info.value.headers["Retry-After"]) >= 1
    assert adm.queue_depth == 0
    held.release()
    assert adm.in_use == 0


async def test_timeout_follows_the_injected_clock() -> None:
    clock = FakeClock()
    adm = Admission(1, 8, clock=clock)
    held = await adm.acquire("a", 1, share=1, max_permits=1, timeout_s=1)
    waiter = asyncio.create_task(adm.acquire("b", 1, share=1, max_permits=1, timeout_s=0.005))
    await asyncio.sleep(0.02)
    # The loop timer has fired, but the injected clock says it is not due.
    assert not waiter.done()
    clock.advance(1)
    with pytest.raises(GatewayError, match="admission_timeout"):
        await waiter
    held.release()


async def test_queue_full_and_weight_exceeded_via_the_wrapper() -> None:
    adm = Admission(1, 1)
    held = await adm.acquire("a", 1, share=1, max_permits=1, timeout_s=1)
    waiter = asyncio.create_task(adm.acquire("a", 1, share=1, max_permits=1, timeout_s=5))
    await asyncio.sleep(0)
    assert adm.queue_depth == 1
    with pytest.raises(GatewayError) as full:
        await adm.acquire("b", 1, share=1, max_permits=1, timeout_s=5)
    assert full.value.code == "queue_full"
    assert int(full.value.headers["Retry-After"]) >= 1
    with pytest.raises(GatewayError) as heavy:
        await adm.acquire("b", 2, share=1, max_permits=1, timeout_s=5)
    assert heavy.value.status == 400
    held.release()
    (await waiter).release()
    assert adm.in_use == 0


async def test_weight_zero_needs_no_units() -> None:
    adm = Admission(1, 0)
    held = await adm.acquire("a", 1, share=1, max_permits=1, timeout_s=1)
    free = await adm.acquire("a", 0, share=1, max_permits=1, timeout_s=1)
    assert free.weight == 0
    assert adm.in_use == 1
    free.release()
    held.release()


async def test_cancelled_waiter_leaves_the_queue() -> None:
    adm = Admission(1, 1)
    held = await adm.acquire("a", 1, share=1, max_permits=1, timeout_s=1)
    waiter = asyncio.create_task(adm.acquire("b", 1, share=1, max_permits=1, timeout_s=5))
    await asyncio.sleep(0)
    assert adm.queue_depth == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert adm.queue_depth == 0
    # its place is free again
    other = asyncio.create_task(adm.acquire("c", 1, share=1, max_permits=1, timeout_s=5))
    await asyncio.sleep(0)
    held.release()
    (await other).release()
    assert adm.in_use == 0


async def test_grant_then_cancel_returns_the_units() -> None:
    adm = Admission(1, 4)
    held = await adm.acquire("a", 1, share=1, max_permits=1, timeout_s=1)
    waiter = asyncio.create_task(adm.acquire("b", 1, share=1, max_permits=1, timeout_s=5))
    await asyncio.sleep(0)
    held.release()  # grants the waiter; its task has not resumed yet
    assert adm.held("b") == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert adm.in_use == 0
    assert adm.held("b") == 0


async def test_cancel_then_grant_passes_the_units_on() -> None:
    adm = Admission(1, 4)
    held = await adm.acquire("a", 1, share=1, max_permits=1, timeout_s=1)
    doomed = asyncio.create_task(adm.acquire("b", 1, share=1, max_permits=1, timeout_s=5))
    await asyncio.sleep(0)
    later = asyncio.create_task(adm.acquire("c", 1, share=1, max_permits=1, timeout_s=5))
    await asyncio.sleep(0)
    assert adm.queue_depth == 2
    doomed.cancel()  # its future is cancelled, but the task has not run yet
    held.release()  # the grant finds a cancelled waiter and moves on
    with pytest.raises(asyncio.CancelledError):
        await doomed
    permit = await later
    assert adm.held("b") == 0
    assert adm.in_use == 1
    permit.release()
    assert adm.in_use == 0


async def test_fair_shares_through_the_wrapper() -> None:
    adm = Admission(2, 1000)
    order: list[str] = []

    async def one(tenant: str, share: float) -> None:
        permit = await adm.acquire(tenant, 1, share=share, max_permits=2, timeout_s=30)
        order.append(tenant)
        await asyncio.sleep(0)
        permit.release()

    tasks = [asyncio.create_task(one("x", 1)) for _ in range(40)]
    tasks += [asyncio.create_task(one("y", 3)) for _ in range(120)]
    await asyncio.gather(*tasks)
    first = Counter(order[:80])
    assert 0.9 * 20 <= first["x"] <= 1.1 * 20 + 2, first
    assert adm.in_use == 0
    assert adm.queue_depth == 0
