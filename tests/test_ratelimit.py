"""Rate buckets on a fake clock (spec §7, §12 "Rate limits")."""

from __future__ import annotations

import pytest

from gateway.errors import GatewayError
from gateway.ratelimit import (
    Claim,
    InMemoryBucketStore,
    RateLimiter,
    estimate_prompt_tokens,
    format_reset,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def limiter(clock: FakeClock) -> RateLimiter:
    return RateLimiter(clock=clock)


def refused(
    limiter: RateLimiter, rpm: int | None, tpm: int | None, tokens: int, tenant: str = "acme"
) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        limiter.reserve(tenant, rpm, tpm, tokens)
    assert info.value.code == "rate_limited"
    assert info.value.status == 429
    return info.value


def test_estimate_prompt_tokens_rounds_up() -> None:
    assert [estimate_prompt_tokens(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    with pytest.raises(ValueError):
        estimate_prompt_tokens(-1)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0ms"),
        (0.25, "250ms"),
        (0.0201, "21ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (59.9985, "59.999s"),
        (59.9994, "1m0s"),
        (60, "1m0s"),
        (360, "6m0s"),
        (90.25, "1m30.25s"),
        (3723, "1h2m3s"),
    ],
)
def test_reset_is_formatted_like_openai(seconds: float, text: str) -> None:
    assert format_reset(seconds) == text


def test_buckets_start_full(limiter: RateLimiter) -> None:
    for _ in range(3):
        limiter.reserve("acme", 3, None, 0)
    refused(limiter, 3, None, 0)
    # another tenant has its own buckets
    limiter.reserve("other", 3, None, 0)


def test_refill_is_continuous(limiter: RateLimiter, clock: FakeClock) -> None:
    limiter.reserve("acme", None, 600, 600)
    refused(limiter, None, 600, 1)
    clock.now += 0.1  # 600/min is 10 a second: one token
    limiter.reserve("acme", None, 600, 1)
    clock.now += 0.5
    limiter.reserve("acme", None, 600, 5)
    refused(limiter, None, 600, 1)
    clock.now += 3600  # refills only up to the limit
    limiter.reserve("acme", None, 600, 600)
    refused(limiter, None, 600, 1)


def test_retry_after_rounds_up_whole_seconds(limiter: RateLimiter, clock: FakeClock) -> None:
    limiter.reserve("acme", 60, None, 0)
    for _ in range(59):
        limiter.reserve("acme", 60, None, 0)
    # one a second: 1 s until the next request
    assert refused(limiter, 60, None, 0).headers["Retry-After"] == "1"
    clock.now += 0.2
    # 0.8 s left still says 1
    assert refused(limiter, 60, None, 0).headers["Retry-After"] == "1"
    limiter.reserve("acme", None, 120, 120)
    # 50 tokens at 2 a second: 25 s; at 2.5 s more, 22.5 s rounds up to 23
    assert refused(limiter, None, 120, 50).headers["Retry-After"] == "25"
    clock.now += 2.5
    assert refused(limiter, None, 120, 50).headers["Retry-After"] == "23"


def test_retry_after_waits_for_both_buckets(limiter: RateLimiter) -> None:
    limiter.reserve("acme", 6, 60, 60)
    # requests bucket has 5 left; the tokens bucket needs 30 s for 30 tokens
    error = refused(limiter, 6, 60, 30)
    assert error.headers["Retry-After"] == "30"


def test_refused_request_takes_nothing_from_either_bucket(limiter: RateLimiter) -> None:
    limiter.reserve("acme", 10, 100, 90)
    error = refused(limiter, 10, 100, 20)
    assert error.headers["x-ratelimit-remaining-requests"] == "9"
    assert error.headers["x-ratelimit-remaining-tokens"] == "10"
    # the request slot was not consumed by the refusal
    for _ in range(9):
        limiter.reserve("acme", 10, 100, 0)
    refused(limiter, 10, 100, 0)


def test_empty_requests_bucket_protects_the_tokens_bucket(limiter: RateLimiter) -> None:
    limiter.reserve("acme", 1, 100, 10)
    refused(limiter, 1, 100, 10)
    ok = limiter.reserve("other", 1, 100, 100)
    assert ok.headers()["x-ratelimit-remaining-tokens"] == "0"
    # acme's tokens were not taken by the refused request
    error = refused(limiter, 1, 100, 90)
    assert error.headers["x-ratelimit-remaining-tokens"] == "90"


def test_success_and_refusal_headers(limiter: RateLimiter) -> None:
    reservation = limiter.reserve("acme", 600, 60_000, 1000)
    assert reservation.headers() == {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "599",
        "x-ratelimit-reset-requests": "100ms",
        "x-ratelimit-limit-tokens": "60000",
        "x-ratelimit-remaining-tokens": "59000",
        "x-ratelimit-reset-tokens": "1s",
    }
    only_tokens = limiter.reserve("t2", None, 1000, 500)
    assert set(only_tokens.headers()) == {
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    }
    assert only_tokens.headers()["x-ratelimit-reset-tokens"] == "30s"
    unlimited = limiter.reserve("t3", None, None, 10**9)
    assert unlimited.headers() == {}
    unlimited.settle(5)
    limiter.reserve("t4", 1, None, 0)
    error = refused(limiter, 1, None, 0, tenant="t4")
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    assert error.headers["x-ratelimit-reset-requests"] == "1m0s"
    assert error.headers["Retry-After"] == "60"


def test_settle_refunds_the_unused_tokens_once(limiter: RateLimiter) -> None:
    reservation = limiter.reserve("acme", None, 1000, 800)
    reservation.settle(300)
    reservation.settle(0)
    reservation.cancel()
    assert reservation.settled
    # 1000 - 800 + 500 refunded
    limiter.reserve("acme", None, 1000, 700)
    refused(limiter, None, 1000, 1)


def test_settle_charges_overuse(limiter: RateLimiter, clock: FakeClock) -> None:
    reservation = limiter.reserve("acme", None, 60, 10)
    reservation.settle(100)  # 90 more than reserved: the bucket owes 40
    error = refused(limiter, None, 60, 1)
    assert error.headers["x-ratelimit-remaining-tokens"] == "0"
    assert error.headers["Retry-After"] == "41"
    clock.now += 41
    limiter.reserve("acme", None, 60, 1)


def test_cancel_refunds_tokens_but_counts_the_request(limiter: RateLimiter) -> None:
    reservation = limiter.reserve("acme", 2, 100, 100)
    reservation.cancel()
    reservation.settle(100)
    assert limiter.reserve("acme", 2, 100, 100).tokens == 100
    refused(limiter, 2, 100, 0)


def test_refunds_never_overfill(limiter: RateLimiter) -> None:
    first = limiter.reserve("acme", None, 100, 50)
    second = limiter.reserve("acme", None, 100, 50)
    first.cancel()
    second.cancel()
    first.cancel()
    limiter.reserve("acme", None, 100, 100)
    refused(limiter, None, 100, 1)


def test_reservation_beyond_the_minute_is_clamped(limiter: RateLimiter, clock: FakeClock) -> None:
    big = limiter.reserve("acme", None, 1000, 5000)
    assert big.tokens == 1000
    error = refused(limiter, None, 1000, 5000)
    assert error.headers["Retry-After"] == "60"
    clock.now += 60
    again = limiter.reserve("acme", None, 1000, 5000)
    again.settle(400)
    assert limiter.reserve("acme", None, 1000, 600).tokens == 600


def test_lowered_limit_applies_at_once(limiter: RateLimiter) -> None:
    limiter.reserve("acme", 100, None, 0)
    reservation = limiter.reserve("acme", 10, None, 0)
    assert reservation.headers()["x-ratelimit-remaining-requests"] == "9"


def test_invalid_arguments() -> None:
    limiter = RateLimiter()
    with pytest.raises(ValueError):
        limiter.reserve("acme", 0, None, 0)
    with pytest.raises(ValueError):
        limiter.reserve("acme", None, 10, -1)
    with pytest.raises(ValueError):
        limiter.reserve("acme", None, 10, 1).settle(-1)


def test_store_take_is_all_or_nothing() -> None:
    store = InMemoryBucketStore()
    claims = [Claim("a", 10, 4), Claim("b", 10, 11)]
    result = store.take(claims, 0.0)
    assert not result.taken
    assert result.levels == (10.0, 10.0)
    result = store.take([Claim("a", 10, 4), Claim("b", 10, 10)], 0.0)
    assert result.taken
    assert result.levels == (6.0, 0.0)
    assert store.adjust("b", 10, 100, 0.0) == 10.0
    assert store.adjust("a", 10, -8, 0.0) == -2.0
