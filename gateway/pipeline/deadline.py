"""A movable deadline for the stream pump, cheap to move on every event.

``asyncio.timeout_at(...).reschedule()`` cancels a timer handle and makes a
new one each time; done per SSE event it showed in the stream profile. Here
:meth:`Deadline.move_to` only stores a float. The one timer, when it fires,
compares the clock with the stored deadline and either re-arms itself for
the remainder or cancels the task, so a deadline can move thousands of times
while at most one timer exists.

Semantics follow ``asyncio.timeout_at``: on expiry the task is cancelled and
the ``async with`` block raises :class:`TimeoutError`; a cancellation from
anywhere else passes through unchanged (``Task.uncancel`` bookkeeping as in
the standard library).
"""

from __future__ import annotations

import asyncio
from types import TracebackType

#: a timer may fire this much before its time (loop clock resolution)
_EARLY_S = 0.001


class Deadline:
    __slots__ = ("_armed_at", "_cancelling", "_expired", "_handle", "_loop", "_task", "_when")

    def __init__(self, when: float, *, first_check: float | None = None) -> None:
        """``first_check``: when the one timer first looks (at most ``when``). A
        deadline that will soon move later -- the first-event deadline, which
        becomes the shorter idle one -- checks first at the later value, so the
        move is a float store, not a second timer."""
        self._when = when
        self._armed_at = when if first_check is None else min(first_check, when)
        self._expired = False
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0

    def expired(self) -> bool:
        return self._expired

    def move_to(self, when: float) -> None:
        """Set the deadline (loop time); later is a float store, earlier re-arms."""
        self._when = when
        if when < self._armed_at and self._loop is not None and not self._expired:
            self._arm(when)

    async def __aenter__(self) -> Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadline must be used inside a task")
        self._loop = asyncio.get_running_loop()
        self._task = task
        self._cancelling = task.cancelling()
        self._arm(self._armed_at)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        task, self._task, self._loop = self._task, None, None  # moves after exit do nothing
        # As asyncio.Timeout: our own cancel is always taken back; only when it
        # was the only one does the block's CancelledError become a TimeoutError.
        if (
            self._expired
            and task is not None
            and task.uncancel() <= self._cancelling  # evaluated whenever we expired
            and exc_type is asyncio.CancelledError
        ):
            raise TimeoutError from exc

    def _arm(self, at: float) -> None:
        assert self._loop is not None
        if self._handle is not None:
            self._handle.cancel()
        self._armed_at = at
        self._handle = self._loop.call_at(at, self._fire)

    def _fire(self) -> None:
        assert self._loop is not None and self._task is not None
        self._handle = None
        if self._loop.time() + _EARLY_S < self._when:
            self._arm(self._when)  # moved later since armed: wait for the rest
            return
        self._expired = True
        self._task.cancel()
