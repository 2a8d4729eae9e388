"""Limits-store latency per reserve, memory vs Redis, at concurrency 1.

Run: ``.venv/bin/python -m bench.bench_limits [--url redis://127.0.0.1:6379/0] [-n 5000]``

Without ``--url`` a throwaway ``redis-server`` is started on loopback (no
persistence) and stopped afterwards. Each cycle is one ``reserve`` (all four
limits set, never refused) timed by itself, then ``settle`` (synchronous; the
Redis store's flusher pipelines it in the background, so the reserve figures
include sharing the server with that traffic, as in the gateway). Prints
p50/p99/max of the store's own reserve time in µs, and how long the Redis
store then took to flush what was still queued.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import Iterator

from gateway.ratelimit import LimitsStore, MemoryLimitsStore, RedisLimitsStore, TenantLimits
from gateway.testing.simulator.server import loop_factory

LIMITS = TenantLimits(10**9, 10**12, 10**12, 10**6)


def _quantile(sorted_us: list[float], q: float) -> float:
    return sorted_us[min(len(sorted_us) - 1, int(q * len(sorted_us)))]


async def reserve_timings(store: LimitsStore, n: int, limits: TenantLimits = LIMITS) -> list[float]:
    """``n`` reserve latencies in µs, sorted (each settled after it was timed)."""
    await store.start()
    timings: list[float] = []
    for i in range(n + n // 10):
        started = time.perf_counter()
        hold = await store.reserve("bench", limits, 600)
        elapsed = time.perf_counter() - started
        store.settle(hold, 350)
        if i >= n // 10:  # the first tenth warms up connections and caches
            timings.append(elapsed * 1e6)
    return sorted(timings)


def _report(name: str, timings: list[float]) -> None:
    print(
        f"{name:>6}: reserve p50 {statistics.median(timings):8.1f} µs"
        f"  p99 {_quantile(timings, 0.99):8.1f} µs  max {timings[-1]:8.1f} µs  (n={len(timings)})"
    )


@contextlib.contextmanager
def _redis(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    from tests.support.redis import redis_server  # test equipment, only when needed

    with redis_server() as server:
        yield server.url


async def main(url: str, n: int) -> None:
    _report("memory", await reserve_timings(MemoryLimitsStore(), n))
    store = RedisLimitsStore.from_url(url, timeout_s=1.0, key_prefix="bench:")
    timings = await reserve_timings(store, n)
    started = time.perf_counter()
    flushed = await store.flush(30)
    drain = time.perf_counter() - started
    await store.aclose(5)
    _report("redis", timings)
    print(f"redis settlements: flushed={flushed} in {drain * 1000:.1f} ms after the last reserve")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=None, help="an existing Redis (default: start one)")
    parser.add_argument("-n", type=int, default=5000, help="measured reserves per store")
    args = parser.parse_args()
    # uvloop where available, as the gateway serves
    with _redis(args.url) as redis_url, asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(main(redis_url, args.n))
