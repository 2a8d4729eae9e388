"""Authentication failures folded onto the fixed reason set (metric label, log field)."""

from __future__ import annotations

import pytest

from gateway.auth.apikeys import match_api_key
from gateway.auth.authenticator import Authenticator
from gateway.auth.failures import REASONS, failure_reason
from gateway.config.policy import PolicySet
from gateway.core.errors import GatewayError
from tests.auth.conftest import FakeClock, authenticator, hs_issuer, policy_set, rs_issuer
from tests.auth.test_tokens import FAILURES

#: what each verifier word is reported as
EXPECTED = {
    "expired": "expired",
    "not_yet_valid": "not_yet_valid",
    "issued_in_future": "not_yet_valid",
    "audience": "audience",
    "issuer": "issuer",
    "unknown_issuer": "issuer",
    "signature": "signature",
    "unknown_key": "unknown_kid",
    "algorithm": "algorithm",
    "lifetime": "lifetime",
    "missing_tenant": "missing_claim",
    "missing_exp": "missing_claim",
    "missing_iss": "missing_claim",
    "missing_aud": "missing_claim",
    "bad_exp": "malformed",
    "bad_nbf": "malformed",
    "bad_scope": "malformed",
    "bad_sub": "malformed",
    "malformed": "malformed",
}


@pytest.fixture
def auth(clock: FakeClock) -> Authenticator:
    return authenticator(rs_issuer(), hs_issuer(), clock=clock)


@pytest.mark.parametrize("case", list(FAILURES), ids=list(FAILURES))
async def test_every_token_failure_has_a_fixed_reason(
    auth: Authenticator, policies: PolicySet, clock: FakeClock, case: str
) -> None:
    make, word = FAILURES[case]
    with pytest.raises(GatewayError) as info:
        await auth.authenticate([f"Bearer {make(clock.now)}"], policies)
    got = failure_reason(info.value)
    assert got in REASONS
    assert got == EXPECTED[word], (case, word)


@pytest.mark.parametrize("header", [[], ["Basic abc"], ["Bearer "], ["Bearer a", "Bearer b"]])
async def test_missing_credentials_are_missing(
    auth: Authenticator, policies: PolicySet, header: list[str]
) -> None:
    with pytest.raises(GatewayError) as info:
        await auth.authenticate(header, policies)
    assert failure_reason(info.value) == "missing"


async def test_api_key_miss_and_overlong_value(auth: Authenticator, policies: PolicySet) -> None:
    with pytest.raises(GatewayError) as info:
        match_api_key("sk-nobody-has-this", policy_set(api_keys={"k": "sk-other"}))
    assert failure_reason(info.value) == "unknown_api_key"
    with pytest.raises(GatewayError) as info:
        await auth.authenticate(["Bearer " + "x" * 20_000], policies)
    assert (info.value.code, failure_reason(info.value)) == ("invalid_token", "malformed")


def test_other_errors_are_not_authentication_failures() -> None:
    for code in ("tenant_not_configured", "insufficient_scope", "rate_limited", "invalid_json"):
        assert failure_reason(GatewayError(code)) is None
