"""What ``check`` says about a replica's place in its fleet (spec §24): the
state backend and ``replica_id``, the audit file, the limits store and every
release, one line each. Never a secret: the DSN is named by its variable,
the Redis URL by its host, port and database (its password is never in it).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from gateway.config import GatewayConfig
from gateway.config.releases import ReleaseConfig


def fleet_summary(config: GatewayConfig) -> list[str]:
    return [
        _state(config),
        _audit(config),
        _limits(config),
        *(_release(r) for r in config.releases),
        *([] if config.releases else ["releases: none"]),
    ]


def _state(config: GatewayConfig) -> str:
    state = config.state
    # Unset, the id is each serve's own <hostname>-<pid>: this process's would mislead.
    replica = state.replica_id or "unset (each serve: <hostname>-<pid>)"
    if state.backend == "postgres":
        where = (
            f"postgres (DSN from ${state.dsn_env}, shared by every replica) "
            f"timeout_ms={state.timeout_ms}"
        )
    else:
        # (SQLite calls are not bounded by timeout_ms: README "Where it differs")
        where = f"sqlite {config.staging.catalog} (this replica only)"
    return f"state: {where} replica_id={replica}"


def _audit(config: GatewayConfig) -> str:
    audit = config.audit
    return f"audit: {audit.path} flush_interval_ms={audit.flush_interval_ms:g}"


def _limits(config: GatewayConfig) -> str:
    store = config.limits_store
    if store.backend == "memory":
        return "limits_store: memory (this process only: each replica enforces its own limits)"
    parts = urlsplit(store.url)
    database = parts.path.lstrip("/") or "0"
    return (
        f"limits_store: redis {parts.scheme}://{parts.hostname}:{parts.port or 6379}/{database} "
        f"key_prefix={store.key_prefix} timeout_ms={store.timeout_ms} on_error={store.on_error} "
        f"unready_after_s={store.unready_after_s:g} lease_renew_s={store.lease_renew_s:g} "
        f"lease_ttl_s={store.lease_ttl_s:g}"
    )


def _release(release: ReleaseConfig) -> str:
    gate = release.gate
    judged = (
        "gate off (manual rollback only)"
        if gate is None
        else (
            f"gate window_s={gate.window_s:g} min_requests={gate.min_requests} "
            f"max_failure_rate_delta={gate.max_failure_rate_delta:g} "
            f"max_ttft_p95_ratio={gate.max_ttft_p95_ratio:g}"
        )
    )
    return (
        f"release {release.name}: stable {release.stable} canary {release.canary} "
        f"canary_percent={release.canary_percent:g} cohort={release.cohort} "
        f"fallback={'on' if release.fallback else 'off'} {judged}"
    )
