"""The pool's semaphore answers ``locked()`` as asyncio's own does, in every state."""

from __future__ import annotations

import asyncio
import random

from gateway.upstream.wire import _Slots


async def test_locked_agrees_with_asyncio_through_acquires_releases_and_cancels() -> None:
    checked = 0
    for seed in range(100):
        rnd = random.Random(seed)
        theirs, ours = asyncio.Semaphore(2), _Slots(2)
        pending: list[tuple[asyncio.Future[bool], asyncio.Future[bool]]] = []
        for _ in range(30):
            op = rnd.choice("arc")
            if op == "a":
                pending.append(
                    (asyncio.ensure_future(theirs.acquire()), asyncio.ensure_future(ours.acquire()))
                )
            elif op == "r" and theirs._value < 2:
                theirs.release()
                ours.release()
            elif op == "c" and pending:
                for future in pending[rnd.randrange(len(pending))]:
                    future.cancel()
            await asyncio.sleep(0)
            assert ours.locked() == theirs.locked() == asyncio.Semaphore.locked(ours)
            checked += 1
        for pair in pending:
            for future in pair:
                future.cancel()
        await asyncio.gather(*(f for pair in pending for f in pair), return_exceptions=True)
    assert checked == 3000
