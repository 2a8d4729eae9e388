"""Builders shared by the auth tests: issuers, policies, a fake clock."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from gateway.auth.authenticator import Authenticator
from gateway.auth.keys import load_key_set
from gateway.config import AuthConfig, GatewayConfig, IssuerConfig
from gateway.config.policy import PolicySet, TenantPolicy, build_policy_set
from gateway.core.errors import GatewayError
from tests.support.jwt import AUDIENCE, HS_SECRET, ISSUER, JWKS_PATH

HS_ISSUER = "https://dev.test"
EC_ISSUER = "https://ec.test"
HS_ENV = "GW_TEST_HS256"
ENV = {HS_ENV: HS_SECRET}
START = 1_700_000_000.0
API_KEY = "gw-test-api-key-not-a-secret"


class FakeClock:
    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def rs_issuer(jwks_file: Path = JWKS_PATH, **overrides: Any) -> IssuerConfig:
    data: dict[str, Any] = {
        "issuer": ISSUER,
        "audience": AUDIENCE,
        "algorithms": ["RS256"],
        "jwks_file": jwks_file,
    }
    return IssuerConfig.model_validate({**data, **overrides})


def hs_issuer(**overrides: Any) -> IssuerConfig:
    data: dict[str, Any] = {
        "issuer": HS_ISSUER,
        "audience": AUDIENCE,
        "algorithms": ["HS256"],
        "hs256_secret_env": HS_ENV,
    }
    return IssuerConfig.model_validate({**data, **overrides})


def url_issuer(url: str = "https://idp.test/jwks.json", **overrides: Any) -> IssuerConfig:
    return rs_issuer(**{"jwks_file": None, "jwks_url": url, **overrides})


def auth_config(*issuers: IssuerConfig) -> AuthConfig:
    return AuthConfig(issuers=list(issuers))


def policy_set(
    *,
    tenants: tuple[str, ...] = ("acme",),
    endpoints: list[str] | None = None,
    api_keys: dict[str, str] | None = None,
    issuers: list[str] | None = None,
) -> PolicySet:
    """Policies for ``tenants``; ``api_keys`` maps a key's name to its plaintext."""
    config = GatewayConfig.model_validate({"upstream": {"route": "/srv/models/x"}})
    keys = [
        {"name": name, "sha256": hashlib.sha256(plain.encode()).hexdigest()}
        for name, plain in (api_keys or {}).items()
    ]
    policies = [
        TenantPolicy.model_validate(
            {
                "tenant": name,
                "endpoints": endpoints or ["chat.completions", "completions", "models", "evidence"],
                "api_keys": keys if index == 0 else [],
                "issuers": issuers,
            }
        )
        for index, name in enumerate(tenants)
    ]
    return build_policy_set(policies, config)


def authenticator(*issuers: IssuerConfig, clock: FakeClock, **kwargs: Any) -> Authenticator:
    auth = auth_config(*issuers)
    return Authenticator(load_key_set(auth, ENV), clock=clock, **kwargs)


def reason(exc: GatewayError) -> str:
    """The fixed reason word chained under an invalid_token error."""
    cause = exc.__cause__
    return str(getattr(cause, "reason", ""))


def assert_no_leak(exc: GatewayError, *secrets: str) -> None:
    texts = [str(exc), exc.message, repr(exc), str(exc.body()), str(exc.__cause__)]
    for secret in secrets:
        for text in texts:
            assert secret not in text


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def policies() -> PolicySet:
    return policy_set(api_keys={"nightly": API_KEY})
