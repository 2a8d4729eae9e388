"""Admission overhead per request: one acquire plus one release, in µs.

Run: ``.venv/bin/python -m bench.bench_admission``

* ``uncontended``: nobody waits; acquire admits at once, release frees.
* ``N waiters``: the pool is full and N tasks wait (spread over a few
  tenants); each measured cycle releases one permit, which wakes the next
  waiter, and that waiter re-queues. The figure is wall time per
  acquire+release cycle, including the event-loop hand-off to the woken
  task, so it is an upper bound on the scheduler's own cost.
"""

from __future__ import annotations

import asyncio
import time

from gateway.admission import Admission

_TENANTS = ("t0", "t1", "t2", "t3")


async def _uncontended(cycles: int) -> float:
    admission = Admission(capacity=8, max_queue=64)
    start = time.perf_counter()
    for _ in range(cycles):
        permit = await admission.acquire("t0", 1, share=1, max_permits=8, timeout_s=30)
        permit.release()
    return (time.perf_counter() - start) / cycles * 1e6


async def _contended(waiters: int, cycles: int, tenants: int) -> float:
    capacity = 8
    admission = Admission(capacity=capacity, max_queue=waiters + capacity)
    names = [f"t{i}" for i in range(tenants)]
    done = 0
    finished = asyncio.Event()

    async def worker(tenant: str, share: float) -> None:
        nonlocal done
        while done < cycles:
            permit = await admission.acquire(
                tenant, 1, share=share, max_permits=capacity, timeout_s=300
            )
            # Hold across one loop turn, so the pool stays saturated.
            await asyncio.sleep(0)
            permit.release()
            done += 1
        finished.set()

    tasks = [
        asyncio.create_task(worker(names[i % tenants], 1 + i % 3))
        for i in range(waiters + capacity)
    ]
    await asyncio.sleep(0)
    start = time.perf_counter()
    await finished.wait()
    elapsed = time.perf_counter() - start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return elapsed / done * 1e6


async def _main() -> None:
    cycles = 20_000
    print(f"admission overhead per request (acquire + release), {cycles} cycles")
    print(f"  uncontended              {await _uncontended(cycles):8.2f} µs")
    for waiters, tenants in ((1, 1), (256, len(_TENANTS)), (256, 256)):
        figure = await _contended(waiters, cycles, tenants)
        print(f"  {waiters:3d} waiters, {tenants:3d} tenants  {figure:8.2f} µs")


if __name__ == "__main__":
    asyncio.run(_main())
