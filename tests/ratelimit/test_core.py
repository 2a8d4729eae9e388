"""The pure core: estimates, header spelling, verdicts, day math, key names."""

from __future__ import annotations

import itertools

import pytest

from gateway.apis.usage import estimate_prompt_tokens
from gateway.core.errors import GatewayError
from gateway.ratelimit import TenantLimits, format_reset, tenant_keys
from gateway.ratelimit.core import (
    REFUSED_DAY,
    REFUSED_REQUESTS,
    REFUSED_SLOTS,
    REFUSED_TOKENS,
    SECONDS_PER_DAY,
    Verdict,
    charges,
    judge,
    refill,
    retry_after,
    seconds_until_midnight,
    utc_day,
)


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


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "1"), (0.01, "1"), (1, "1"), (1.0000001, "2"), (22.5, "23")]
)
def test_retry_after_is_whole_seconds_rounded_up_at_least_one(seconds: float, text: str) -> None:
    assert retry_after(seconds) == text


def test_limits_are_positive_or_none() -> None:
    assert TenantLimits().unlimited
    assert not TenantLimits(max_concurrent_requests=1).unlimited
    for bad in ({"requests_per_minute": 0}, {"tokens_per_day": -1}):
        with pytest.raises(ValueError):
            TenantLimits(**bad)


def test_charges_are_clamped_to_the_budgets() -> None:
    limits = TenantLimits(tokens_per_minute=1000, tokens_per_day=300, max_concurrent_requests=2)
    want = charges(limits, 5000, concurrent=True)
    assert (want.minute_tokens, want.day_tokens, want.slot) == (1000, 300, True)
    upload = charges(limits, 0, concurrent=False)
    assert (upload.minute_tokens, upload.day_tokens, upload.slot) == (0, 0, False)
    assert not charges(TenantLimits(), 10, concurrent=True).slot
    with pytest.raises(ValueError):
        charges(limits, -1, concurrent=True)


def test_refill_is_capped_and_ignores_clocks_going_back() -> None:
    assert refill(0, 100, 60, 101) == 1
    assert refill(0, 100, 60, 1000) == 60
    assert refill(-5, 100, 60, 99) == -5
    assert refill(100, 0, 10, 0) == 10  # a lowered limit caps at once


def test_utc_days_and_midnight() -> None:
    day = 20_000 * SECONDS_PER_DAY
    assert utc_day(day) == 20_000 and utc_day(day - 0.001) == 19_999
    assert seconds_until_midnight(day) == SECONDS_PER_DAY
    assert seconds_until_midnight(day + 86_399.5) == pytest.approx(0.5)


LIMITS = TenantLimits(60, 600, 1000, 1)
WANT = charges(LIMITS, 300, concurrent=True)


def verdict(refused: int, requests: float = 10, tokens: float = 0) -> Verdict:
    return Verdict(refused, requests, tokens, until_midnight_s=3600.2)


@pytest.mark.parametrize(
    "bits", [b for n in range(1, 5) for b in itertools.combinations([1, 2, 4, 8], n)]
)
def test_the_longest_lasting_refusal_is_reported(bits: tuple[int, ...]) -> None:
    refused = sum(bits)
    with pytest.raises(GatewayError) as info:
        judge(LIMITS, WANT, verdict(refused, requests=0.5))
    error = info.value
    assert error.status == 429
    if refused & REFUSED_DAY:
        assert (error.code, error.headers) == ("budget_exhausted", {"Retry-After": "3601"})
    elif refused & (REFUSED_REQUESTS | REFUSED_TOKENS):
        assert error.code == "rate_limited"
        # 300 tokens at 10 a second: 30 s; the request bucket's half: 0.5 s
        assert error.headers["Retry-After"] == "30"
        assert error.headers["x-ratelimit-remaining-tokens"] == "0"
    else:
        assert refused == REFUSED_SLOTS
        assert (error.code, error.headers) == ("concurrency_limited", {"Retry-After": "1"})


def test_success_has_bucket_headers_only() -> None:
    headers = judge(LIMITS, WANT, verdict(0, requests=59, tokens=300))
    assert headers == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "600",
        "x-ratelimit-remaining-tokens": "300",
        "x-ratelimit-reset-tokens": "30s",
    }
    assert judge(TenantLimits(tokens_per_day=5), WANT, Verdict(0, None, None, 1.0)) == {}


NAMES = ["a:b", "a", ":b", "a:", "*", "{x}", "x", "a b", "ünï", "", "}", "{", "61", "a\x00"]


def test_tenant_keys_are_injective_and_hash_tagged() -> None:
    seen: dict[str, str] = {}
    for name in NAMES:
        keys = tenant_keys("mrgw:", name)
        fields = [keys.requests, keys.tokens, keys.day, keys.slots, keys.holds, keys.void]
        assert len(set(fields)) == 6
        # the scripts' KEYS, in the order scripts.py documents
        assert keys.reserve == tuple(fields) and keys.settle == tuple(fields[1:])
        for key in fields:
            assert key not in seen, (name, seen.get(key))
            seen[key] = name
            tag = key[key.index("{") + 1 : key.index("}")]
            assert bytes.fromhex(tag).decode() == name  # the one hash tag, recoverable
            assert not set(tag) - set("0123456789abcdef")
    with pytest.raises(ValueError):
        tenant_keys("bad{", "a")
