"""The asyncio permit pools over the fair-queue core (spec §7, §16).

Theory of operation
-------------------

:class:`Admission` wraps :class:`~gateway.admission.core.FairQueueCore`
(``core``'s docstring is the scheduling policy) for asyncio: one future per
waiter, one loop timer per waiter as a wake-up for ``expire``, and the
cancellation rules below. :class:`AdmissionGroup` is one :class:`Admission`
per upstream with a tenant's ``max_permits`` counted across all of them.

Cancellation (:class:`Admission`): when a waiting task is cancelled (the
client went away) its ticket leaves the queue as soon as the task resumes,
and any units granted to it in the meantime go straight back to the pool,
so no grant is ever leaked. :meth:`Permit.release` is idempotent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gateway.admission.core import FairQueueCore, Ticket, TicketState
from gateway.core.errors import GatewayError

__all__ = [
    "Admission",
    "AdmissionGroup",
    "Permit",
]

# A loop timer may fire a hair before the clock passes the deadline; re-arm
# no sooner than this so an early wake-up cannot spin.
_MIN_REARM_S = 0.001


class Permit:
    """Units held by one admitted request; release exactly once, in a finally."""

    __slots__ = ("_admission", "_released", "_ticket")

    def __init__(self, admission: Admission, ticket: Ticket) -> None:
        self._admission = admission
        self._ticket = ticket
        self._released = False

    @property
    def weight(self) -> int:
        return self._ticket.weight

    @property
    def waited_s(self) -> float:
        return self._ticket.waited_s

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._admission._release(self._ticket)


class Admission:
    """The asyncio face of :class:`FairQueueCore`; see the module docstring."""

    def __init__(
        self,
        capacity: int,
        max_queue: int,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[int, int], None] | None = None,
        *,
        shared: dict[str, int] | None = None,
        on_release: Callable[[str], None] | None = None,
    ) -> None:
        self._core = FairQueueCore(capacity, max_queue, shared)
        self._clock = clock
        self._on_change = on_change
        self._on_release = on_release
        self._waiters: dict[Ticket, asyncio.Future[bool]] = {}
        self._timers: dict[Ticket, asyncio.TimerHandle] = {}

    @property
    def capacity(self) -> int:
        return self._core.capacity

    @property
    def in_use(self) -> int:
        return self._core.in_use

    @property
    def queue_depth(self) -> int:
        return self._core.queue_depth

    def held(self, tenant: str) -> int:
        return self._core.held(tenant)

    def try_acquire(
        self,
        tenant: str,
        weight: int,
        *,
        share: float,
        max_permits: int,
        timeout_s: float,
    ) -> Permit | None:
        """The permit at once when nothing waits and it fits, else None (and
        nothing changed): :meth:`acquire` it then. No future, no timer, no await."""
        ticket = self._ticket(tenant, weight, share, max_permits, timeout_s)
        return self._admitted(ticket) if self._core.admit_now(ticket) else None

    def _ticket(
        self, tenant: str, weight: int, share: float, max_permits: int, timeout_s: float
    ) -> Ticket:
        now = self._clock()
        return Ticket(tenant, weight, share, max_permits, now, now + timeout_s)

    def _admitted(self, ticket: Ticket) -> Permit:
        if self._on_change is not None:
            self._on_change(self._core.in_use, self._core.queue_depth)
        return Permit(self, ticket)

    async def acquire(
        self,
        tenant: str,
        weight: int,
        *,
        share: float,
        max_permits: int,
        timeout_s: float,
    ) -> Permit:
        ticket = self._ticket(tenant, weight, share, max_permits, timeout_s)
        if self._core.admit_now(ticket):
            return self._admitted(ticket)
        self._core.enqueue(ticket)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        self._waiters[ticket] = future
        try:
            self._dispatch()
            if not future.done():
                self._arm(ticket, timeout_s)
            admitted = await future
        except asyncio.CancelledError:
            self._abandon(ticket)
            raise
        finally:
            del self._waiters[ticket]
            timer = self._timers.pop(ticket, None)
            if timer is not None:
                timer.cancel()
        if not admitted:
            raise GatewayError(
                "admission_timeout",
                "The request waited too long for admission.",
                headers={"Retry-After": str(self._core.retry_after_s())},
            )
        return Permit(self, ticket)

    def _arm(self, ticket: Ticket, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self._timers[ticket] = loop.call_later(delay, self._on_timer, ticket)

    def _on_timer(self, ticket: Ticket) -> None:
        self._timers.pop(ticket, None)
        for expired in self._core.expire(self._clock()):
            future = self._waiters.get(expired)
            if future is not None and not future.done():
                future.set_result(False)
        if ticket.state is TicketState.WAITING:
            self._arm(ticket, max(ticket.deadline - self._clock(), _MIN_REARM_S))
        self._dispatch()

    def _abandon(self, ticket: Ticket) -> None:
        if ticket.state is TicketState.WAITING:
            self._core.cancel(ticket)
        elif ticket.state is TicketState.HELD:
            # Granted, but the task was cancelled before it could take the
            # permit: nobody else will ever release these units.
            self._give_back(ticket)
        self._dispatch()

    def _release(self, ticket: Ticket) -> None:
        self._give_back(ticket)
        self._dispatch()

    def _give_back(self, ticket: Ticket) -> None:
        self._core.release(ticket, self._clock())
        if self._on_release is not None and ticket.weight:
            self._on_release(ticket.tenant)

    def wake(self, tenant: str) -> None:
        """The tenant's units came back in a sharing pool: its heads here may go."""
        # Only that tenant's heads can be unblocked: a pool where it has none
        # is left alone (no dispatch, no gauge update on every release).
        if self._core.touch(tenant):
            self._dispatch()

    def _dispatch(self) -> None:
        while granted := self._core.grants(self._clock()):
            for ticket in granted:
                future = self._waiters.get(ticket)
                if future is None or future.done():
                    # Its task was cancelled while the grant was being made.
                    self._give_back(ticket)
                else:
                    future.set_result(True)
        if self._on_change is not None:
            self._on_change(self._core.in_use, self._core.queue_depth)


class AdmissionGroup:
    """One :class:`Admission` per upstream (its ``capacity``), a tenant's
    ``max_permits`` counted across all of them (spec §16).

    Fair queuing stays within each upstream. When a tenant's units come back
    in one pool, the others re-offer that tenant's waiting heads (they may
    have been capped by units held elsewhere)."""

    def __init__(
        self,
        capacities: dict[str, int],
        max_queue: int,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str, int, int], None] | None = None,
    ) -> None:
        self.held: dict[str, int] = {}
        self.pools: dict[str, Admission] = {}
        for name, capacity in capacities.items():
            report = None
            if on_change is not None:
                report = _reporter(on_change, name)
            self.pools[name] = Admission(
                capacity,
                max_queue,
                clock,
                report,
                shared=self.held,
                on_release=self._released_in(name),
            )

    def __getitem__(self, upstream: str) -> Admission:
        return self.pools[upstream]

    @property
    def in_use(self) -> int:
        return sum(pool.in_use for pool in self.pools.values())

    def _released_in(self, source: str) -> Callable[[str], None]:
        def released(tenant: str) -> None:
            for name, pool in self.pools.items():
                if name != source:
                    pool.wake(tenant)

        return released


def _reporter(on_change: Callable[[str, int, int], None], name: str) -> Callable[[int, int], None]:
    return lambda in_use, depth: on_change(name, in_use, depth)
