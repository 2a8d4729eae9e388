"""A bounded queue drained by one task: how settlements reach a remote store.

Theory of operation
-------------------

``put`` is synchronous and never waits (it is called from a request's one
``finally``): it appends to an in-memory queue of at most ``max_pending``
items and wakes the task. Woken from idle, the task lingers ``linger_s``
(so that the items of requests ending close together share one batch and
one write), then takes up to ``max_batch`` items at a time and awaits
``apply(batch)`` (the Redis store pipelines one script call
per item). When ``apply`` raises, the batch goes back to the front of the
queue and the task retries after a backoff that doubles from
``backoff_min_s`` up to ``backoff_max_s``; ``on_failure`` / ``on_success``
let the owner log once per episode and count errors. So ``apply`` must be
safe to repeat: a batch that failed midway may have been applied in part.

A full queue refuses the new item (``put`` returns False): the owner counts
it; for settlements that means the reservation stays charged and the slot
lasts until its lease, the conservative direction.

``flush(timeout_s)`` waits until everything queued so far is applied.
``aclose(timeout_s)`` keeps applying until the queue is empty or the time is
up, then stops the task and returns how many items it could not apply (the
batch in flight counts as not applied).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["Flusher"]


class Flusher(Generic[T]):
    def __init__(
        self,
        apply: Callable[[list[T]], Awaitable[None]],
        *,
        name: str,
        max_pending: int = 100_000,
        max_batch: int = 256,
        backoff_min_s: float = 0.05,
        backoff_max_s: float = 2.0,
        linger_s: float = 0.0,
        on_failure: Callable[[BaseException], None] = lambda exc: None,
        on_success: Callable[[], None] = lambda: None,
    ) -> None:
        self._apply = apply
        self._name = name
        self._max_pending = max_pending
        self._max_batch = max_batch
        self._backoff_min_s = backoff_min_s
        self._backoff_max_s = backoff_max_s
        self._linger_s = linger_s
        self._on_failure = on_failure
        self._on_success = on_success
        self._pending: deque[T] = deque()
        self._inflight = 0
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self.applied = 0

    @property
    def pending(self) -> int:
        """Items not yet applied (queued or in flight)."""
        return len(self._pending) + self._inflight

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self._name)

    def put(self, item: T) -> bool:
        """Queue one item; never waits. False when the queue is full or closed."""
        if self._closing or len(self._pending) >= self._max_pending:
            return False
        self._pending.append(item)
        self._idle.clear()
        self._wakeup.set()
        return True

    async def flush(self, timeout_s: float) -> bool:
        """True once everything queued so far is applied; False after ``timeout_s``."""
        if self._task is None:
            return not self._pending
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def aclose(self, timeout_s: float) -> int:
        self._closing = True
        task, self._task = self._task, None
        if task is None:
            return self.pending
        self._wakeup.set()
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return self.pending

    async def _run(self) -> None:
        backoff = self._backoff_min_s
        while True:
            if not self._pending:
                self._idle.set()
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                if self._linger_s and not self._closing:
                    await asyncio.sleep(self._linger_s)
                continue
            count = min(self._max_batch, len(self._pending))
            batch = [self._pending.popleft() for _ in range(count)]
            self._inflight = count
            try:
                await self._apply(batch)
            except Exception as exc:
                self._pending.extendleft(reversed(batch))
                self._inflight = 0
                self._on_failure(exc)
                await asyncio.sleep(backoff)
                backoff = min(self._backoff_max_s, backoff * 2)
                continue
            self._inflight = 0
            self.applied += count
            backoff = self._backoff_min_s
            self._on_success()
