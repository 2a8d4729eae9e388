"""Approvals the gateway asks its callers for (spec §22 "Asking the caller"),
over any :class:`~gateway.books.protocols.ApprovalStore`.

Theory of operation:

- The replica holding an agentic stream :meth:`ApprovalBook.open`\\ s an
  approval under an id it made (``apr_`` and 128 random bits,
  ``new_approval_id``), bound to the tenant and the request, before it shows
  the caller the id, then :meth:`ApprovalBook.wait`\\ s
  for the decision, and :meth:`ApprovalBook.close`\\ s it when the stream is
  done with it (decided, timed out, or the stream ended): a decision after
  that is ``not_found``.
- A decision (``POST /v1/agent/approvals/{id}``) may arrive through any
  replica: :meth:`ApprovalBook.decide` writes it to the shared store, where
  one conditional update makes the first decision win and any later one
  ``already_resolved``.
- Two ways back to the waiting stream. Same replica: this book holds a small
  registry, approval id -> :class:`_Waiter` (an ``asyncio.Event`` and the
  decision), and a decision made here wakes its waiter at once, with no
  read. Another replica: while any approval here is pending, one poller task
  reads the decisions of all of them in one store call every
  :data:`POLL_S` (0.25 s), so a decision made elsewhere is seen well within
  the spec's 1 s. The poller runs only while something is registered and
  stops by itself after the last approval is closed or past its expiry.
- An approval's row expires ``ttl_s`` after it was opened (the worker gives
  up on an approval after 300 s): a stream that never closed its own (a
  crashed replica) leaves a row the periodic :meth:`ApprovalBook.sweep`
  deletes, and a registration the poller drops.
- Every store call is bounded by ``state.timeout_ms`` (``timeout_s``); a
  failing poll is retried at the next tick (logged once per episode), so a
  store outage is a wait that times out, never a stream that breaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gateway.books.protocols import DECISION_VALUES, ApprovalStore, Decision, Resolution
from gateway.config.agents import WORKER_APPROVAL_TIMEOUT_S
from gateway.core.errors import GatewayError

T = TypeVar("T")
log = logging.getLogger("gateway.approvals")

#: how often the decisions of this replica's pending approvals are read back
POLL_S = 0.25
#: an approval outlives the worker's own wait (300 s) by this much
TTL_MARGIN_S = 30.0
DEFAULT_TTL_S = WORKER_APPROVAL_TIMEOUT_S + TTL_MARGIN_S


@dataclass(eq=False)
class _Waiter:
    #: unix seconds: past it the registration is dropped (its stream is gone)
    expires: float
    event: asyncio.Event = field(default_factory=asyncio.Event)
    decision: Decision | None = None


class ApprovalBook:
    def __init__(
        self,
        store: ApprovalStore,
        *,
        timeout_s: float,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._timeout_s = timeout_s
        self._poll_s = poll_s
        self._clock = clock
        #: this replica's open approvals: what its streams wait on
        self._waiters: dict[str, _Waiter] = {}
        self._poller: asyncio.Task[None] | None = None
        self._closed = False
        #: the last poll failed (logged once per episode)
        self._failing = False
        #: store reads the poller made (tests count them)
        self.polls = 0

    @property
    def pending(self) -> int:
        """Approvals registered here (opened and not yet closed)."""
        return len(self._waiters)

    @property
    def polling(self) -> bool:
        """Whether the poller runs (only while approvals are registered)."""
        return self._poller is not None

    async def open(
        self, tenant: str, request_id: str, approval_id: str, *, ttl_s: float = DEFAULT_TTL_S
    ) -> None:
        """A new pending approval of the tenant's request, under the id the
        stream's replica made (``new_approval_id``); shown to the caller only
        once this returned."""
        if self._closed:
            raise GatewayError("state_unavailable")
        expires = self._clock() + ttl_s
        waiter = _Waiter(expires)
        # Registered first: a decision can only follow the row, and finds its waiter.
        if self._waiters.setdefault(approval_id, waiter) is not waiter:
            raise ValueError("an approval id is opened once")
        try:
            await self._bounded(self.store.open(tenant, request_id, approval_id, expires))
        except BaseException:
            del self._waiters[approval_id]
            raise

    async def decide(self, tenant: str, approval_id: str, decision: Decision) -> Resolution:
        """The caller's decision, through this replica; wakes a waiter here at once."""
        if decision not in DECISION_VALUES:
            raise ValueError("a decision is approve or deny")
        outcome = await self._bounded(
            self.store.decide(tenant, approval_id, decision, self._clock())
        )
        if outcome == "resolved":
            self._resolve(approval_id, decision)
        return outcome

    async def wait(self, approval_id: str, timeout_s: float) -> Decision | None:
        """The decision, as soon as it is made through any replica; None when
        ``timeout_s`` passed first (the stream decides what a timeout means)."""
        waiter = self._waiters.get(approval_id)
        if waiter is None:
            # Opened elsewhere (or never): watched until the wait gives up.
            waiter = self._waiters[approval_id] = _Waiter(self._clock() + max(timeout_s, 0.0))
        if waiter.decision is None:
            self._start_poller()
            try:
                async with asyncio.timeout(max(timeout_s, 0.0)):
                    await waiter.event.wait()
            except TimeoutError:
                return None
        return waiter.decision

    async def close(self, approval_id: str) -> None:
        """The stream is done with the approval: later decisions are not found.
        Never raises for the store: a row left behind expires by itself."""
        self._waiters.pop(approval_id, None)
        try:
            await self._bounded(self.store.close(approval_id))
        except GatewayError as exc:
            log.warning("approvals: closing one failed (%s); it expires by itself", exc.code)

    async def sweep(self) -> int:
        """Delete approvals past their expiry (a crashed replica's); how many."""
        return await self._bounded(self.store.sweep(self._clock()))

    async def aclose(self) -> None:
        """Stop polling; waits still pending time out as they would."""
        self._closed = True
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller

    # -- the two ways back ----------------------------------------------------

    def _resolve(self, approval_id: str, decision: Decision) -> None:
        waiter = self._waiters.get(approval_id)
        if waiter is not None and waiter.decision is None:
            waiter.decision = decision
            waiter.event.set()

    def _start_poller(self) -> None:
        if self._poller is None and not self._closed:
            self._poller = asyncio.create_task(self._poll(), name="approval-poll")

    async def _poll(self) -> None:
        try:
            # Bounded: every registration is closed by its stream or expires.
            while self._waiters:
                await asyncio.sleep(self._poll_s)
                now = self._clock()
                for gone in [i for i, w in self._waiters.items() if w.expires <= now]:
                    del self._waiters[gone]
                pending = [i for i, w in self._waiters.items() if w.decision is None]
                if not pending:
                    continue
                try:
                    found = await self._bounded(self.store.read_many(pending))
                except GatewayError as exc:
                    self._failed(exc)
                    continue
                self.polls += 1
                self._recovered()
                for approval_id, decision in found.items():
                    self._resolve(approval_id, decision)
        finally:
            if self._poller is asyncio.current_task():
                self._poller = None

    async def _bounded(self, work: Coroutine[Any, Any, T]) -> T:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await work
        except TimeoutError:
            raise GatewayError("state_unavailable") from None

    def _failed(self, exc: GatewayError) -> None:
        if not self._failing:
            log.error("approvals: reading decisions failed (%s); retrying", exc.code)
        self._failing = True

    def _recovered(self) -> None:
        if self._failing:
            log.info("approvals: decisions are read again")
        self._failing = False
