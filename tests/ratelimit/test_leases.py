"""SlotLeases: what one replica renews, in one batch per interval (no Redis)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest

from gateway.ratelimit.leases import SlotLeases
from tests.support.poll import eventually_async

Batch = list[tuple[str, list[str]]]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Renewals:
    """A ``renew`` that records its batches and fails while told to."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.failing = False

    async def __call__(self, batch: Batch) -> None:
        if self.failing:
            raise ConnectionError("store away")
        self.batches.append(batch)


def leases(
    renew: Renewals,
    clock: Callable[[], float] | None = None,
    *,
    interval_s: float = 3600,  # renewed by hand unless a test says otherwise
    on_failure: Callable[[BaseException], None] = lambda exc: None,
    on_success: Callable[[], None] = lambda: None,
) -> SlotLeases[str]:
    return SlotLeases(
        renew,
        interval_s=interval_s,
        lock=asyncio.Lock(),
        name="test-leases",
        on_failure=on_failure,
        on_success=on_success,
        clock=clock or Clock(),
    )


async def test_one_batch_names_every_slot_held_by_key() -> None:
    renew = Renewals()
    held = leases(renew)
    assert not await held.renew_now()  # nothing held: nothing sent
    for key, slot in [("a", "1"), ("a", "2"), ("b", "3")]:
        held.add(key, slot, 60)
    held.add("a", "1", 60)  # added twice: still one slot
    assert held.held == 3
    assert await held.renew_now()
    assert renew.batches == [[("a", ["1", "2"]), ("b", ["3"])]]
    held.discard("a", "1")
    held.discard("a", "1")  # settled twice: a no-op
    held.discard("c", "9")  # never held
    held.discard("b", "3")
    assert held.held == 1
    assert await held.renew_now()
    assert renew.batches[-1] == [("a", ["2"])]


async def test_a_slot_is_given_up_after_its_lifetime(caplog: pytest.LogCaptureFixture) -> None:
    renew, clock = Renewals(), Clock()
    held = leases(renew, clock)
    held.add("a", "short", 10)
    held.add("a", "long", 100)
    clock.now += 10
    assert await held.renew_now()
    assert renew.batches == [[("a", ["long"])]]
    assert held.held == 1
    assert "1 concurrency slots outlived" in caplog.text
    clock.now += 90
    assert not await held.renew_now()
    assert held.held == 0


async def test_the_task_renews_each_interval_and_survives_failures() -> None:
    renew = Renewals()
    failures: list[BaseException] = []
    successes: list[None] = []
    held = leases(
        renew,
        time.monotonic,  # the task sleeps on it
        interval_s=0.01,
        on_failure=failures.append,
        on_success=lambda: successes.append(None),
    )
    held.start()
    held.start()  # one task only
    try:
        await asyncio.sleep(0.05)  # (the absence of calls: nothing is held)
        assert renew.batches == [] and successes == []
        held.add("a", "1", 60)
        await eventually_async(lambda: len(renew.batches) >= 2, "two renewals")
        renew.failing = True
        await eventually_async(lambda: len(failures) >= 3, "three failures")
        assert all(isinstance(f, ConnectionError) for f in failures)
        renew.failing = False
        sent = len(renew.batches)
        await eventually_async(lambda: len(renew.batches) > sent, "renewing again")
        assert len(successes) == len(renew.batches)
        assert [t.get_name() for t in asyncio.all_tasks()].count("test-leases") == 1
    finally:
        await held.aclose()
    assert "test-leases" not in [t.get_name() for t in asyncio.all_tasks()]
    stopped = len(renew.batches)
    await asyncio.sleep(0.05)  # (the absence of calls after closing)
    assert len(renew.batches) == stopped


async def test_a_batch_is_taken_and_sent_under_the_lock() -> None:
    """The owner's settlements take the same lock: one that waits for it is
    applied after the renewal in flight, never before."""
    release = asyncio.Event()
    order: list[str] = []

    async def slow(batch: Batch) -> None:
        order.append("renewal sent")
        await release.wait()
        order.append("renewal done")

    lock = asyncio.Lock()
    held = SlotLeases(slow, interval_s=3600, lock=lock, name="test-leases")
    held.add("a", "1", 60)
    renewal = asyncio.create_task(held.renew_now())
    await eventually_async(lambda: order == ["renewal sent"], "the renewal in flight")

    async def settle() -> None:
        async with lock:
            order.append("settlement")

    settling = asyncio.create_task(settle())
    held.discard("a", "1")  # the request ended
    await asyncio.sleep(0.01)  # (the settlement must not get ahead)
    assert order == ["renewal sent"]
    release.set()
    await asyncio.wait_for(asyncio.gather(renewal, settling), 5)
    assert order == ["renewal sent", "renewal done", "settlement"]


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        leases(Renewals(), interval_s=0)


@pytest.fixture(autouse=True)
def _limits_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "gateway.limits")
