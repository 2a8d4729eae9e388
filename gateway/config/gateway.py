"""gateway.yaml as a whole: :class:`GatewayConfig`, one field per section (each
section's model lives in its own module of this package), and the cross-field
rules that need more than one section (:meth:`GatewayConfig._cross_checks`);
policy-vs-config rules live in ``policy.py``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from gateway.config.agents import GatewayAgents
from gateway.config.auth import AuthConfig
from gateway.config.base import Model, RelPath
from gateway.config.limits import AdmissionConfig, LimitsConfig, LimitsStoreConfig
from gateway.config.listen import CorsConfig, ListenConfig
from gateway.config.media import ImagesConfig, ServerConfig, SpeechConfig
from gateway.config.observe import AuditConfig, LoggingConfig, MetricsConfig
from gateway.config.releases import ReleaseConfig
from gateway.config.responses import ResponsesConfig
from gateway.config.staging import StagingConfig
from gateway.config.state import StateConfig
from gateway.config.upstream import RouteKind, UpstreamConfig


class GatewayConfig(Model):
    """gateway.yaml: one typed object, validated whole before anything starts."""

    listen: ListenConfig = Field(ListenConfig(), description="The callers' listener.")
    upstream: UpstreamConfig | None = Field(
        None,
        description=(
            "One worker (the shorthand: one `route`, named `default` unless `name` says "
            "otherwise); or `upstreams`."
        ),
    )
    upstreams: list[UpstreamConfig] | None = Field(
        None,
        description="Several workers (spec §16), each with a `name` and its `routes`.",
    )
    auth: AuthConfig = Field(AuthConfig(), description="Token issuers and API-key settings.")
    policies_dir: RelPath = Field(
        Path("policies"),
        description="Directory of the tenant policies (`<tenant>.yaml`), relative to the config.",
    )
    staging: StagingConfig = Field(
        StagingConfig(), description="Evidence staging: files, catalog, uploads."
    )
    admission: AdmissionConfig = Field(
        AdmissionConfig(), description="Weighted admission permits and their queue."
    )
    limits: LimitsConfig = Field(
        LimitsConfig(), description="Gateway-wide ceilings over every tenant's limits."
    )
    cors: CorsConfig = Field(CorsConfig(), description="Exact-origin CORS.")
    audit: AuditConfig = Field(AuditConfig(), description="Receipts: the audit file.")
    metrics: MetricsConfig = Field(MetricsConfig(), description="Prometheus metrics.")
    responses: ResponsesConfig = Field(
        ResponsesConfig(), description="Responses API ids the gateway keeps."
    )
    logging: LoggingConfig = Field(LoggingConfig(), description="Operator logs (stderr).")
    limits_store: LimitsStoreConfig = Field(
        LimitsStoreConfig(),
        description="Where tenant rate limits are counted: this process, or Redis (spec §15).",
    )

    releases: list[ReleaseConfig] = Field(
        [], description="Canary releases: an alias naming a stable and a canary route (§18)."
    )
    state: StateConfig = Field(
        StateConfig(),
        description="Evidence, leases, kept responses: SQLite (one replica) or PostgreSQL (§17).",
    )
    server: ServerConfig = Field(
        ServerConfig(), description="How callers reach this gateway (its public base URL)."
    )
    images: ImagesConfig = Field(
        ImagesConfig(), description="POST /v1/images/generations: counts, sizes, links (§23)."
    )
    speech: SpeechConfig = Field(
        SpeechConfig(), description="POST /v1/audio/speech: input and output bounds (§23)."
    )
    agents: GatewayAgents = Field(
        GatewayAgents(),
        description="Agents (§22): the session key, pinned names, ceilings of policies' agents.",
    )

    @model_validator(mode="after")
    def _cross_checks(self) -> GatewayConfig:
        if (self.upstream is None) == (self.upstreams is None):
            raise ValueError("give exactly one of upstream (one worker) or upstreams")
        if self.upstream is not None and self.upstream.routes:
            raise ValueError("upstream (the one-worker form) takes route, not routes")
        if self.upstreams is not None:
            if not self.upstreams:
                raise ValueError("upstreams must list at least one worker")
            if any(u.route is not None for u in self.upstreams):
                raise ValueError("each entry of upstreams takes routes, not route")
            names = [u.name for u in self.upstreams]
            if len(names) != len(set(names)):
                raise ValueError("upstream names must be unique")
            routes = [r for u in self.upstreams for r in u.served_routes]
            if len(routes) != len(set(routes)):
                raise ValueError("each route must be served by exactly one upstream")
            ports = [u.launch.port for u in self.upstreams if u.launch is not None]
            if len(ports) != len(set(ports)):
                raise ValueError("each launched worker needs its own port")
        served = set(self.routes)
        names = [r.name for r in self.releases]
        if len(names) != len(set(names)):
            raise ValueError("release names must be unique")
        kinds = self.route_kinds
        for release in self.releases:
            for arm in ("stable", "canary"):
                if getattr(release, arm) not in served:
                    raise ValueError(
                        f"releases.{release.name}.{arm} must be a route an upstream serves"
                    )
            if kinds[release.stable] != kinds[release.canary]:
                # One alias, one capability: a fallback must serve what the plan asked.
                raise ValueError(f"releases.{release.name}: stable and canary differ in kind")
        # base64 grows bytes by 4/3; the forwarded body must fit every worker's limit.
        media = self.limits.max_media_bytes * 4 // 3
        smallest = min(u.max_request_bytes for u in self.workers)
        if self.staging.worker_media == "data_url" and media > smallest:
            raise ValueError(
                "limits.max_media_bytes x 4/3 exceeds upstream.max_request_bytes (data_url mode)"
            )
        return self

    @property
    def workers(self) -> list[UpstreamConfig]:
        """Every configured worker (``upstreams``, or the one ``upstream``)."""
        if self.upstreams is not None:
            return list(self.upstreams)
        assert self.upstream is not None
        return [self.upstream]

    @property
    def routes(self) -> dict[str, UpstreamConfig]:
        """Route -> the worker serving it."""
        return {route: u for u in self.workers for route in u.served_routes}

    @property
    def route_kinds(self) -> dict[str, RouteKind]:
        """Route -> what it serves (spec §23)."""
        return {route: kind for u in self.workers for route, kind in u.route_kinds.items()}
