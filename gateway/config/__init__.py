"""One typed config object (spec §3, §15), split by subsystem.

Each module of this package holds one subsystem's frozen pydantic models:
``base`` the shared model and field types, ``listen``, ``launch``, ``upstream``, ``agents``,
``auth``, ``staging``, ``limits``, ``observe``, ``responses``, ``media`` (images,
speech and the public base URL), and ``gateway``
the whole :class:`GatewayConfig`; this package re-exports every public name so
callers import from ``gateway.config``. Layer: may import only ``gateway.core``
and ``gateway.types``.
"""

from __future__ import annotations

from gateway.config.agents import (
    AgentFiles,
    AgentWeb,
    GatewayAgents,
    PolicyAgents,
    RouteAgents,
)
from gateway.config.auth import AuthConfig, IssuerConfig
from gateway.config.base import Hex64, Model, PositiveFloat, PositiveInt, RelPath
from gateway.config.gateway import GatewayConfig
from gateway.config.launch import LaunchConfig, ModelLaunch
from gateway.config.limits import AdmissionConfig, LimitsConfig, LimitsStoreConfig
from gateway.config.listen import CorsConfig, ListenConfig, TLSConfig
from gateway.config.media import ImagesConfig, ServerConfig, SpeechConfig
from gateway.config.observe import AuditConfig, LoggingConfig, MetricsConfig, MetricsListen
from gateway.config.responses import ResponsesConfig
from gateway.config.staging import StagingConfig
from gateway.config.state import StateConfig
from gateway.config.upstream import (
    PROBED_KINDS,
    UPSTREAM_NAME,
    ConfirmCancelConfig,
    ProbeConfig,
    RouteEntry,
    RouteKind,
    UpstreamConfig,
    is_loopback_host,
)

__all__ = [
    "PROBED_KINDS",
    "UPSTREAM_NAME",
    "AdmissionConfig",
    "AgentFiles",
    "AgentWeb",
    "AuditConfig",
    "AuthConfig",
    "ConfirmCancelConfig",
    "CorsConfig",
    "GatewayAgents",
    "GatewayConfig",
    "Hex64",
    "ImagesConfig",
    "IssuerConfig",
    "LaunchConfig",
    "LimitsConfig",
    "LimitsStoreConfig",
    "ListenConfig",
    "LoggingConfig",
    "MetricsConfig",
    "MetricsListen",
    "Model",
    "ModelLaunch",
    "PolicyAgents",
    "PositiveFloat",
    "PositiveInt",
    "ProbeConfig",
    "RelPath",
    "ResponsesConfig",
    "RouteAgents",
    "RouteEntry",
    "RouteKind",
    "ServerConfig",
    "SpeechConfig",
    "StagingConfig",
    "StateConfig",
    "TLSConfig",
    "UpstreamConfig",
    "is_loopback_host",
]
