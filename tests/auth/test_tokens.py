"""JWT verification: what passes, and every way a token must fail (invalid_token)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import jwt
import pytest

from gateway.auth.authenticator import Authenticator
from gateway.config.policy import PolicySet
from gateway.core.errors import GatewayError
from tests.auth.conftest import (
    EC_ISSUER,
    HS_ISSUER,
    FakeClock,
    assert_no_leak,
    authenticator,
    hs_issuer,
    reason,
    rs_issuer,
)
from tests.support.jwt import (
    HS_SECRET,
    JWKS_EC_PATH,
    RSA1_PUBLIC_PEM,
    make_claims,
    private_pem,
    sign_es256,
    sign_hs256,
    sign_raw,
    sign_rs256,
)


@pytest.fixture
def auth(clock: FakeClock) -> Authenticator:
    ec = rs_issuer(JWKS_EC_PATH, issuer=EC_ISSUER, algorithms=["ES256"])
    return authenticator(rs_issuer(), hs_issuer(), ec, clock=clock)


async def test_rs256_from_jwks_file(
    auth: Authenticator, policies: PolicySet, clock: FakeClock
) -> None:
    token = sign_rs256(make_claims(now=clock.now, sub="alice"))
    principal = await auth.authenticate([f"Bearer {token}"], policies)
    assert principal.tenant == "acme"
    assert principal.subject == "alice"
    assert principal.kind == "jwt"
    assert principal.scopes == {"inference", "evidence"}
    assert principal.expires_at == int(clock.now) + 300


async def test_hs256_from_env(auth: Authenticator, policies: PolicySet, clock: FakeClock) -> None:
    token = sign_hs256(make_claims(iss=HS_ISSUER, now=clock.now))
    principal = await auth.authenticate([f"Bearer {token}"], policies)
    assert principal.tenant == "acme"


async def test_es256_from_jwks_file(
    auth: Authenticator, policies: PolicySet, clock: FakeClock
) -> None:
    token = sign_es256(make_claims(iss=EC_ISSUER, now=clock.now))
    assert (await auth.authenticate([f"Bearer {token}"], policies)).tenant == "acme"


@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        ("inference evidence", {"inference", "evidence"}),
        ("  inference  ", {"inference"}),
        (["inference", "evidence"], {"inference", "evidence"}),
        ([], set()),
        (None, set()),
    ],
)
async def test_scope_as_string_or_list(
    auth: Authenticator,
    policies: PolicySet,
    clock: FakeClock,
    scope: str | list[str] | None,
    expected: set[str],
) -> None:
    token = sign_rs256(make_claims(now=clock.now, scope=scope))
    assert (await auth.authenticate([f"Bearer {token}"], policies)).scopes == expected


async def test_missing_sub_is_dash(
    auth: Authenticator, policies: PolicySet, clock: FakeClock
) -> None:
    token = sign_rs256(make_claims(now=clock.now, sub=None))
    assert (await auth.authenticate([f"Bearer {token}"], policies)).subject == "-"


async def test_expired_within_leeway_passes(
    auth: Authenticator, policies: PolicySet, clock: FakeClock
) -> None:
    token = sign_rs256(make_claims(now=clock.now - 310, ttl=300))
    assert (await auth.authenticate([f"Bearer {token}"], policies)).tenant == "acme"


async def test_audience_list_containing_ours_passes(
    auth: Authenticator, policies: PolicySet, clock: FakeClock
) -> None:
    token = sign_rs256(make_claims(now=clock.now, aud=["other", "mistralrs-gateway"]))
    assert (await auth.authenticate([f"Bearer {token}"], policies)).tenant == "acme"


def _tamper_signature(token: str) -> str:
    head, body, sig = token.split(".")
    middle = len(sig) // 2
    flipped = "A" if sig[middle] != "A" else "B"
    return f"{head}.{body}.{sig[:middle]}{flipped}{sig[middle + 1 :]}"


def _tamper_payload(token: str, now: float) -> str:
    head, _, sig = token.split(".")
    claims = make_claims(now=now, tenant="globex")
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{head}.{body}.{sig}"


def _hs256_with_rsa_public_pem(now: float) -> str:
    return sign_raw(
        {"alg": "HS256", "typ": "JWT", "kid": "k1"},
        make_claims(now=now),
        RSA1_PUBLIC_PEM.read_bytes(),
    )


def _claims(now: float, **changes: Any) -> dict[str, Any]:
    """Valid claims with some replaced by values of the wrong type."""
    return {**make_claims(now=now), **changes}


def _crit_token(now: float) -> str:
    return jwt.encode(
        make_claims(now=now),
        private_pem("rsa1"),
        algorithm="RS256",
        headers={"kid": "k1", "crit": ["exp"], "exp": 1},
    )


Case = Callable[[float], str]
FAILURES: dict[str, tuple[Case, str]] = {
    "expired": (lambda now: sign_rs256(make_claims(now=now - 400, ttl=300)), "expired"),
    "not yet valid (nbf)": (
        lambda now: sign_rs256(make_claims(now=now, nbf=now + 120)),
        "not_yet_valid",
    ),
    "issued in the future": (
        lambda now: sign_rs256(make_claims(now=now + 120)),
        "issued_in_future",
    ),
    "wrong audience": (
        lambda now: sign_rs256(make_claims(now=now, aud="someone-else")),
        "audience",
    ),
    "unknown issuer": (
        lambda now: sign_rs256(make_claims(now=now, iss="https://evil.test")),
        "unknown_issuer",
    ),
    "RS256 token claiming the HS256 issuer": (
        lambda now: sign_rs256(make_claims(now=now, iss=HS_ISSUER)),
        "algorithm",
    ),
    "HS256 token claiming the RS256 issuer": (
        lambda now: sign_hs256(make_claims(now=now)),
        "algorithm",
    ),
    "alg none": (
        lambda now: sign_raw(
            {"alg": "none", "typ": "JWT", "kid": "k1"}, make_claims(now=now), None
        ),
        "algorithm",
    ),
    "alg None with HS issuer": (
        lambda now: sign_raw({"alg": "None"}, make_claims(now=now, iss=HS_ISSUER), None),
        "algorithm",
    ),
    "HS256 keyed with the RSA public key PEM": (_hs256_with_rsa_public_pem, "algorithm"),
    "unknown kid": (lambda now: sign_rs256(make_claims(now=now), kid="k9"), "unknown_key"),
    "wrong key under a known kid": (
        lambda now: sign_rs256(make_claims(now=now), kid="k1", key="rsa2"),
        "signature",
    ),
    "tampered signature": (
        lambda now: _tamper_signature(sign_rs256(make_claims(now=now))),
        "signature",
    ),
    "tampered payload": (
        lambda now: _tamper_payload(sign_rs256(make_claims(now=now)), now),
        "signature",
    ),
    "HS256 wrong secret": (
        lambda now: sign_hs256(make_claims(now=now, iss=HS_ISSUER), secret="x" * 40),
        "signature",
    ),
    "lifetime too long": (lambda now: sign_rs256(make_claims(now=now, ttl=3601)), "lifetime"),
    "lifetime too long without iat": (
        lambda now: sign_rs256(make_claims(now=now, ttl=3700, iat=None)),
        "lifetime",
    ),
    "missing tenant claim": (
        lambda now: sign_rs256(make_claims(now=now, tenant=None)),
        "missing_tenant",
    ),
    "empty tenant claim": (
        lambda now: sign_rs256(make_claims(now=now, tenant="")),
        "missing_tenant",
    ),
    "non-string tenant claim": (lambda now: sign_rs256(_claims(now, tenant=7)), "missing_tenant"),
    "missing exp": (lambda now: sign_rs256(make_claims(now=now, exp=None)), "missing_exp"),
    "missing iss": (lambda now: sign_rs256(make_claims(now=now, iss=None)), "missing_iss"),
    "missing aud": (lambda now: sign_rs256(make_claims(now=now, aud=None)), "missing_aud"),
    "non-numeric exp": (lambda now: sign_rs256(make_claims(now=now, exp="never")), "bad_exp"),
    "boolean nbf": (lambda now: sign_rs256(make_claims(now=now, nbf=True)), "bad_nbf"),
    "scope of wrong type": (lambda now: sign_rs256(_claims(now, scope=3)), "bad_scope"),
    "scope list with non-strings": (
        lambda now: sign_rs256(make_claims(now=now, scope=["inference", 1])),  # type: ignore[list-item]
        "bad_scope",
    ),
    "non-string sub": (lambda now: sign_rs256(_claims(now, sub=5)), "bad_sub"),
    "critical header extension": (_crit_token, "malformed"),
    "garbage segments": (lambda now: "aaaa.bbbb.cccc", "malformed"),
    "payload not an object": (
        lambda now: sign_raw({"alg": "HS256"}, [1, 2], HS_SECRET.encode()),  # type: ignore[arg-type]
        "malformed",
    ),
}


@pytest.mark.parametrize("case", list(FAILURES), ids=list(FAILURES))
async def test_failures_are_invalid_token(
    auth: Authenticator, policies: PolicySet, clock: FakeClock, case: str
) -> None:
    make, expected_reason = FAILURES[case]
    token = make(clock.now)
    with pytest.raises(GatewayError) as info:
        await auth.authenticate([f"Bearer {token}"], policies)
    exc = info.value
    assert exc.code == "invalid_token"
    assert exc.status == 401
    assert exc.message == "The credential is not valid."
    assert exc.response_headers()["www-authenticate"] == "Bearer"
    assert reason(exc) == expected_reason
    assert_no_leak(exc, token, *filter(None, token.split(".")))


async def test_no_claim_values_in_errors(
    auth: Authenticator, policies: PolicySet, clock: FakeClock
) -> None:
    marker = "leak-marker-4d1f"
    claims: dict[str, Any] = make_claims(now=clock.now, aud=marker, sub=marker)
    with pytest.raises(GatewayError) as info:
        await auth.authenticate([f"Bearer {sign_rs256(claims)}"], policies)
    assert_no_leak(info.value, marker)
