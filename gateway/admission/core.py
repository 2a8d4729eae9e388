"""The pure fair-queue core of admission: weights, tickets, the scheduler (spec §7).

Theory of operation
-------------------

A pool of ``capacity`` permit units stands for the worker's sequence slots.
A request needs ``weight`` units (:func:`request_weight`); it holds them
from admission until its stream ends, and a tenant never holds more than its
``max_permits`` units at once.

:class:`FairQueueCore` is the whole policy, pure and synchronous: it takes
explicit ``now`` values and owns no clock, timer or event loop, so a test can
drive it step by step. Mutations (``enqueue``, ``release``, ``cancel``,
``expire``) only change state; ``grants(now)`` runs the scheduler and
returns the tickets it admitted. ``pools`` wraps it for asyncio.

Scheduling is start-time fair queuing (virtual-time WFQ):

* Each tenant keeps a FIFO of waiting tickets and a virtual *finish* tag.
  A head's virtual *start* is ``max(V, finish)`` as of the moment it
  becomes the head (or eligible), where ``V`` is the start of the last
  admitted ticket. Admitting a head of weight ``w`` sets
  ``V = start`` and the tenant's ``finish = start + w / share``. So a
  backlogged tenant's tags advance by ``w / share`` per admission and, while
  units are contended, tenants receive units in proportion to ``share``.
  A tenant returning from idle starts at ``V``: it neither banks credit
  while idle nor pays for the past.
* Among tenants whose head fits under their own ``max_permits``, the head
  with the smallest ``(start, arrival)`` has the turn. A tenant at its own
  cap is skipped: it waits on its own releases, not on the pool, and it
  does not bank credit while capped (its start is clamped to ``V``).
* **Reservation.** If the head with the turn needs more units than are
  free, nobody else is admitted until enough units return. Without this, a
  weight-3 head could be starved forever by a stream of weight-1 requests
  that each fit into the one or two free units. The cost is some idle
  capacity while units accumulate; it is bounded by one request's weight.
* No starvation: a waiting head's start tag is fixed while others' tags
  grow with every admission, so it gets the turn after finitely many
  admissions, and with the turn it is reserved for until it fits (a weight
  above ``capacity`` or ``max_permits`` is refused at the door).
* A weight-0 request (``cost.base == 0``, no media) is admitted at once and
  takes no units.
* ``share`` and ``max_permits`` are read from each ticket, not cached per
  tenant, so a policy reload applies to the requests that arrive after it.

The queue holds at most ``max_queue`` waiters: a request that would have to
wait when that many are already waiting is refused (429 ``queue_full``); a
request that is admissible at once is never refused for a full queue.
Tenants' heads wait in a heap keyed by ``(start, arrival)``, so choosing the
next head is O(log tenants). Cancelled tickets are dropped lazily from their
tenant's FIFO and stale heap entries are skipped when they surface, so
removal is O(1).

``Retry-After`` on 429s is an estimate of how long the current backlog takes
to drain: ``(units in use + units queued) x mean hold time / capacity``,
with the mean hold time an exponentially weighted average of released
permits; at least 1 s, at most 60 s (a hint, not a promise; one slow stream
should not send clients away for minutes), and 1 s before any permit has
been released.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.config.policy import MEDIA_MODALITIES, Cost
from gateway.core.errors import GatewayError

__all__ = [
    "FairQueueCore",
    "Ticket",
    "TicketState",
    "request_weight",
]

_MAX_RETRY_AFTER_S = 60
_HOLD_EWMA_ALPHA = 0.2


def request_weight(cost: Cost, media_modalities: Iterable[str]) -> int:
    """``cost.base`` plus the cost of each media part, by its modality."""
    weight = cost.base
    for modality in media_modalities:
        if modality not in MEDIA_MODALITIES:
            raise ValueError(f"not a media modality: {modality!r}")
        weight += getattr(cost, modality)
    return int(weight)


class TicketState(enum.Enum):
    WAITING = "waiting"
    HELD = "held"
    RELEASED = "released"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


@dataclass(eq=False, slots=True)
class Ticket:
    """One request's claim on the pool; compared and hashed by identity."""

    tenant: str
    weight: int
    share: float
    max_permits: int
    enqueued_at: float
    deadline: float
    seq: int = field(default=-1, init=False)
    state: TicketState = field(default=TicketState.WAITING, init=False)
    granted_at: float | None = field(default=None, init=False)

    @property
    def waited_s(self) -> float:
        return 0.0 if self.granted_at is None else self.granted_at - self.enqueued_at


@dataclass(slots=True)
class _TenantQueue:
    fifo: deque[Ticket] = field(default_factory=deque)
    finish: float = 0.0
    held: int = 0
    #: seq of the head this tenant has an entry for in the turn heap, or -1
    offered: int = -1

    def head(self) -> Ticket | None:
        fifo = self.fifo
        while fifo and fifo[0].state is not TicketState.WAITING:
            fifo.popleft()
        return fifo[0] if fifo else None


class FairQueueCore:
    """The pure scheduler; see the module docstring."""

    def __init__(self, capacity: int, max_queue: int, shared: dict[str, int] | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if max_queue < 0:
            raise ValueError("max_queue must not be negative")
        self.capacity = capacity
        self.max_queue = max_queue
        #: units each tenant holds in every pool sharing this dict (its max_permits
        #: counts across them); None: this pool alone
        self._shared = shared
        self._in_use = 0
        self._queued_units = 0
        self._vtime = 0.0
        self._seq = 0
        self._tenants: dict[str, _TenantQueue] = {}
        # (start tag, head seq, tenant) per tenant whose head may take a turn;
        # entries go stale when their head leaves and are skipped when popped.
        self._turns: list[tuple[float, int, str]] = []
        # tenants whose head may have changed or become eligible since the
        # last schedule; offered to the heap then, so offers are not repeated
        self._dirty: set[str] = set()
        # insertion-ordered set of waiting tickets, for depth and expiry scans
        self._waiting: dict[Ticket, None] = {}
        self._granted: list[Ticket] = []
        self._mean_hold_s: float | None = None

    # -- observation -------------------------------------------------------

    @property
    def in_use(self) -> int:
        return self._in_use

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    def held(self, tenant: str) -> int:
        queue = self._tenants.get(tenant)
        return 0 if queue is None else queue.held

    def _held_everywhere(self, tenant: str, queue: _TenantQueue) -> int:
        """What counts against the tenant's max_permits: this pool's units, or
        every sharing pool's."""
        return queue.held if self._shared is None else self._shared.get(tenant, 0)

    def touch(self, tenant: str) -> bool:
        """Another sharing pool released the tenant's units: its capped head may go.
        False when the tenant has nothing here (nothing here can change)."""
        if tenant not in self._tenants:
            return False
        self._dirty.add(tenant)
        return True

    def retry_after_s(self) -> int:
        if self._mean_hold_s is None:
            return 1
        backlog = self._in_use + self._queued_units
        estimate = math.ceil(backlog * self._mean_hold_s / self.capacity)
        return min(_MAX_RETRY_AFTER_S, max(1, estimate))

    # -- mutations ---------------------------------------------------------

    def admit_now(self, ticket: Ticket) -> bool:
        """Grant ``ticket`` at once when nothing waits in this pool and it fits
        (free units, the tenant's cap): the state :meth:`enqueue` and
        :meth:`grants` would leave, without the queue, the heap and the grant
        list (the common case of an unloaded worker). False, and no change, when
        it would have to wait: :meth:`enqueue` it then."""
        self._check(ticket)
        weight = ticket.weight
        if weight == 0:
            self._stamp(ticket)
            ticket.state = TicketState.HELD
            ticket.granted_at = ticket.enqueued_at
            return True
        if self._waiting or weight > self.capacity - self._in_use:
            return False
        tenant = ticket.tenant
        queue = self._tenants.get(tenant)
        if queue is None:
            queue = self._tenants[tenant] = _TenantQueue()
        if self._held_everywhere(tenant, queue) + weight > ticket.max_permits:
            return False
        self._stamp(ticket)
        # As the scheduler admits a head: its start is max(V, finish).
        start = max(self._vtime, queue.finish)
        self._vtime = start
        queue.finish = start + weight / ticket.share
        ticket.state = TicketState.HELD
        ticket.granted_at = ticket.enqueued_at
        queue.held += weight
        if self._shared is not None:
            self._shared[tenant] = self._shared.get(tenant, 0) + weight
        self._in_use += weight
        return True

    def _check(self, ticket: Ticket) -> None:
        if ticket.state is not TicketState.WAITING or ticket.seq >= 0:
            raise ValueError("ticket was already enqueued")
        if ticket.weight < 0 or ticket.share <= 0 or ticket.max_permits < 1:
            raise ValueError("weight must be >= 0, share > 0 and max_permits >= 1")
        if ticket.weight > ticket.max_permits or ticket.weight > self.capacity:
            raise GatewayError(
                "admission_weight_exceeded",
                "The request needs more permit units than the tenant may hold.",
            )

    def _stamp(self, ticket: Ticket) -> None:
        ticket.seq = self._seq
        self._seq += 1

    def enqueue(self, ticket: Ticket) -> None:
        """Queue ``ticket``; raise 400 for an impossible weight, 429 when full."""
        self._check(ticket)
        self._stamp(ticket)
        if ticket.weight == 0:
            # Takes no units, so it neither waits nor touches tenant accounting.
            ticket.state = TicketState.HELD
            ticket.granted_at = ticket.enqueued_at
            self._granted.append(ticket)
            return
        self._queue(ticket.tenant).fifo.append(ticket)
        self._waiting[ticket] = None
        self._queued_units += ticket.weight
        self._dirty.add(ticket.tenant)
        # Only a request that would actually have to wait counts against the
        # queue bound, so run the scheduler before judging.
        self._schedule(ticket.enqueued_at)
        if ticket.state is TicketState.WAITING and len(self._waiting) > self.max_queue:
            self._unqueue(ticket, TicketState.CANCELLED)
            raise GatewayError(
                "queue_full",
                "Too many requests are waiting for admission.",
                headers={"Retry-After": str(self.retry_after_s())},
            )

    def grants(self, now: float) -> list[Ticket]:
        """Run the scheduler; return every ticket admitted since the last call."""
        self._schedule(now)
        granted, self._granted = self._granted, []
        return granted

    def release(self, ticket: Ticket, now: float) -> None:
        """Return a held ticket's units; releasing twice is a bug and raises."""
        if ticket.state is not TicketState.HELD:
            raise ValueError(f"cannot release a {ticket.state.value} ticket")
        ticket.state = TicketState.RELEASED
        if ticket.weight == 0:
            return
        queue = self._tenants[ticket.tenant]
        queue.held -= ticket.weight
        if self._shared is not None:
            self._shared[ticket.tenant] -= ticket.weight
        self._in_use -= ticket.weight
        if ticket.granted_at is not None:
            hold = max(0.0, now - ticket.granted_at)
            mean = self._mean_hold_s
            self._mean_hold_s = hold if mean is None else mean + _HOLD_EWMA_ALPHA * (hold - mean)
        self._dirty.add(ticket.tenant)  # a capped head may now be eligible

    def cancel(self, ticket: Ticket) -> bool:
        """Withdraw a waiting ticket; False (and no change) if it is not waiting."""
        if ticket.state is not TicketState.WAITING:
            return False
        self._unqueue(ticket, TicketState.CANCELLED)
        return True

    def expire(self, now: float) -> list[Ticket]:
        """Withdraw and return every waiting ticket whose deadline has passed."""
        expired = [t for t in self._waiting if t.deadline <= now]
        for ticket in expired:
            self._unqueue(ticket, TicketState.EXPIRED)
        return expired

    # -- internals ---------------------------------------------------------

    def _queue(self, tenant: str) -> _TenantQueue:
        queue = self._tenants.get(tenant)
        if queue is None:
            queue = self._tenants[tenant] = _TenantQueue()
        return queue

    def _unqueue(self, ticket: Ticket, state: TicketState) -> None:
        # The ticket stays in its tenant's deque until it reaches the head.
        ticket.state = state
        del self._waiting[ticket]
        self._queued_units -= ticket.weight
        self._dirty.add(ticket.tenant)

    def _offer(self, tenant: str) -> None:
        """Give the tenant's head a place in the turn heap if it may go."""
        queue = self._tenants.get(tenant)
        if queue is None:
            return
        head = queue.head()
        if head is None:
            # Keeps the map bounded; a tenant dropped here would restart at
            # V anyway, because its finish tag is already behind V.
            if queue.held == 0 and queue.finish <= self._vtime:
                del self._tenants[tenant]
            return
        if head.seq == queue.offered or (
            self._held_everywhere(tenant, queue) + head.weight > head.max_permits
        ):
            return  # already offered, or capped: offered again on its release
        queue.offered = head.seq
        heapq.heappush(self._turns, (max(self._vtime, queue.finish), head.seq, tenant))

    def _grant(self, ticket: Ticket, queue: _TenantQueue, now: float) -> None:
        ticket.state = TicketState.HELD
        ticket.granted_at = now
        queue.held += ticket.weight
        if self._shared is not None:
            self._shared[ticket.tenant] = self._shared.get(ticket.tenant, 0) + ticket.weight
        self._in_use += ticket.weight
        self._granted.append(ticket)

    def _schedule(self, now: float) -> None:
        for tenant in self._dirty:
            self._offer(tenant)
        self._dirty.clear()
        turns = self._turns
        while turns:
            start, seq, tenant = turns[0]
            queue = self._tenants.get(tenant)
            head = None if queue is None else queue.head()
            if queue is None or head is None or head.seq != seq:
                heapq.heappop(turns)  # stale: that head left the queue
                if queue is not None and queue.offered == seq:
                    queue.offered = -1
                continue
            if self._held_everywhere(tenant, queue) + head.weight > head.max_permits:
                heapq.heappop(turns)  # capped since offered
                queue.offered = -1
                continue
            if head.weight > self.capacity - self._in_use:
                return  # reserved: the turn is this head's; nobody jumps it
            heapq.heappop(turns)
            queue.fifo.popleft()
            queue.offered = -1
            del self._waiting[head]
            self._queued_units -= head.weight
            self._vtime = max(self._vtime, start)
            queue.finish = start + head.weight / head.share
            self._grant(head, queue, now)
            self._offer(tenant)
