"""The concurrency slots one replica holds, renewed together (spec §15).

Theory of operation
-------------------

In a shared store a concurrency slot is a lease: it expires ``ttl`` after
its last renewal, so the slots of a replica that dies (SIGKILL, OOM, node
loss) are free within ``ttl`` however long its requests were allowed to
run. A live replica keeps its slots by renewing them.

:class:`SlotLeases` is the replica's list of what to renew. ``add`` (after a
reservation took a slot) and ``discard`` (when the hold is settled) are
synchronous and O(1): a dict per key (one per tenant) of slot id -> the
moment renewal gives up on it. One task wakes every ``interval_s`` (on a
fixed schedule: a slow call does not push the next one back; a stalled loop
renews once, not once per interval missed), takes every slot still held as
one batch ``[(key, [slot ids])]`` and awaits ``renew(batch)``, which the
owner sends as one round trip. A failure is handed to ``on_failure`` (the
owner counts and logs it) and the task goes on: the next interval tries
again with whatever is held then.

**Order against settlements.** The owner applies its settlements under the
same ``lock`` the batch is taken and sent under. A hold is discarded when
it is settled, before its settlement is queued, so a batch that still names
a slot was taken before that settlement and is applied before it: a renewal
never brings back a slot its own settlement freed. (A renewal whose answer
was lost may still reach the server after it; that slot then lasts one
``ttl`` too long, the conservative direction.)

**Giving up.** Each slot is renewed until its ``lifetime_s`` (given to
``add``: the longest its request can run) has passed; then it is dropped
and logged. A hold that is never settled (a bug) thus cannot keep its
tenant's slot forever, as it could not before leases were renewed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["SlotLeases"]

K = TypeVar("K", bound=Hashable)

log = logging.getLogger("gateway.limits")


class SlotLeases(Generic[K]):
    def __init__(
        self,
        renew: Callable[[list[tuple[K, list[str]]]], Awaitable[None]],
        *,
        interval_s: float,
        lock: asyncio.Lock,
        name: str,
        on_failure: Callable[[BaseException], None] = lambda exc: None,
        on_success: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self._renew = renew
        self._interval_s = interval_s
        self._lock = lock
        self._name = name
        self._on_failure = on_failure
        self._on_success = on_success
        self._clock = clock
        #: key -> slot id -> when renewal gives up on it (``clock``)
        self._held: dict[K, dict[str, float]] = {}
        self._count = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def held(self) -> int:
        """Slots being renewed."""
        return self._count

    def add(self, key: K, slot: str, lifetime_s: float) -> None:
        slots = self._held.setdefault(key, {})
        if slot not in slots:
            self._count += 1
        slots[slot] = self._clock() + lifetime_s

    def discard(self, key: K, slot: str) -> None:
        slots = self._held.get(key)
        if slots is None or slots.pop(slot, None) is None:
            return
        self._count -= 1
        if not slots:
            del self._held[key]

    def _due(self) -> list[tuple[K, list[str]]]:
        """Every slot to renew now; those past their lifetime are dropped."""
        now = self._clock()
        batch: list[tuple[K, list[str]]] = []
        abandoned = 0
        for key, slots in list(self._held.items()):
            expired = [slot for slot, give_up_at in slots.items() if give_up_at <= now]
            for slot in expired:
                self.discard(key, slot)
            abandoned += len(expired)
            if slots:
                batch.append((key, list(slots)))
        if abandoned:
            log.warning(
                "%d concurrency slots outlived the longest a request may run and are no "
                "longer renewed (holds never settled)",
                abandoned,
            )
        return batch

    async def renew_now(self) -> bool:
        """Send one batch with every slot held; False when none is (nothing sent).
        Raises what ``renew`` raises."""
        async with self._lock:
            batch = self._due()
            if not batch:
                return False
            await self._renew(batch)
            return True

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self._name)

    async def aclose(self) -> None:
        """Stop renewing (the slots held then expire with their leases)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        next_at = self._clock()
        while True:
            next_at += self._interval_s
            await asyncio.sleep(max(0.0, next_at - self._clock()))
            next_at = max(next_at, self._clock())
            try:
                sent = await self.renew_now()
            except Exception as exc:  # a failure or a bug must not stop renewal
                self._on_failure(exc)
                continue
            if sent:  # (nothing sent says nothing about the store)
                self._on_success()
