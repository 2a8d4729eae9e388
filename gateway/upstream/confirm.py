"""Canceled requests keep their permits until the worker confirms (spec §20).

Closing the connection asks the worker to stop; it does not prove it did:
mistral.rs notices a dropped stream only at its next token send, and a
queued or prefilling sequence keeps the worker busy until then (reference
§12). Freeing the permits at the close would admit the next request exactly
when the worker is slowest.

Theory of operation, one :class:`CancelConfirmer` per worker:

- :meth:`CancelConfirmer.hold` takes a canceled request's release (its
  permits, its receipt) and starts the poll if it is not running. The poll
  reads the worker's metrics 100 ms apart, bounded in bytes and time, and
  only while something is held: an idle gateway never polls.
- Each rise of ``mistralrs_sequences_completed_total{reason="canceled"}``
  past the value seen when a request was canceled confirms one held request,
  oldest first. ``running + waiting`` at most the gateway's live requests on
  that worker confirms every held one (the worker runs nothing of theirs).
- An answer the gateway cannot read (too slow, too big, unreachable) confirms
  nothing; a hold lasts at most ``timeout_s`` (``confirm_timeout``, counted).
- A worker without those metrics (404, 503, ``http_*`` only) cannot confirm:
  its held requests go at once (``unconfirmable``), logged once per worker
  until its metrics appear. Nor can a worker whose address refuses the
  connection: its process is gone and with it what it ran (``unconfirmable``
  too; readiness reports the outage).
- Every release runs exactly once, whatever ends the hold (:meth:`release_all`
  at shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from gateway.core.engine_metrics import EngineCounts, parse
from gateway.upstream.client import MetricsUnreadable, WorkerGone

log = logging.getLogger("gateway.cancel")

State = Literal["worker_confirmed", "confirm_timeout", "unconfirmable"]
Release = Callable[[State], None]
Fetch = Callable[[], Awaitable[tuple[int, bytes]]]

#: the spec's poll interval
POLL_S = 0.1
#: a real exposition is tens of KiB; past this the answer is unreadable
MAX_METRICS_BYTES = 1 << 20


@dataclass(eq=False, slots=True)
class _Held:
    at: float
    release: Release
    #: the canceled count seen when the request was canceled (None: not yet polled)
    baseline: float | None


class CancelConfirmer:
    def __init__(
        self,
        name: str,
        fetch: Fetch,
        *,
        timeout_s: float,
        live: Callable[[], int],
        on_confirmed: Callable[[float], None] | None = None,
        on_unconfirmed: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._fetch = fetch
        self._timeout_s = timeout_s
        self._live = live
        self._on_confirmed = on_confirmed
        self._on_unconfirmed = on_unconfirmed
        self._clock = clock
        self._held: deque[_Held] = deque()
        self._task: asyncio.Task[None] | None = None
        #: the canceled count of the last readable poll while polling
        self._last: float | None = None
        self._warned = False
        #: metrics reads so far (tests: none while nothing is held)
        self.polls = 0

    @property
    def held(self) -> int:
        return len(self._held)

    def hold(self, release: Release) -> None:
        polling = self._task is not None
        self._held.append(_Held(self._clock(), release, self._last if polling else None))
        if not polling:
            self._last = None
            self._task = asyncio.get_running_loop().create_task(self._run())

    def release_all(self, state: State = "confirm_timeout") -> None:
        """Give back everything held now (shutdown)."""
        while self._held:
            self._end(self._held.popleft(), state)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    async def aclose(self) -> None:
        task = self._task
        self.release_all()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        try:
            while self._held:
                await self._poll()
                if not self._held:
                    break
                await asyncio.sleep(POLL_S)
        finally:
            # Only this poll's own slot: release_all may have handed it to a new one.
            if self._task is asyncio.current_task():
                self._task = None

    async def _poll(self) -> None:
        self.polls += 1
        try:
            status, body = await self._fetch()
        except WorkerGone:
            while self._held:
                self._end(self._held.popleft(), "unconfirmable")
            return
        except MetricsUnreadable:
            self._expire()
            return
        counts = parse(body) if status == 200 else None
        if counts is None:
            if status in (200, 404, 503):
                self._cannot_confirm(status)
            else:
                self._expire()
            return
        if self._warned:
            log.info("cancel confirmation: upstream %s exports its sequence metrics", self.name)
            self._warned = False
        self._confirm(counts)
        self._expire()

    def _confirm(self, counts: EngineCounts) -> None:
        if self._last is not None and counts.canceled > self._last:
            rises = int(min(counts.canceled - self._last, len(self._held)))
            for held in [h for h in self._held if h.baseline is not None][:rises]:
                self._held.remove(held)
                self._end(held, "worker_confirmed")
        self._last = counts.canceled
        for held in self._held:
            if held.baseline is None:
                held.baseline = counts.canceled
        if self._held and counts.running + counts.waiting <= self._live():
            while self._held:
                self._end(self._held.popleft(), "worker_confirmed")

    def _cannot_confirm(self, status: int) -> None:
        if not self._warned:
            why = "no sequence metrics" if status == 200 else f"metrics answer {status}"
            log.warning(
                "cancel confirmation: upstream %s cannot confirm (%s); permits of canceled "
                "requests go back when their connection closes",
                self.name,
                why,
            )
            self._warned = True
        while self._held:
            self._end(self._held.popleft(), "unconfirmable")

    def _expire(self) -> None:
        now = self._clock()
        while self._held and now - self._held[0].at >= self._timeout_s:
            self._end(self._held.popleft(), "confirm_timeout")

    def _end(self, held: _Held, state: State) -> None:
        if state == "worker_confirmed" and self._on_confirmed is not None:
            self._on_confirmed(self._clock() - held.at)
        elif state == "confirm_timeout" and self._on_unconfirmed is not None:
            self._on_unconfirmed()
        held.release(state)
