"""Per-tenant request and token rate limits as token buckets (spec §7, §12).

Theory of operation
-------------------

Each limited tenant has up to two buckets: ``requests_per_minute`` and
``tokens_per_minute`` (``None`` means unlimited: no bucket, no headers). A
bucket of limit ``L`` holds at most ``L``, starts full, and refills
continuously at ``L / 60`` per second. Levels are floats; a refill is
computed from the elapsed time whenever a bucket is touched, so nothing
runs in the background.

:meth:`RateLimiter.reserve` runs before admission. It takes one request and
the estimated tokens (``max_tokens`` plus :func:`estimate_prompt_tokens`)
from both buckets in one atomic step: if either bucket lacks the amount,
neither is touched and the request is refused with 429 ``rate_limited``,
``Retry-After`` (whole seconds, rounded up, until both buckets hold enough
again, at least 1) and OpenAI's ``x-ratelimit-*`` headers.

A token reservation larger than the whole ``tokens_per_minute`` is
**clamped** to it: such a request waits for a full bucket and then takes all
of it. Refusing it with a 400 would make a tenant whose ``max_output_tokens``
exceeds its per-minute budget unusable, and a 429 would promise a retry that
could never succeed. The difference from the real usage is settled later
like any other, so a request that really used more than the minute's budget
leaves the bucket in debt (a negative level) and later requests wait for it.

A :class:`Reservation` is settled exactly once: :meth:`Reservation.settle`
with the real token count (refunding or charging the difference), or
:meth:`Reservation.cancel` when the request never reached the worker
(refunding every token; the request itself still counts). Later calls are
no-ops. Refunds never fill a bucket past its limit.

Storage sits behind :class:`BucketStore`, whose one atomic operation takes
from several buckets all-or-nothing, so a store shared by replicas (for
tenant-wide limits) can replace :class:`InMemoryBucketStore` without touching
the limiter. The in-memory store needs no lock: its methods are synchronous
and the gateway calls them from one event loop thread.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.errors import GatewayError

__all__ = [
    "BucketStore",
    "Claim",
    "InMemoryBucketStore",
    "RateLimiter",
    "Reservation",
    "TakeResult",
    "estimate_prompt_tokens",
    "format_reset",
]

_SECONDS_PER_MINUTE = 60.0


def estimate_prompt_tokens(prompt_bytes: int) -> int:
    """The spec's prompt estimate: one token per four bytes, rounded up."""
    if prompt_bytes < 0:
        raise ValueError("prompt_bytes must not be negative")
    return -(-prompt_bytes // 4)


def format_reset(seconds: float) -> str:
    """A duration the way OpenAI's ``x-ratelimit-reset-*`` headers spell it.

    ``250ms`` below a second, otherwise Go-style ``1s``, ``1.5s``, ``6m0s``,
    ``1h2m3s``; rounded up to the millisecond so a client never retries early.
    """
    millis = max(0, math.ceil(seconds * 1000 - 1e-6))
    if millis < 1000:
        return f"{millis}ms"
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


@dataclass(frozen=True, slots=True)
class Claim:
    """Take ``amount`` from bucket ``key`` whose limit is ``limit`` per minute."""

    key: str
    limit: int
    amount: float


@dataclass(frozen=True, slots=True)
class TakeResult:
    """Whether a take succeeded, and each bucket's level after it (or, on
    refusal, as found), in the order of the claims."""

    taken: bool
    levels: tuple[float, ...]


class BucketStore(Protocol):
    def take(self, claims: Sequence[Claim], now: float) -> TakeResult:
        """Take every claim, or none if any bucket lacks its amount."""
        ...

    def adjust(self, key: str, limit: int, delta: float, now: float) -> float:
        """Add ``delta`` (negative charges) to a bucket, capped at its limit;
        return the new level."""
        ...


class InMemoryBucketStore:
    """Buckets in a dict: one process, one event loop."""

    def __init__(self) -> None:
        # key -> (level, time of that level)
        self._buckets: dict[str, tuple[float, float]] = {}

    def _level(self, key: str, limit: int, now: float) -> float:
        found = self._buckets.get(key)
        if found is None:
            return float(limit)
        level, stamp = found
        elapsed = max(0.0, now - stamp)
        # Capped at the current limit, so a lowered limit takes effect at once.
        return min(float(limit), level + elapsed * limit / _SECONDS_PER_MINUTE)

    def take(self, claims: Sequence[Claim], now: float) -> TakeResult:
        levels = [self._level(c.key, c.limit, now) for c in claims]
        if any(level < c.amount for level, c in zip(levels, claims, strict=True)):
            return TakeResult(False, tuple(levels))
        after = []
        for level, claim in zip(levels, claims, strict=True):
            remaining = level - claim.amount
            self._buckets[claim.key] = (remaining, now)
            after.append(remaining)
        return TakeResult(True, tuple(after))

    def adjust(self, key: str, limit: int, delta: float, now: float) -> float:
        level = min(float(limit), self._level(key, limit, now) + delta)
        self._buckets[key] = (level, now)
        return level


def _seconds_until(level: float, need: float, limit: int) -> float:
    """Seconds of refill until a bucket holds ``need``."""
    return max(0.0, (need - level) * _SECONDS_PER_MINUTE / limit)


def _family_headers(kind: str, limit: int, level: float) -> dict[str, str]:
    return {
        f"x-ratelimit-limit-{kind}": str(limit),
        f"x-ratelimit-remaining-{kind}": str(max(0, math.floor(level))),
        f"x-ratelimit-reset-{kind}": format_reset(_seconds_until(level, limit, limit)),
    }


class Reservation:
    """One admitted request's hold on its tenant's buckets."""

    __slots__ = ("_headers", "_limiter", "_settled", "_tenant", "_tokens", "_tpm")

    def __init__(
        self,
        limiter: RateLimiter,
        tenant: str,
        tpm: int | None,
        tokens: int,
        headers: dict[str, str],
    ) -> None:
        self._limiter = limiter
        self._tenant = tenant
        self._tpm = tpm
        self._tokens = tokens
        self._headers = headers
        self._settled = False

    @property
    def tokens(self) -> int:
        """Tokens taken from the bucket (after clamping; 0 when unlimited)."""
        return self._tokens

    @property
    def settled(self) -> bool:
        return self._settled

    def headers(self) -> dict[str, str]:
        """``x-ratelimit-*`` headers as of the reservation, for the response."""
        return dict(self._headers)

    def settle(self, actual_tokens: int) -> None:
        """Refund (or charge) the difference to the real usage, once."""
        if actual_tokens < 0:
            raise ValueError("actual_tokens must not be negative")
        self._finish(self._tokens - actual_tokens)

    def cancel(self) -> None:
        """Refund every reserved token, once; the request stays counted."""
        self._finish(self._tokens)

    def _finish(self, refund: int) -> None:
        if self._settled:
            return
        self._settled = True
        if self._tpm is not None and refund:
            self._limiter._adjust_tokens(self._tenant, self._tpm, refund)


class RateLimiter:
    """Checks and takes from the per-tenant buckets; see the module docstring."""

    def __init__(
        self,
        store: BucketStore | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store: BucketStore = InMemoryBucketStore() if store is None else store
        self._clock = clock

    def reserve(self, tenant: str, rpm: int | None, tpm: int | None, tokens: int) -> Reservation:
        if tokens < 0:
            raise ValueError("tokens must not be negative")
        if (rpm is not None and rpm < 1) or (tpm is not None and tpm < 1):
            raise ValueError("limits must be positive or None")
        charged = 0 if tpm is None else min(tokens, tpm)
        families: list[tuple[str, Claim]] = []
        if rpm is not None:
            families.append(("requests", Claim(_key(tenant, "requests"), rpm, 1)))
        if tpm is not None:
            families.append(("tokens", Claim(_key(tenant, "tokens"), tpm, charged)))
        if not families:
            return Reservation(self, tenant, None, 0, {})
        result = self._store.take([claim for _, claim in families], self._clock())
        headers: dict[str, str] = {}
        for (kind, claim), level in zip(families, result.levels, strict=True):
            headers.update(_family_headers(kind, claim.limit, level))
        if not result.taken:
            wait = max(
                _seconds_until(level, claim.amount, claim.limit)
                for (_, claim), level in zip(families, result.levels, strict=True)
            )
            headers["Retry-After"] = str(max(1, math.ceil(wait - 1e-9)))
            raise GatewayError(
                "rate_limited",
                "The tenant's rate limit is exhausted.",
                headers=headers,
            )
        return Reservation(self, tenant, tpm, charged, headers)

    def _adjust_tokens(self, tenant: str, tpm: int, delta: int) -> None:
        self._store.adjust(_key(tenant, "tokens"), tpm, float(delta), self._clock())


def _key(tenant: str, kind: str) -> str:
    # Tenant names cannot contain "/" (policy.TENANT_NAME), so keys never collide.
    return f"{tenant}/{kind}"
