"""``limits_store`` config, policy limits and ``build_limits_store`` (spec §15)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config import GatewayConfig, LimitsStoreConfig
from gateway.config.loader import ConfigError
from gateway.config.policy import PolicyLimits, TenantPolicy, build_policy_set
from gateway.core.errors import GatewayError
from gateway.observe.metrics import GatewayMetrics
from gateway.ratelimit import MemoryLimitsStore, RedisLimitsStore, build_limits_store, lease_for

ROUTE = "/srv/mosaic-models/" + "0" * 64


def config(**store: Any) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {"upstream": {"route": ROUTE, "total_timeout_s": 300}, "limits_store": store}
    )


def test_defaults_are_the_spec_example() -> None:
    section = GatewayConfig.model_validate({"upstream": {"route": ROUTE}}).limits_store
    assert section == LimitsStoreConfig(
        backend="memory",
        url="redis://127.0.0.1:6379/0",
        password_env=None,
        key_prefix="mrgw:",
        timeout_ms=250,  # spec §24 (§15's example said 50)
        on_error="closed",
        lease_renew_s=5,
        lease_ttl_s=15,
        unready_after_s=5,
    )


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "rediss://redis.internal:6380/3",
        "redis://limits@redis.internal",
        "redis://[::1]:6379",
    ],
)
def test_redis_urls_are_accepted(url: str) -> None:
    assert config(backend="redis", url=url).limits_store.url == url


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:6379", "redis:// or rediss://"),
        ("unix:///run/redis.sock", "redis:// or rediss://"),
        ("redis://", "redis:// or rediss://"),
        ("redis://:hunter2@127.0.0.1:6379/0", "password_env"),
        ("redis://127.0.0.1:6379/zero", "database number"),
        ("redis://127.0.0.1:6379/0?ssl=true", "query"),
        ("redis://127.0.0.1:99999/0", "port"),
    ],
)
def test_bad_redis_urls_are_refused(url: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        config(backend="redis", url=url)


@pytest.mark.parametrize(
    "bad",
    [
        {"backend": "memcached"},
        {"on_error": "ignore"},
        {"timeout_ms": 0},
        {"key_prefix": "a{b}"},
        {"password_env": "not a name"},
        {"pasword_env": "REDIS_PASSWORD"},  # misspelt: extra keys are errors
        {"lease_renew_s": 0},
        {"lease_renew_s": -1},
        {"lease_renew_s": 61, "lease_ttl_s": 600},
        {"lease_ttl_s": 0},
        {"lease_ttl_s": 601},
    ],
)
def test_bad_sections_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        config(**bad)


@pytest.mark.parametrize(
    "leases",
    [
        {"lease_renew_s": 15, "lease_ttl_s": 15},
        {"lease_renew_s": 20},
        {"lease_ttl_s": 5},
        # a renewal may take timeout_ms: it must still land within the lease
        {"lease_renew_s": 1, "lease_ttl_s": 3, "timeout_ms": 2000},
    ],
)
def test_a_lease_must_outlast_its_renewal(leases: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="less than lease_ttl_s"):
        config(**leases)


def test_short_leases_are_accepted() -> None:
    section = config(lease_renew_s=1, lease_ttl_s=3, timeout_ms=1000).limits_store
    assert (section.lease_renew_s, section.lease_ttl_s) == (1, 3)


def test_policy_limits_reach_the_effective_limits() -> None:
    policy = TenantPolicy(
        tenant="acme", limits=PolicyLimits(tokens_per_day=5000, max_concurrent_requests=3)
    )
    tenant = build_policy_set([policy], config()).tenants["acme"]
    assert (tenant.limits.tokens_per_day, tenant.limits.max_concurrent_requests) == (5000, 3)
    with pytest.raises(ValidationError):
        PolicyLimits(max_concurrent_requests=0)


def test_new_error_codes() -> None:
    assert (GatewayError("budget_exhausted").status, GatewayError("budget_exhausted").type) == (
        429,
        "rate_limit_error",
    )
    assert GatewayError("concurrency_limited").status == 429
    assert GatewayError("limits_unavailable").status == 503


async def test_the_factory_builds_the_configured_store() -> None:
    metrics = GatewayMetrics()
    memory = build_limits_store(config(), metrics)
    assert isinstance(memory, MemoryLimitsStore)
    assert lease_for(config()) == 310
    redis = build_limits_store(
        config(backend="redis", password_env="LIMITS_PW", key_prefix="x:"),
        metrics,
        environ={"LIMITS_PW": "pw"},
    )
    assert isinstance(redis, RedisLimitsStore)
    assert redis.keys("acme").requests == "x:{61636d65}:rpm"
    await redis.aclose(1)
    leased = build_limits_store(
        config(backend="redis", lease_renew_s=2, lease_ttl_s=7, unready_after_s=9), metrics
    )
    assert isinstance(leased, RedisLimitsStore)
    assert (leased._slot_lease_ms, leased._leases._interval_s) == (7000, 2)
    assert (leased._timeout_s, leased._unready_after_s) == (0.25, 9)
    await leased.aclose(1)


def test_a_missing_password_is_a_config_error_naming_the_variable() -> None:
    with pytest.raises(ConfigError) as info:
        build_limits_store(config(backend="redis", password_env="LIMITS_PW"), environ={})
    assert "LIMITS_PW" in info.value.errors[0]


def test_store_metrics_are_registered() -> None:
    metrics = GatewayMetrics()
    metrics.limits_store_call("reserve", 0.0004)
    metrics.limits_store_error("reserve")
    text = metrics.registry.get_sample_value
    assert text("gateway_limits_store_seconds_count", {"op": "reserve"}) == 1
    assert text("gateway_limits_store_errors_total", {"op": "reserve"}) == 1
    assert text("gateway_limits_store_errors_total", {"op": "settle"}) == 0


WIDEST = ["a", "0", "x" * 63, "a.b", "a-b", "a_b", "a.", "a..", "Z9._-z", "A"]
REFUSED = ["", "x" * 64, "a:b", "*", "{x}", "a b", " a", "a ", "ünï", "a/b", "a\\b", "a\tb",
           "a\x00", "a\n", ".a", "-a", "_a", "🦀"]  # fmt: skip


@pytest.mark.parametrize("name", WIDEST)
def test_tenant_names_the_policy_allows(name: str) -> None:
    assert TenantPolicy(tenant=name).tenant == name


@pytest.mark.parametrize("name", REFUSED)
def test_tenant_names_the_policy_refuses(name: str) -> None:
    """Tenant names stay `[A-Za-z0-9][A-Za-z0-9_.-]{0,62}` (docs/operations.md):
    they are file stems, metrics labels, log and receipt fields, and key parts."""
    with pytest.raises(ValidationError):
        TenantPolicy(tenant=name)
