"""The pure core of tenant limits: bucket math, verdicts, headers (spec §7, §12, §15).

Theory of operation
-------------------

A tenant has up to four limits (:class:`TenantLimits`, ``None`` = unlimited):

* ``requests_per_minute`` and ``tokens_per_minute`` are token buckets. A
  bucket of limit ``L`` holds at most ``L``, starts full, and refills
  continuously at ``L / 60`` per second. Levels are floats; the refill is
  computed from the elapsed time whenever a bucket is touched
  (:func:`refill`), so nothing runs in the background.
* ``tokens_per_day`` is a counter of tokens charged in the current UTC day
  (:func:`utc_day`); it starts at 0 at every UTC midnight.
* ``max_concurrent_requests`` counts the tenant's held concurrency slots.

One reservation (:func:`charges`) asks for 1 request, ``min(tokens, tpm)``
tokens of the minute and ``min(tokens, tpd)`` tokens of the day, and a slot
for inference requests. A reservation larger than the whole minute's or
day's budget is **clamped** to it: such a request waits for a full bucket
(or a new day) and then takes all of it. Refusing it with a 400 would make a
tenant whose ``max_output_tokens`` exceeds its budget unusable, and a 429
would promise a retry that could never succeed. A store settles the
difference to the real usage later, so a request that really used more
leaves the bucket in debt (a negative level) or the day over budget, and
later requests wait for it. A claim of 0 tokens (an evidence upload) is not
checked against either token limit: a token debt does not refuse uploads.

A store evaluates every limit against its state in one atomic step and
describes what it found as a :class:`Verdict`; :func:`judge` turns the
verdict into the success headers or the refusal. Both stores (memory and
Redis) produce verdicts, so their answers are spelled by this one module:

* nothing fails: the store has taken everything; the response carries
  OpenAI's ``x-ratelimit-*`` headers for the limited buckets (levels after
  the take).
* several fail: the longest-lasting is reported — ``budget_exhausted``
  (``Retry-After`` until the next UTC midnight), then ``rate_limited``
  (``Retry-After`` until both buckets hold enough again, with the
  ``x-ratelimit-*`` headers as found), then ``concurrency_limited``
  (``Retry-After: 1``). ``Retry-After`` is whole seconds, rounded up, at
  least 1.

Pure: no I/O library is imported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.core.errors import GatewayError

__all__ = [
    "REFUSED_DAY",
    "REFUSED_REQUESTS",
    "REFUSED_SLOTS",
    "REFUSED_TOKENS",
    "REFUSED_VOID",
    "SECONDS_PER_DAY",
    "SECONDS_PER_MINUTE",
    "Charges",
    "TenantLimits",
    "Verdict",
    "charges",
    "format_reset",
    "judge",
    "refill",
    "retry_after",
    "seconds_until",
    "seconds_until_midnight",
    "utc_day",
]

SECONDS_PER_MINUTE = 60.0
SECONDS_PER_DAY = 86_400

#: bits of :attr:`Verdict.refused`
REFUSED_REQUESTS = 1
REFUSED_TOKENS = 2
REFUSED_DAY = 4
REFUSED_SLOTS = 8
#: the shared store had voided this reservation before it ran (nothing taken):
#: only a caller that already gave up could see it, so it is never admitted
REFUSED_VOID = 16


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


def retry_after(seconds: float) -> str:
    """``Retry-After``: whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(seconds - 1e-9)))


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """One tenant's shared limits; ``None`` is unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    max_concurrent_requests: int | None = None

    def __post_init__(self) -> None:
        for value in (
            self.requests_per_minute,
            self.tokens_per_minute,
            self.tokens_per_day,
            self.max_concurrent_requests,
        ):
            if value is not None and value < 1:
                raise ValueError("limits must be positive or None")

    @property
    def unlimited(self) -> bool:
        return (
            self.requests_per_minute is None
            and self.tokens_per_minute is None
            and self.tokens_per_day is None
            and self.max_concurrent_requests is None
        )


@dataclass(frozen=True, slots=True)
class Charges:
    """What one reservation asks for (after clamping)."""

    minute_tokens: int
    day_tokens: int
    #: whether a concurrency slot is needed (an inference request of a tenant with the limit)
    slot: bool


def charges(limits: TenantLimits, tokens: int, *, concurrent: bool) -> Charges:
    if tokens < 0:
        raise ValueError("tokens must not be negative")
    tpm, tpd = limits.tokens_per_minute, limits.tokens_per_day
    return Charges(
        minute_tokens=0 if tpm is None else min(tokens, tpm),
        day_tokens=0 if tpd is None else min(tokens, tpd),
        slot=concurrent and limits.max_concurrent_requests is not None,
    )


def refill(level: float, stamp: float, limit: int, now: float) -> float:
    """A bucket's level at ``now``, last written as ``level`` at ``stamp``.

    Capped at the current limit, so a lowered limit takes effect at once; a
    clock that went backwards refills nothing.
    """
    elapsed = max(0.0, now - stamp)
    return min(float(limit), level + elapsed * limit / SECONDS_PER_MINUTE)


def seconds_until(level: float, need: float, limit: int) -> float:
    """Seconds of refill until a bucket holds ``need``."""
    return max(0.0, (need - level) * SECONDS_PER_MINUTE / limit)


def utc_day(unix_s: float) -> int:
    """The UTC day of a Unix time, as days since the epoch."""
    return math.floor(unix_s / SECONDS_PER_DAY)


def seconds_until_midnight(unix_s: float) -> float:
    """Seconds from a Unix time to the next UTC midnight (0 < result <= one day)."""
    return (utc_day(unix_s) + 1) * SECONDS_PER_DAY - unix_s


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a store found (on refusal) or left (on success) in one atomic step.

    ``refused`` is a set of ``REFUSED_*`` bits (0: everything was taken).
    Levels are ``None`` for unlimited buckets.
    """

    refused: int
    requests_level: float | None
    tokens_level: float | None
    #: seconds from the decision to the next UTC midnight (the store's clock)
    until_midnight_s: float


def _family_headers(kind: str, limit: int, level: float) -> dict[str, str]:
    return {
        f"x-ratelimit-limit-{kind}": str(limit),
        f"x-ratelimit-remaining-{kind}": str(max(0, math.floor(level))),
        f"x-ratelimit-reset-{kind}": format_reset(seconds_until(level, limit, limit)),
    }


def bucket_headers(limits: TenantLimits, verdict: Verdict) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers for the tenant's limited buckets."""
    headers: dict[str, str] = {}
    rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
    if rpm is not None and verdict.requests_level is not None:
        headers.update(_family_headers("requests", rpm, verdict.requests_level))
    if tpm is not None and verdict.tokens_level is not None:
        headers.update(_family_headers("tokens", tpm, verdict.tokens_level))
    return headers


def judge(limits: TenantLimits, want: Charges, verdict: Verdict) -> dict[str, str]:
    """The success headers, or the refusal raised as a :class:`GatewayError`."""
    if verdict.refused & REFUSED_VOID:
        raise GatewayError("limits_unavailable")
    if verdict.refused & REFUSED_DAY:
        raise GatewayError(
            "budget_exhausted",
            "The tenant's daily token budget is exhausted.",
            headers={"Retry-After": retry_after(verdict.until_midnight_s)},
        )
    headers = bucket_headers(limits, verdict)
    if verdict.refused & (REFUSED_REQUESTS | REFUSED_TOKENS):
        waits = [0.0]
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        if rpm is not None and verdict.requests_level is not None:
            waits.append(seconds_until(verdict.requests_level, 1, rpm))
        if tpm is not None and verdict.tokens_level is not None and want.minute_tokens:
            waits.append(seconds_until(verdict.tokens_level, want.minute_tokens, tpm))
        headers["Retry-After"] = retry_after(max(waits))
        raise GatewayError("rate_limited", "The tenant's rate limit is exhausted.", headers=headers)
    if verdict.refused & REFUSED_SLOTS:
        raise GatewayError(
            "concurrency_limited",
            "The tenant has too many requests in flight.",
            headers={"Retry-After": "1"},
        )
    return headers
