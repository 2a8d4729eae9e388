"""Static API keys: digest match in constant time, both scopes, misses refused."""

from __future__ import annotations

import hmac

import pytest

from gateway.auth.apikeys import match_api_key
from gateway.core.errors import GatewayError
from tests.auth.conftest import API_KEY, assert_no_leak, policy_set


def test_match() -> None:
    principal = match_api_key(API_KEY, policy_set(api_keys={"nightly": API_KEY}))
    assert principal.tenant == "acme"
    assert principal.subject == "apikey:nightly"
    assert principal.scopes == {"inference", "evidence"}
    assert principal.kind == "api_key"
    assert principal.expires_at is None


@pytest.mark.parametrize("value", [API_KEY + "x", API_KEY.upper(), API_KEY[:-1], "x"])
def test_miss(value: str) -> None:
    with pytest.raises(GatewayError) as info:
        match_api_key(value, policy_set(api_keys={"nightly": API_KEY}))
    assert info.value.code == "invalid_token"
    assert_no_leak(info.value, value)


def test_no_keys_configured() -> None:
    with pytest.raises(GatewayError):
        match_api_key(API_KEY, policy_set())


def test_every_entry_is_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = {f"key{i}": f"secret-{i}" for i in range(5)}
    policies = policy_set(api_keys=keys)
    calls: list[str] = []
    real = hmac.compare_digest

    def counting(a: str, b: str) -> bool:
        calls.append(b)
        return real(a, b)

    monkeypatch.setattr("hmac.compare_digest", counting)
    first = next(iter(policies.api_keys))
    owner = policies.api_keys[first].name
    assert match_api_key(keys[owner], policies).subject == f"apikey:{owner}"
    assert sorted(calls) == sorted(policies.api_keys)
