"""Who may call: :class:`AuthConfig`, the list of JWT issuers, and each
:class:`IssuerConfig` (audience, allowed algorithms, exactly one key source,
claim names and token-lifetime bounds). Static API keys are not here; they live
in the tenant policies.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from gateway.config.base import Model, PositiveFloat, PositiveInt, RelPath


class IssuerConfig(Model):
    """One JWT issuer: exactly one of jwks_file, jwks_url, hs256_secret_env."""

    issuer: Annotated[str, Field(min_length=1)] = Field(
        description="The `iss` value its tokens carry.",
    )
    audience: Annotated[str, Field(min_length=1)] = Field(
        description="The `aud` value its tokens must carry.",
    )
    algorithms: Annotated[list[str], Field(min_length=1)] = Field(
        description=(
            "Allowed `alg` values (`none` is never accepted; HS256 only with hs256_secret_env)."
        ),
    )
    jwks_file: RelPath | None = Field(
        None,
        description=(
            "JWKS file with the issuer's public keys (re-read on SIGHUP and on an unknown `kid`)."
        ),
    )
    jwks_url: str | None = Field(
        None,
        description=(
            "JWKS URL (https, or http to a loopback host); fetched at start and on an unknown"
            " `kid`."
        ),
    )
    hs256_secret_env: str | None = Field(
        None,
        description=(
            "Environment variable holding the HS256 secret (at least 32 bytes); never the "
            "secret itself."
        ),
    )
    tenant_claim: str = Field("tenant", description="Claim naming the tenant.")
    scope_claim: str = Field(
        "scope",
        description="Claim holding the scopes (a space-separated string or a list).",
    )
    leeway_s: Annotated[float, Field(ge=0)] = Field(
        30,
        description="Clock skew tolerated on exp, nbf and iat.",
    )
    max_lifetime_s: PositiveFloat = Field(
        3600,
        description="Tokens whose exp - iat exceeds this are refused.",
    )
    jwks_refresh_min_s: Annotated[float, Field(ge=0)] = Field(
        2,
        description="An unknown `kid` re-reads the issuer's keys at most this often.",
    )
    jwks_max_bytes: PositiveInt = Field(
        1_048_576,
        description="Size bound of a JWKS file or download.",
    )

    @field_validator("algorithms")
    @classmethod
    def _allowlist(cls, value: list[str]) -> list[str]:
        allowed = {
            "RS256",
            "RS384",
            "RS512",
            "PS256",
            "PS384",
            "PS512",
            "ES256",
            "ES384",
            "ES512",
            "EdDSA",
            "HS256",
            "HS384",
            "HS512",
        }
        bad = [a for a in value if a not in allowed]
        if bad:
            raise ValueError(
                f"algorithms not allowed: {', '.join(sorted(set(bad)))} ('none' is never accepted)"
            )
        return value

    @model_validator(mode="after")
    def _one_key_source(self) -> IssuerConfig:
        sources = [s for s in (self.jwks_file, self.jwks_url, self.hs256_secret_env) if s]
        if len(sources) != 1:
            raise ValueError("exactly one of jwks_file, jwks_url, hs256_secret_env is required")
        symmetric = {a for a in self.algorithms if a.startswith("HS")}
        if self.hs256_secret_env and set(self.algorithms) != {"HS256"}:
            raise ValueError("hs256_secret_env issuers must list algorithms: [HS256]")
        if not self.hs256_secret_env and symmetric:
            # An HS algorithm next to public keys is the classic key-confusion hole.
            raise ValueError("HS algorithms need hs256_secret_env, not public keys")
        return self


class AuthConfig(Model):
    """Who may call: JWT issuers (static API keys are in the tenant policies)."""

    issuers: list[IssuerConfig] = Field(
        [],
        description="The configured issuers (unique `issuer` values).",
    )

    @field_validator("issuers")
    @classmethod
    def _unique(cls, value: list[IssuerConfig]) -> list[IssuerConfig]:
        names = [i.issuer for i in value]
        if len(names) != len(set(names)):
            raise ValueError("issuer values must be unique")
        return value
