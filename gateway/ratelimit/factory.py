"""``build_limits_store``: the configured store (``limits_store.backend``, spec §15)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from gateway.config import GatewayConfig
from gateway.config.loader import ConfigError
from gateway.ratelimit.base import LimitsStore, StoreMetrics
from gateway.ratelimit.memory import MemoryLimitsStore

__all__ = ["LEASE_MARGIN_S", "build_limits_store", "lease_for", "store_password"]

#: a hold outlives the longest request by this much (spec §15)
LEASE_MARGIN_S = 10.0


def lease_for(config: GatewayConfig) -> float:
    """How long a hold lasts when its replica never settles it (and, in the memory
    store, a slot; a shared slot is renewed: ``limits_store.lease_ttl_s``)."""
    # The longest a request can run on any worker, plus the spec's margin.
    return max(u.total_timeout_s for u in config.workers) + LEASE_MARGIN_S


def store_password(config: GatewayConfig, environ: Mapping[str, str]) -> str | None:
    """The Redis password from ``limits_store.password_env``; ConfigError when unset."""
    name = config.limits_store.password_env
    if config.limits_store.backend != "redis" or name is None:
        return None
    password = environ.get(name)
    if not password:
        raise ConfigError([f"limits_store.password_env: {name} is not set or empty"])
    return password


def build_limits_store(
    config: GatewayConfig,
    metrics: StoreMetrics | None = None,
    environ: Mapping[str, str] | None = None,
) -> LimitsStore:
    """The store ``limits_store`` names; ConfigError when its password is missing."""
    section = config.limits_store
    lease_s = lease_for(config)
    if section.backend == "memory":
        return MemoryLimitsStore(lease_s=lease_s, metrics=metrics)
    # Imported here: redis-py is ~9 MB of a replica's RSS that the memory store
    # never uses (issue 26's peak-RSS target), as asyncpg is for SQLite state.
    from gateway.ratelimit.redis_store import RedisLimitsStore

    return RedisLimitsStore.from_url(
        section.url,
        password=store_password(config, os.environ if environ is None else environ),
        timeout_s=section.timeout_ms / 1000,
        key_prefix=section.key_prefix,
        on_error=section.on_error,
        lease_s=lease_s,
        lease_ttl_s=section.lease_ttl_s,
        lease_renew_s=section.lease_renew_s,
        metrics=metrics,
        # readiness (spec §15, §16): the store is probed as often as the
        # workers are (the most frequent of them)
        probe_interval_s=min(u.readiness_poll_s for u in config.workers),
        unready_after_s=section.unready_after_s,
    )
