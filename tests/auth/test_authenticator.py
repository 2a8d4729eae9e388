"""The Authenticator end to end: header parsing, tenants, cache, authorize, minting."""

from __future__ import annotations

import jwt
import pytest

from gateway.auth.authenticator import Authenticator, authorize, mint_dev_token
from gateway.auth.keys import load_key_set
from gateway.auth.principal import Principal
from gateway.auth.tokens import Routed, verify
from gateway.config.policy import PolicySet
from gateway.core.errors import GatewayError
from tests.auth.conftest import (
    API_KEY,
    ENV,
    HS_ENV,
    HS_ISSUER,
    FakeClock,
    assert_no_leak,
    auth_config,
    authenticator,
    hs_issuer,
    policy_set,
    reason,
    rs_issuer,
)
from tests.support.jwt import HS_SECRET, ISSUER, make_claims, sign_hs256, sign_rs256


@pytest.fixture
def auth(clock: FakeClock) -> Authenticator:
    return authenticator(rs_issuer(), hs_issuer(), clock=clock)


@pytest.fixture
def verify_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def counting(token: str, routed: Routed, now: float) -> Principal:
        calls.append(token)
        return verify(token, routed, now)

    monkeypatch.setattr("gateway.auth.authenticator.verify", counting)
    return calls


# -- credentials --------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [""],
        ["Bearer"],
        ["Bearer    "],
        ["Basic dXNlcjpwYXNz"],
        ["Token abc"],
        [API_KEY],
        [f"Bearer {API_KEY}", f"Bearer {API_KEY}"],
        [f"Bearer {API_KEY}", ""],
    ],
)
async def test_missing_credentials(
    auth: Authenticator, policies: PolicySet, headers: list[str]
) -> None:
    with pytest.raises(GatewayError) as info:
        await auth.authenticate(headers, policies)
    assert info.value.code == "missing_credentials"
    assert info.value.status == 401
    assert info.value.response_headers() == {"www-authenticate": "Bearer"}
    assert_no_leak(info.value, API_KEY)


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
async def test_scheme_is_case_insensitive(
    auth: Authenticator, policies: PolicySet, scheme: str
) -> None:
    principal = await auth.authenticate([f"{scheme}  {API_KEY} "], policies)
    assert principal.kind == "api_key"


async def test_api_key_miss(auth: Authenticator, policies: PolicySet) -> None:
    with pytest.raises(GatewayError) as info:
        await auth.authenticate(["Bearer not-a-configured-key"], policies)
    assert info.value.code == "invalid_token"
    assert_no_leak(info.value, "not-a-configured-key")


async def test_oversized_bearer(auth: Authenticator, policies: PolicySet) -> None:
    with pytest.raises(GatewayError) as info:
        await auth.authenticate(["Bearer " + "a" * 20_000], policies)
    assert info.value.code == "invalid_token"


async def test_unknown_tenant(auth: Authenticator, policies: PolicySet, clock: FakeClock) -> None:
    token = sign_rs256(make_claims(now=clock.now, tenant="globex"))
    with pytest.raises(GatewayError) as info:
        await auth.authenticate([f"Bearer {token}"], policies)
    assert info.value.code == "tenant_not_configured"
    assert info.value.status == 403
    assert_no_leak(info.value, token, "globex")


async def test_tenant_checked_against_the_policies_given(
    auth: Authenticator, clock: FakeClock
) -> None:
    token = sign_rs256(make_claims(now=clock.now, tenant="globex"))
    both = policy_set(tenants=("acme", "globex"))
    assert (await auth.authenticate([f"Bearer {token}"], both)).tenant == "globex"
    with pytest.raises(GatewayError, match="tenant_not_configured"):
        await auth.authenticate([f"Bearer {token}"], policy_set())


# -- cache ----------------------------------------------------------------------


async def test_cache_hit(
    auth: Authenticator, policies: PolicySet, clock: FakeClock, verify_calls: list[str]
) -> None:
    token = sign_rs256(make_claims(now=clock.now))
    first = await auth.authenticate([f"Bearer {token}"], policies)
    clock.advance(100)
    assert await auth.authenticate([f"Bearer {token}"], policies) is first
    assert len(verify_calls) == 1


async def test_cache_does_not_outlive_exp(
    auth: Authenticator, policies: PolicySet, clock: FakeClock, verify_calls: list[str]
) -> None:
    token = sign_rs256(make_claims(now=clock.now, ttl=60))
    await auth.authenticate([f"Bearer {token}"], policies)
    clock.advance(60)
    # Past exp the token is verified afresh: the leeway (30 s) still admits it.
    await auth.authenticate([f"Bearer {token}"], policies)
    assert len(verify_calls) == 2
    clock.advance(30)
    with pytest.raises(GatewayError) as info:
        await auth.authenticate([f"Bearer {token}"], policies)
    assert reason(info.value) == "expired"


async def test_cache_is_bounded(
    clock: FakeClock, policies: PolicySet, verify_calls: list[str]
) -> None:
    auth = authenticator(rs_issuer(), clock=clock, cache_size=2)
    tokens = [sign_rs256(make_claims(now=clock.now, sub=f"u{i}")) for i in range(3)]
    for token in tokens:
        await auth.authenticate([f"Bearer {token}"], policies)
    await auth.authenticate([f"Bearer {tokens[2]}"], policies)
    await auth.authenticate([f"Bearer {tokens[1]}"], policies)
    assert len(verify_calls) == 3
    await auth.authenticate([f"Bearer {tokens[0]}"], policies)
    assert len(verify_calls) == 4


async def test_cache_disabled(
    clock: FakeClock, policies: PolicySet, verify_calls: list[str]
) -> None:
    auth = authenticator(rs_issuer(), clock=clock, cache_size=0)
    token = sign_rs256(make_claims(now=clock.now))
    for _ in range(2):
        await auth.authenticate([f"Bearer {token}"], policies)
    assert len(verify_calls) == 2


async def test_failures_are_not_cached(
    auth: Authenticator, policies: PolicySet, clock: FakeClock, verify_calls: list[str]
) -> None:
    token = sign_rs256(make_claims(now=clock.now, nbf=clock.now + 60))
    with pytest.raises(GatewayError):
        await auth.authenticate([f"Bearer {token}"], policies)
    clock.advance(60)
    await auth.authenticate([f"Bearer {token}"], policies)
    assert len(verify_calls) == 2


async def test_swap_clears_cache(
    auth: Authenticator, policies: PolicySet, clock: FakeClock, verify_calls: list[str]
) -> None:
    token = sign_rs256(make_claims(now=clock.now))
    await auth.authenticate([f"Bearer {token}"], policies)
    auth.swap(load_key_set(auth_config(rs_issuer(), hs_issuer()), ENV))
    await auth.authenticate([f"Bearer {token}"], policies)
    assert len(verify_calls) == 2


# -- authorize ------------------------------------------------------------------


def _principal(scopes: set[str], tenant: str = "acme", issuer: str | None = None) -> Principal:
    return Principal(tenant, "u", frozenset(scopes), "jwt", None, issuer)


#: the scope each endpoint needs (the descriptors and routes carry their own)
SCOPES = {
    "chat.completions": "inference",
    "completions": "inference",
    "responses": "inference",
    "embeddings": "inference",
    "models": "inference",
    "evidence": "evidence",
    "admin.reload": "inference",
}


@pytest.mark.parametrize(
    ("endpoint", "scope"),
    [
        ("chat.completions", "inference"),
        ("completions", "inference"),
        ("models", "inference"),
        ("evidence", "evidence"),
    ],
)
def test_authorize_ok_and_insufficient_scope(endpoint: str, scope: str) -> None:
    tenant = policy_set().tenants["acme"]
    authorize(_principal({scope}), tenant, endpoint, SCOPES[endpoint])
    other = ({"inference", "evidence"} - {scope}) | {"admin"}
    with pytest.raises(GatewayError) as info:
        authorize(_principal(other), tenant, endpoint, SCOPES[endpoint])
    assert info.value.code == "insufficient_scope"
    assert info.value.status == 403


def test_endpoint_not_allowed() -> None:
    tenant = policy_set(endpoints=["chat.completions"]).tenants["acme"]
    everything = _principal({"inference", "evidence"})
    authorize(everything, tenant, "chat.completions", "inference")
    for endpoint in ("completions", "models", "evidence", "admin.reload"):
        with pytest.raises(GatewayError) as info:
            authorize(everything, tenant, endpoint, SCOPES[endpoint])
        assert info.value.code == "endpoint_not_allowed"


def test_authorize_refuses_another_tenants_principal() -> None:
    tenant = policy_set().tenants["acme"]
    with pytest.raises(GatewayError, match="tenant_not_configured"):
        authorize(_principal({"inference"}, tenant="globex"), tenant, "models", "inference")


def test_issuers_listed_in_the_policy_are_the_only_ones_for_its_tenant() -> None:
    tenant = policy_set(issuers=[HS_ISSUER]).tenants["acme"]
    authorize(_principal({"inference"}, issuer=HS_ISSUER), tenant, "models", "inference")
    with pytest.raises(GatewayError) as info:
        authorize(_principal({"inference"}, issuer=ISSUER), tenant, "models", "inference")
    assert (info.value.code, info.value.status) == ("issuer_not_allowed", 403)
    # Absent means any configured issuer.
    anyone = policy_set().tenants["acme"]
    authorize(_principal({"inference"}, issuer=ISSUER), anyone, "models", "inference")


async def test_api_key_limited_by_endpoints(auth: Authenticator) -> None:
    policies = policy_set(endpoints=["chat.completions"], api_keys={"nightly": API_KEY})
    principal = await auth.authenticate([f"Bearer {API_KEY}"], policies)
    tenant = policies.tenants["acme"]
    authorize(principal, tenant, "chat.completions", "inference")
    with pytest.raises(GatewayError, match="endpoint_not_allowed"):
        authorize(principal, tenant, "evidence", "evidence")


# -- mint_dev_token -------------------------------------------------------------


async def test_mint_round_trips(policies: PolicySet) -> None:
    config = auth_config(rs_issuer(), hs_issuer())
    auth = Authenticator(load_key_set(config, ENV))
    token = mint_dev_token(config, "acme", scopes=["inference"], ttl_s=600, env=ENV)
    principal = await auth.authenticate([f"Bearer {token}"], policies)
    claims = jwt.decode(token, HS_SECRET, algorithms=["HS256"], audience="mistralrs-gateway")
    assert principal == Principal(
        "acme", "dev", frozenset({"inference"}), "jwt", claims["exp"], HS_ISSUER
    )
    assert claims["exp"] - claims["iat"] == 600
    assert claims["iss"] == HS_ISSUER
    assert claims["scope"] == "inference"


def test_mint_picks_issuer_and_claim_names() -> None:
    second = hs_issuer(
        issuer="https://dev2.test",
        hs256_secret_env="GW_TEST_HS_2",
        tenant_claim="org",
        scope_claim="scp",
    )
    config = auth_config(rs_issuer(), hs_issuer(), second)
    env = {**ENV, "GW_TEST_HS_2": "another-test-only-secret-of-32-bytes+"}
    token = mint_dev_token(
        config,
        "acme",
        scopes=["inference", "evidence"],
        ttl_s=60,
        issuer="https://dev2.test",
        env=env,
        subject="ci",
    )
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["iss"] == "https://dev2.test"
    assert claims["org"] == "acme"
    assert claims["scp"] == "inference evidence"
    assert claims["sub"] == "ci"
    default = jwt.decode(
        mint_dev_token(config, "acme", scopes=[], ttl_s=60, env=env),
        options={"verify_signature": False},
    )
    assert default["iss"] == HS_ISSUER


@pytest.mark.parametrize(
    ("config_issuers", "kwargs", "message"),
    [
        ("rs", {}, "no HS256"),
        ("both", {"issuer": "https://idp.test"}, "no HS256"),
        ("both", {"ttl_s": 3601}, "exceeds max_lifetime_s"),
        ("both", {"ttl_s": 0}, "positive"),
        ("both", {"env": {}}, f"{HS_ENV} is not set"),
        ("both", {"env": {HS_ENV: "short"}}, "shorter than 32 bytes"),
    ],
)
def test_mint_refusals(config_issuers: str, kwargs: dict[str, object], message: str) -> None:
    issuers = [rs_issuer()] if config_issuers == "rs" else [rs_issuer(), hs_issuer()]
    args: dict[str, object] = {"ttl_s": 60, "env": ENV, **kwargs}
    with pytest.raises(ValueError, match=message) as info:
        mint_dev_token(auth_config(*issuers), "acme", scopes=["inference"], **args)  # type: ignore[arg-type]
    assert "short" not in str(info.value).replace("shorter", "")


async def test_hs256_token_claiming_hs_issuer_with_wrong_tenant_claim(
    auth: Authenticator, policies: PolicySet, clock: FakeClock
) -> None:
    token = sign_hs256(make_claims(iss=HS_ISSUER, now=clock.now, tenant=None, org="acme"))
    with pytest.raises(GatewayError) as info:
        await auth.authenticate([f"Bearer {token}"], policies)
    assert reason(info.value) == "missing_tenant"
