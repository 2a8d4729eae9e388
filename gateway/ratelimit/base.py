"""The limits-store seam: :class:`LimitsStore`, :class:`Hold`, :class:`StoreMetrics`.

Theory of operation
-------------------

A store owns the state behind the tenant limits (``core.TenantLimits``) and
makes every decision about it in one atomic step where that state lives,
like httpx's transport seam: the gateway holds a :class:`LimitsStore` and
does not know whether it is the process-local ``MemoryLimitsStore`` or the
shared ``RedisLimitsStore``.

* ``await reserve(tenant, limits, tokens, concurrent=...)`` takes one
  request, the clamped token charges and (for inference requests) one
  concurrency slot, all or nothing, and returns a :class:`Hold`; or raises
  ``GatewayError`` (``budget_exhausted``, ``rate_limited``,
  ``concurrency_limited``, or ``limits_unavailable`` when a shared store
  cannot decide; see ``core.judge``).
* ``settle(hold, used_tokens)`` is synchronous and never waits: it is called
  from a request's one ``finally``. The store refunds (or charges) the
  difference between what the hold took and the real usage, on the minute's
  bucket and on the counter of the day the hold counted against, and frees
  the slot. ``used_tokens=0`` is a request that never reached the worker:
  every token is refunded, the request itself stays counted. A second call
  for the same hold is a no-op.
* ``start()``, ``flush(timeout_s)`` and ``aclose(timeout_s)`` bound the
  store's background work; ``healthy`` is False from a shared store's failed
  call to its next success (the metric); ``ready`` is False only once every
  call has failed for ``limits_store.unready_after_s`` (what readiness reads,
  never waiting for the store: one slow answer is that request's failure,
  not the replica's, spec §24); ``pending_settlements`` counts settlements
  queued and not yet applied.

A :class:`Hold` is what a reservation took. ``checked=False`` marks the hold
a failing store hands out under ``on_error: open``: nothing was taken, there
is nothing to settle, and it carries no headers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gateway.ratelimit.core import TenantLimits

__all__ = ["Hold", "LimitsStore", "NullMetrics", "StoreMetrics"]


@dataclass(eq=False, slots=True)
class Hold:
    """One admitted request's hold on its tenant's limits."""

    tenant: str
    limits: TenantLimits
    #: tokens taken from the minute's bucket (after clamping; 0 when unlimited)
    minute_tokens: int = 0
    #: tokens charged to the day's counter (after clamping; 0 when unlimited)
    day_tokens: int = 0
    #: the UTC day (days since the epoch) ``day_tokens`` counted against
    day: int | None = None
    #: the concurrency slot's id, when one was taken
    slot: str | None = None
    #: the store's name for this hold (server-side idempotency of settlements)
    id: str = ""
    #: False: handed out by a failing store under ``on_error: open``; nothing taken
    checked: bool = True
    _headers: dict[str, str] = field(default_factory=dict)
    _settled: bool = False

    @property
    def tokens(self) -> int:
        """Tokens taken from the minute's bucket (the old ``Reservation.tokens``)."""
        return self.minute_tokens

    @property
    def settled(self) -> bool:
        return self._settled

    def headers(self) -> dict[str, str]:
        """``x-ratelimit-*`` headers as of the reservation, for the response."""
        return dict(self._headers)

    def claim_settlement(self, used_tokens: int) -> bool:
        """Mark the hold settled; True the first time only (stores call this)."""
        if used_tokens < 0:
            raise ValueError("used_tokens must not be negative")
        if self._settled:
            return False
        self._settled = True
        return True


class StoreMetrics(Protocol):
    """Where a store reports its calls (``gateway.observe.metrics.GatewayMetrics``)."""

    def limits_store_call(self, op: str, seconds: float) -> None: ...

    def limits_store_error(self, op: str) -> None: ...


class NullMetrics:
    def limits_store_call(self, op: str, seconds: float) -> None:
        pass

    def limits_store_error(self, op: str) -> None:
        pass


class LimitsStore(Protocol):
    """See the module docstring."""

    @property
    def healthy(self) -> bool: ...

    @property
    def ready(self) -> bool: ...

    @property
    def pending_settlements(self) -> int: ...

    async def start(self) -> None: ...

    async def reserve(
        self,
        tenant: str,
        limits: TenantLimits,
        tokens: int,
        *,
        concurrent: bool = True,
        wait_s: float = 0.0,
    ) -> Hold:
        """Take what one request may use, or raise its refusal. ``wait_s``: how
        long the request may still wait before its worker call begins (the
        admission queue); its hold's lease (and a memory store's slot) is that
        much longer, so a live request never outlives them. A shared store's
        slot is renewed while the hold is unsettled instead."""
        ...

    def reserve_now(
        self,
        tenant: str,
        limits: TenantLimits,
        tokens: int,
        *,
        concurrent: bool = True,
        wait_s: float = 0.0,
    ) -> Hold | None:
        """:meth:`reserve` decided in this process, without a wait: the hold or
        its refusal; None when the store must be asked (a shared one): await
        :meth:`reserve` then. No coroutine for a memory store's every request."""
        ...

    def settle(self, hold: Hold, used_tokens: int) -> None: ...

    async def flush(self, timeout_s: float) -> bool:
        """Wait until every settlement queued so far is applied; False on timeout."""
        ...

    async def aclose(self, timeout_s: float = 5.0) -> int:
        """Flush within ``timeout_s``, stop; return how many settlements were not applied."""
        ...
