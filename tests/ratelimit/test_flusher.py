"""The settlement queue: bounded, retried with backoff, flushed and closed in bounded time."""

from __future__ import annotations

import asyncio

from gateway.ratelimit.flusher import Flusher


class Sink:
    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.batches: list[list[int]] = []
        self.attempts = 0
        self.block = asyncio.Event()
        self.block.set()

    async def apply(self, batch: list[int]) -> None:
        self.attempts += 1
        await self.block.wait()
        if self.failures:
            self.failures -= 1
            raise ConnectionError("down")
        self.batches.append(list(batch))


async def test_items_are_applied_in_order_in_batches() -> None:
    sink = Sink()
    flusher = Flusher(sink.apply, name="t", max_batch=3)
    flusher.start()
    for i in range(7):
        assert flusher.put(i)
    assert await flusher.flush(5)
    assert [i for batch in sink.batches for i in batch] == list(range(7))
    assert all(len(batch) <= 3 for batch in sink.batches)
    assert flusher.applied == 7 and flusher.pending == 0
    assert await flusher.aclose(1) == 0


async def test_failures_are_retried_with_backoff_and_reported() -> None:
    sink = Sink(failures=3)
    failures: list[BaseException] = []
    successes: list[None] = []
    flusher = Flusher(
        sink.apply,
        name="t",
        backoff_min_s=0.01,
        backoff_max_s=0.02,
        on_failure=failures.append,
        on_success=lambda: successes.append(None),
    )
    flusher.start()
    flusher.put(1)
    flusher.put(2)
    assert await flusher.flush(5)
    assert sink.batches == [[1, 2]]  # the failed batch went back whole, in order
    assert len(failures) == 3 and all(isinstance(f, ConnectionError) for f in failures)
    assert successes
    await flusher.aclose(1)


async def test_the_queue_is_bounded() -> None:
    sink = Sink()
    sink.block.clear()
    flusher = Flusher(sink.apply, name="t", max_pending=2, max_batch=1)
    assert flusher.put(1) and flusher.put(2)
    assert not flusher.put(3)
    flusher.start()
    sink.block.set()
    assert await flusher.flush(5)
    assert await flusher.aclose(1) == 0
    assert not flusher.put(4)  # closed


async def test_flush_and_close_are_bounded_while_failing() -> None:
    sink = Sink(failures=10**6)
    flusher = Flusher(sink.apply, name="t", backoff_min_s=0.01, backoff_max_s=0.02)
    flusher.start()
    flusher.put(1)
    assert not await flusher.flush(0.05)
    assert await flusher.aclose(0.1) == 1
    assert sink.attempts >= 2


async def test_close_counts_the_batch_in_flight() -> None:
    sink = Sink()
    sink.block.clear()  # apply never returns
    flusher = Flusher(sink.apply, name="t")
    flusher.start()
    flusher.put(1)
    flusher.put(2)
    for _ in range(100):  # until the task holds the batch (bounded)
        if sink.attempts:
            break
        await asyncio.sleep(0)
    assert sink.attempts == 1 and flusher.pending == 2
    assert await flusher.aclose(0.05) == 2
