"""Tenant policies (spec §4): typed models and the effective per-tenant view.

A :class:`Tenant` is a policy with its limits resolved against the global
ceilings. A :class:`PolicySet` is the immutable set the app serves from; a
reload builds a whole new one and swaps it in, so a request keeps the set it
started with. Pure: no I/O here (files are read in ``loader.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import Field, field_validator

from gateway.config import GatewayConfig, Hex64, LimitsConfig, Model, PositiveFloat, PositiveInt

Endpoint = Literal[
    "chat.completions", "completions", "responses", "embeddings", "models", "evidence"
]
Modality = Literal["text", "image", "audio", "video"]
MEDIA_MODALITIES: tuple[Modality, ...] = ("image", "audio", "video")

TENANT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"


class ApiKey(Model):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    sha256: Hex64


class PolicyLimits(Model):
    max_body_bytes: PositiveInt | None = None
    max_prompt_bytes: PositiveInt | None = None
    max_media_parts: Annotated[int, Field(ge=0)] | None = None
    max_media_bytes: PositiveInt | None = None
    max_output_tokens: PositiveInt | None = None
    max_json_depth: PositiveInt | None = None
    max_embedding_inputs: PositiveInt | None = None
    requests_per_minute: PositiveInt | None = None
    tokens_per_minute: PositiveInt | None = None
    tokens_per_day: PositiveInt | None = None  # UTC day (spec §15)
    max_concurrent_requests: PositiveInt | None = None  # in flight, across replicas


class PolicyAdmission(Model):
    share: PositiveFloat = 1
    max_permits: PositiveInt = 4
    queue_timeout_s: PositiveFloat = 5


class Cost(Model):
    base: Annotated[int, Field(ge=0)] = 1
    image: Annotated[int, Field(ge=0)] = 1
    audio: Annotated[int, Field(ge=0)] = 1
    video: Annotated[int, Field(ge=0)] = 2


class MediaPolicy(Model):
    caller_urls: Literal["reject", "drop"] = "reject"
    inline_data: Literal["reject", "stage"] = "reject"


class EvidencePolicy(Model):
    """Per-tenant evidence quotas (spec §13)."""

    max_bytes: PositiveInt = 1_073_741_824
    max_records: PositiveInt = 10_000
    ttl_s: Annotated[int, Field(ge=0)] = 0  # 0: kept until deleted


class TenantPolicy(Model):
    tenant: Annotated[str, Field(pattern=TENANT_NAME)]
    models: dict[str, str] = {}
    endpoints: list[Endpoint] = ["chat.completions", "completions", "models"]
    modalities: list[Modality] = ["text"]
    api_keys: list[ApiKey] = []
    limits: PolicyLimits = PolicyLimits()
    admission: PolicyAdmission = PolicyAdmission()
    cost: Cost = Cost()
    media: MediaPolicy = MediaPolicy()
    evidence: EvidencePolicy = EvidencePolicy()
    #: issuer values whose tokens may act for this tenant (absent: any configured issuer)
    issuers: list[str] | None = None

    @field_validator("models")
    @classmethod
    def _aliases(cls, value: dict[str, str]) -> dict[str, str]:
        if "default" in value:
            raise ValueError("'default' is not an alias (the worker treats it specially)")
        return value


@dataclass(frozen=True, slots=True)
class EffectiveLimits:
    max_body_bytes: int
    max_prompt_bytes: int
    max_media_parts: int
    max_media_bytes: int
    max_output_tokens: int
    max_json_depth: int
    max_embedding_inputs: int
    requests_per_minute: int | None
    tokens_per_minute: int | None
    tokens_per_day: int | None = None
    max_concurrent_requests: int | None = None


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    policy: TenantPolicy
    limits: EffectiveLimits

    def allows_endpoint(self, endpoint: str) -> bool:
        return endpoint in self.policy.endpoints

    def allows_modality(self, modality: str) -> bool:
        return modality in self.policy.modalities


@dataclass(frozen=True, slots=True)
class ApiKeyEntry:
    tenant: str
    name: str


@dataclass(frozen=True)
class PolicySet:
    tenants: dict[str, Tenant]
    #: SHA-256 hex of a static key -> owner; matched in constant time in auth/apikeys.py
    api_keys: dict[str, ApiKeyEntry] = field(default_factory=dict)


_CEILINGS = (
    "max_body_bytes",
    "max_prompt_bytes",
    "max_media_parts",
    "max_media_bytes",
    "max_output_tokens",
    "max_json_depth",
    "max_embedding_inputs",
)


def resolve_limits(policy: PolicyLimits, ceilings: LimitsConfig) -> EffectiveLimits:
    values: dict[str, int] = {}
    for name in _CEILINGS:
        own: int | None = getattr(policy, name)
        values[name] = getattr(ceilings, name) if own is None else own
    return EffectiveLimits(
        **values,
        requests_per_minute=policy.requests_per_minute,
        tokens_per_minute=policy.tokens_per_minute,
        tokens_per_day=policy.tokens_per_day,
        max_concurrent_requests=policy.max_concurrent_requests,
    )


def check_policy(policy: TenantPolicy, stem: str, config: GatewayConfig) -> list[tuple[str, str]]:
    """Rules between one policy and the gateway config: (key, problem) pairs."""
    problems: list[tuple[str, str]] = []
    if policy.tenant != stem:
        problems.append(("tenant", f"must equal the file name stem {stem!r}"))
    for alias, route in policy.models.items():
        if route not in config.routes:
            problems.append((f"models.{alias}", "must be a route an upstream serves"))
    for name in _CEILINGS:
        own = getattr(policy.limits, name)
        ceiling = getattr(config.limits, name)
        if own is not None and own > ceiling:
            problems.append((f"limits.{name}", f"{own} exceeds the global ceiling {ceiling}"))
    # (max_media_bytes x 4/3 against the worker's body limit: checked once, on
    # the global ceiling this value is bounded by; GatewayConfig._cross_checks.)
    names = [k.name for k in policy.api_keys]
    if len(names) != len(set(names)):
        problems.append(("api_keys", "key names must be unique"))
    configured = {i.issuer for i in config.auth.issuers}
    for index, issuer in enumerate(policy.issuers or []):
        if issuer not in configured:
            problems.append((f"issuers.{index}", "is not a configured auth issuer"))
    return problems


def build_policy_set(policies: list[TenantPolicy], config: GatewayConfig) -> PolicySet:
    tenants = {
        p.tenant: Tenant(p.tenant, p, resolve_limits(p.limits, config.limits)) for p in policies
    }
    keys = {k.sha256: ApiKeyEntry(p.tenant, k.name) for p in policies for k in p.api_keys}
    return PolicySet(tenants=tenants, api_keys=keys)
