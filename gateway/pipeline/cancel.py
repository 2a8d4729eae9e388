"""Cancellation of one inference request, in one place.

Theory of operation:

- Each request runs inside one cancel scope (an ``asyncio.timeout(None)``,
  :meth:`Exchange.run`) from its body read on. Three things end it early:
  the caller going away (:func:`watch_disconnect` sees ``http.disconnect``),
  a drain past its grace (``Runtime.drain`` calls ``cancel(shutdown=True)``),
  and a caller that stopped reading (the relay's deadline cut a blocked send:
  :class:`CallerStalled`). Each is recorded on the :class:`Exchange`, so the
  outcome is decided from what happened, not from where an exception came out.
- Cancelling means moving the scope's deadline to "now": the request task is
  cancelled wherever it waits, and the scope's exit turns that into a
  ``TimeoutError`` the pipeline expects. A cancel that arrives after the scope
  exited does nothing.
- A caller that stopped reading cannot take a final message: past
  :data:`LAST_WORDS_S` its connection is reset (:meth:`Exchange.drop_connection`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.types import BodyWriter

#: how long a final message may wait for a caller that stopped reading
LAST_WORDS_S = 1.0


class CallerStalled(Exception):
    """The caller stopped reading: a send to it outlasted the idle (or total) deadline.

    The caller's transport buffer is full, so the relay stopped reading the
    worker (backpressure); the stream ends as a cancellation, not a worker
    timeout."""


@dataclass(eq=False)
class Exchange:
    """One in-flight inference request, as seen by drain and disconnect handling."""

    #: the listener's "drop this connection now" (gateway.http.protocol), if served by it
    abort: Callable[[], None] | None = None
    #: the listener's writer of this response's body frames (gateway.http.bodywriter), if any
    body_writer: BodyWriter | None = None
    #: the request's cancel scope (an asyncio timeout with no deadline until cancel)
    scope: asyncio.Timeout | None = None
    disconnected: bool = False
    #: the caller stopped reading its stream (cut by the idle/total deadline)
    stalled: bool = False
    shutdown: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def drop_connection(self) -> None:
        """For a caller that no longer reads: reset its connection."""
        if self.abort is not None:
            self.abort()

    def cancel(self, *, shutdown: bool = False) -> None:
        if shutdown:
            self.shutdown = True
        else:
            self.disconnected = True
        scope = self.scope
        if scope is not None and not scope.expired():
            # A deadline of "now" cancels the request task, which the scope's
            # exit turns into a TimeoutError the endpoint expects.
            scope.reschedule(asyncio.get_running_loop().time())

    def stall(self) -> None:
        self.stalled = True
        self.drop_connection()

    @property
    def canceled_by_caller(self) -> bool:
        return self.disconnected or self.stalled

    async def run(self, work: Callable[[], Awaitable[None]]) -> bool:
        """Run ``work`` in this request's cancel scope; False when a cancel ended it.

        A ``TimeoutError`` the scope did not cause (a bug) propagates."""
        try:
            async with asyncio.timeout(None) as scope:
                self.scope = scope
                try:
                    await work()
                finally:
                    self.scope = None  # no cancel can reach an exited scope
        except TimeoutError:
            if scope.expired():
                return False
            raise
        return True


async def watch_disconnect(receive: Callable[[], Awaitable[dict[str, Any]]], ex: Exchange) -> None:
    """Cancel the request when the caller goes away (runs beside the work)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            ex.cancel()
            return
