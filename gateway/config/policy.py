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
from gateway.config.agents import PolicyAgents
from gateway.config.releases import RELEASE_PREFIX

Endpoint = Literal[
    "chat.completions",
    "completions",
    "responses",
    "embeddings",
    "messages",
    "images",
    "speech",
    "models",
    "evidence",
]
Modality = Literal["text", "image", "audio", "video"]
#: what a credential may be for (spec §4; ``metrics``: ``/metrics`` on the callers' port, §24)
Scope = Literal["inference", "evidence", "metrics"]
#: what a static API key carries unless its entry lists ``scopes``
API_KEY_SCOPES: tuple[Scope, ...] = ("inference", "evidence")
MEDIA_MODALITIES: tuple[Modality, ...] = ("image", "audio", "video")

TENANT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"


class ApiKey(Model):
    """A static API key; only its SHA-256 is stored."""

    name: Annotated[str, Field(min_length=1, max_length=64)] = Field(
        description="Key name (receipts name the subject `apikey:<name>`).",
    )
    sha256: Hex64 = Field(
        description='SHA-256 of the key, 64 lowercase hex (`printf %s "$KEY" | sha256sum`).',
    )
    scopes: list[Scope] = Field(
        list(API_KEY_SCOPES),
        min_length=1,
        description=(
            "What the key carries, exactly: `inference` and `evidence` unless listed; "
            "`[metrics]` for a scraper of /metrics on the callers' port (spec §24)."
        ),
    )


class PolicyLimits(Model):
    """The tenant's limits; an absent one takes the global ceiling (limits.*), or none for the
    rates.
    """

    max_body_bytes: PositiveInt | None = Field(
        None,
        description="Lowers limits.max_body_bytes for this tenant.",
    )
    max_prompt_bytes: PositiveInt | None = Field(
        None,
        description="Lowers limits.max_prompt_bytes for this tenant.",
    )
    max_media_parts: Annotated[int, Field(ge=0)] | None = Field(
        None,
        description="Lowers limits.max_media_parts for this tenant.",
    )
    max_media_bytes: PositiveInt | None = Field(
        None,
        description="Lowers limits.max_media_bytes for this tenant.",
    )
    max_output_tokens: PositiveInt | None = Field(
        None,
        description="Lowers limits.max_output_tokens for this tenant.",
    )
    max_json_depth: PositiveInt | None = Field(
        None,
        description="Lowers limits.max_json_depth for this tenant.",
    )
    max_embedding_inputs: PositiveInt | None = Field(
        None,
        description="Lowers limits.max_embedding_inputs for this tenant.",
    )
    requests_per_minute: PositiveInt | None = Field(
        None,
        description="Requests per minute (evidence uploads count too); absent: unlimited.",
    )
    tokens_per_minute: PositiveInt | None = Field(
        None,
        description=(
            "Tokens per minute (reserved at max_tokens plus a prompt estimate, settled on usage)."
        ),
    )
    tokens_per_day: PositiveInt | None = Field(
        None,
        description="Tokens per UTC day (spec section 15).",
    )
    max_concurrent_requests: PositiveInt | None = Field(
        None,
        description="Requests in flight, across replicas (spec section 15).",
    )


class PolicyAdmission(Model):
    """The tenant's part of the admission permits."""

    share: PositiveFloat = Field(
        1,
        description="Weight in fair sharing when permits are contended.",
    )
    max_permits: PositiveInt = Field(4, description="At most this many permit units at once.")
    queue_timeout_s: PositiveFloat = Field(
        5,
        description="A request waiting longer for permits gets 429 admission_timeout.",
    )


class Cost(Model):
    """Permit units one request takes: base plus one amount per media part; an
    image generation or a speech request takes its own amount instead (spec §23)."""

    base: Annotated[int, Field(ge=0)] = Field(1, description="Units of every request.")
    image: Annotated[int, Field(ge=0)] = Field(1, description="Units per image part.")
    audio: Annotated[int, Field(ge=0)] = Field(1, description="Units per audio part.")
    video: Annotated[int, Field(ge=0)] = Field(2, description="Units per video part.")
    image_generation: Annotated[int, Field(ge=0)] = Field(
        4, description="Units of each image generated (each of `n` is its own worker call)."
    )
    speech: Annotated[int, Field(ge=0)] = Field(2, description="Units of a speech request.")


class MediaPolicy(Model):
    """What happens to media URLs a caller wrote (never forwarded)."""

    caller_urls: Literal["reject", "drop"] = Field(
        "reject",
        description=(
            "A caller URL: reject (400 caller_url_forbidden) or drop (removed, listed in the "
            "receipt)."
        ),
    )
    inline_data: Literal["reject", "stage"] = Field(
        "reject",
        description=(
            "A data: URL: reject, or stage (decoded within the limits, staged, rewritten)."
        ),
    )


class EvidencePolicy(Model):
    """Per-tenant evidence quotas (spec §13)."""

    max_bytes: PositiveInt = Field(
        1_073_741_824,
        description="Sum of the bytes of the tenant's records.",
    )
    max_records: PositiveInt = Field(10_000, description="Records the tenant may hold.")
    ttl_s: Annotated[int, Field(ge=0)] = Field(
        0,
        description="0: kept until deleted; else forgotten after this many seconds.",
    )


class ResponsesPolicy(Model):
    """The tenant's kept Responses answers and conversations (spec §17)."""

    max_bytes: PositiveInt = Field(
        268_435_456,
        description=(
            "Bytes of kept responses (input items, output items, bodies); past it the "
            "tenant's oldest are forgotten first."
        ),
    )


class TenantPolicy(Model):
    """One tenant's policy: `policies/<tenant>.yaml`."""

    tenant: Annotated[str, Field(pattern=TENANT_NAME)] = Field(
        description="Tenant name; must equal the file's stem.",
    )
    models: dict[str, str] = Field(
        {}, description='Caller-facing alias -> exact upstream route, or "release:<name>" (§18).'
    )
    endpoints: list[Endpoint] = Field(
        ["chat.completions", "completions", "models"],
        description="Endpoints the tenant may call.",
    )
    modalities: list[Modality] = Field(
        ["text"],
        description="Content the tenant may send (text is a modality like the others).",
    )
    api_keys: list[ApiKey] = Field(
        [],
        description="Static API keys (their scopes, limited by endpoints).",
    )
    limits: PolicyLimits = Field(PolicyLimits(), description="The tenant's limits.")
    admission: PolicyAdmission = Field(
        PolicyAdmission(),
        description="The tenant's part of the admission permits.",
    )
    cost: Cost = Field(Cost(), description="Permit units per request.")
    media: MediaPolicy = Field(MediaPolicy(), description="Caller URLs and inline data.")
    evidence: EvidencePolicy = Field(EvidencePolicy(), description="Evidence quotas.")
    responses: ResponsesPolicy = Field(
        ResponsesPolicy(), description="Kept Responses answers and conversations."
    )
    usage_details: Literal["counts", "full"] = Field(
        "counts",
        description=(
            "What callers see of the worker's usage: the token counts, or every field it "
            "reported (cache hits, timings: only for a tenant that has the worker to itself; "
            "spec §21). Receipts keep every field."
        ),
    )
    issuers: list[str] | None = Field(
        None,
        description=(
            "Issuer values whose tokens may act for this tenant (absent: any configured issuer)."
        ),
    )
    agents: PolicyAgents | None = Field(
        None,
        description=(
            "The tools this tenant may have the worker run (spec §22); absent: every agentic "
            "field is unsupported_field."
        ),
    )

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
    scopes: frozenset[str] = frozenset(API_KEY_SCOPES)


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
    served = config.routes  # built on each access: once per policy, not per alias
    releases = {RELEASE_PREFIX + r.name for r in config.releases}
    for alias, route in policy.models.items():
        if route.startswith(RELEASE_PREFIX):
            if route not in releases:
                problems.append((f"models.{alias}", "must name a configured release"))
        elif route not in served:
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
    if policy.agents is not None:
        problems += _agents_problems(policy, config)
    return problems


def _agents_problems(policy: TenantPolicy, config: GatewayConfig) -> list[tuple[str, str]]:
    """The policy's agents against the gateway's ceilings and the rounds of
    every agentic route its aliases reach (a release reaches both arms)."""
    agents = policy.agents
    assert agents is not None
    ceilings = config.agents
    problems: list[tuple[str, str]] = []
    for key, own, ceiling in (
        ("agents.max_run_s", agents.max_run_s, ceilings.max_run_s),
        (
            "agents.reserve_tokens_per_round",
            agents.reserve_tokens_per_round,
            ceilings.max_reserve_tokens_per_round,
        ),
        ("agents.files.max_bytes", agents.files.max_bytes, ceilings.files.max_bytes),
        ("agents.files.max_count", agents.files.max_count, ceilings.files.max_count),
    ):
        if own > ceiling:
            problems.append((key, f"{own} exceeds the gateway's ceiling {ceiling}"))
    served = config.routes
    arms = {RELEASE_PREFIX + r.name: (r.stable, r.canary) for r in config.releases}
    for target in policy.models.values():
        for route in arms.get(target, (target,)):
            worker = served.get(route)
            route_agents = worker.agents if worker is not None else None
            if route_agents is not None and agents.max_tool_rounds > route_agents.max_tool_rounds:
                problems.append(
                    (
                        "agents.max_tool_rounds",
                        f"{agents.max_tool_rounds} exceeds route {route}'s max_tool_rounds "
                        f"{route_agents.max_tool_rounds}",
                    )
                )
    return problems


def build_policy_set(policies: list[TenantPolicy], config: GatewayConfig) -> PolicySet:
    tenants = {
        p.tenant: Tenant(p.tenant, p, resolve_limits(p.limits, config.limits)) for p in policies
    }
    keys = {
        k.sha256: ApiKeyEntry(p.tenant, k.name, frozenset(k.scopes))
        for p in policies
        for k in p.api_keys
    }
    return PolicySet(tenants=tenants, api_keys=keys)
