"""Fixtures for the limits stores (the redis-server fixtures are in tests/conftest.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gateway.ratelimit import Hold, LimitsStore, MemoryLimitsStore, RedisLimitsStore
from gateway.ratelimit.core import seconds_until_midnight

StoreFactory = Callable[..., Awaitable[RedisLimitsStore]]


def pytest_configure(config: pytest.Config) -> None:
    # The property test runs in every suite and is scaled by `make fuzz` (tests/fuzz).
    config.addinivalue_line(
        "markers", "fuzz: hypothesis fuzzing; GATEWAY_FUZZ=long (make fuzz) scales the budget"
    )


class Recorder:
    """StoreMetrics that remembers what it was told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []
        self.errors: list[str] = []

    def limits_store_call(self, op: str, seconds: float) -> None:
        self.calls.append((op, seconds))

    def limits_store_error(self, op: str) -> None:
        self.errors.append(op)


@pytest.fixture
async def redis_stores(redis_url: str) -> AsyncIterator[StoreFactory]:
    """Make Redis stores ("replicas", each on its own pool); all closed at the end."""
    made: list[RedisLimitsStore] = []

    async def make(**kwargs: Any) -> RedisLimitsStore:
        kwargs.setdefault("timeout_s", 2.0)
        url = kwargs.pop("url", redis_url)
        store = RedisLimitsStore.from_url(url, **kwargs)
        await store.start()
        made.append(store)
        return store

    yield make
    for store in made:
        await store.aclose(2.0)


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[LimitsStore]:
    """Each test with this fixture runs once per backend."""
    made: LimitsStore
    if request.param == "memory":
        made = MemoryLimitsStore()
    else:
        made = RedisLimitsStore.from_url(redis_url, timeout_s=2.0)
    await made.start()
    yield made
    assert await made.aclose(2.0) == 0


async def settled(store: LimitsStore, hold: Hold, used: int) -> None:
    """Settle and wait until the store has applied it."""
    store.settle(hold, used)
    assert await store.flush(5.0)


def away_from_midnight(margin_s: float = 5.0) -> None:
    """Tests that count a UTC day must not straddle midnight: wait it out (bounded)."""
    left = seconds_until_midnight(time.time())
    if left < margin_s:
        time.sleep(left + 0.5)


async def gather_bounded(coros: list[Awaitable[Any]], timeout_s: float = 20.0) -> list[Any]:
    async with asyncio.timeout(timeout_s):
        return list(await asyncio.gather(*coros, return_exceptions=True))
