"""Everything long-lived that one app serves from, built in the lifespan.

A :class:`Runtime` lives on ``app.state.runtime``; nothing here is
module-level. ``policies`` is replaced whole on reload (an immutable
:class:`PolicySet`), so a request that read it once keeps that set.
In-flight inference requests register an :class:`Exchange` so that a drain
can wait for them and, past the grace period, end them.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
import httpx

from gateway.admission import Admission
from gateway.auth import Authenticator
from gateway.auth.keys import load_key_set
from gateway.cancel import Exchange
from gateway.config import GatewayConfig
from gateway.errors import GatewayError
from gateway.evidence.service import EvidenceService
from gateway.launch import serve_identity as launch_identity
from gateway.loader import ConfigError, Loaded, load_config, load_policies
from gateway.metrics import GatewayMetrics
from gateway.policy import PolicySet
from gateway.ratelimit import LimitsStore, build_limits_store
from gateway.receipts import ReceiptWriter
from gateway.upstream.client import Upstream
from gateway.upstream.readiness import Readiness

log = logging.getLogger("gateway")
#: how long a shutdown waits for the limits store's pending settlements
_LIMITS_CLOSE_S = 5.0


@dataclass(eq=False)
class Runtime:
    loaded: Loaded
    policies: PolicySet
    auth: Authenticator
    upstream: Upstream
    readiness: Readiness
    admission: Admission
    ratelimit: LimitsStore
    evidence: EvidenceService
    receipts: ReceiptWriter
    metrics: GatewayMetrics
    serve_identity: str | None
    keys_http: httpx.AsyncClient | None = None
    draining: bool = False
    inflight: set[Exchange] = field(default_factory=set)

    @property
    def config(self) -> GatewayConfig:
        return self.loaded.config

    def accepting(self) -> bool:
        return self.readiness.ready and not self.draining

    def check_books(self) -> None:
        """Refuse new work while receipts cannot be written (spec §13)."""
        if not self.receipts.healthy:
            raise GatewayError("audit_unavailable")

    def check_serving(self) -> None:
        """Refuse a new inference request the gateway cannot serve or cannot
        keep books for, before it touches the worker."""
        self.check_books()
        if not self.accepting():
            raise GatewayError("upstream_not_ready")

    def not_ready_reason(self) -> str | None:
        """Why ``/readyz`` is 503 beyond the worker's routes, if it is.

        Reads state only (the receipt writer's, the limits store's from its
        last call or probe), so a probe never waits for either. A failing
        limits store makes the replica unready only under ``on_error:
        closed``, where it refuses inference (spec §15); under ``open`` it
        serves unchecked and stays ready."""
        if not self.receipts.healthy:
            return "audit_unavailable"
        if not self.ratelimit.healthy and self.config.limits_store.on_error == "closed":
            return "limits_unavailable"
        return None

    async def reload(self) -> list[str]:
        """SIGHUP: re-read policies and key files; swap only if all are valid."""
        try:
            config = load_config(self.loaded.config_path)
            policies = load_policies(self.config)
            keys = load_key_set(self.config.auth, os.environ)
            if config != self.config:
                log.warning("reload: changes outside policies and key files need a restart")
        except ConfigError as exc:
            self.metrics.reloads.labels("refused").inc()
            for line in exc.errors:
                log.error("reload refused: %s", line)
            return exc.errors
        self.policies = policies
        self.auth.swap(keys)
        self.receipts.reopen()
        self.metrics.reloads.labels("applied").inc()
        log.info("reload applied: %d tenants", len(policies.tenants))
        return []

    async def drain(self, grace_s: float) -> None:
        """SIGTERM: stop admitting, let in-flight requests finish, then end the rest.

        Bounded: ``grace_s``, then whatever the ended requests need to hand in
        their receipts, then at most ``audit.flush_timeout_s`` for the writer
        (a full audit disk must not hold the pod past its termination grace)."""
        self.draining = True
        log.info("drain: started, %d requests in flight, grace %.1f s", len(self.inflight), grace_s)
        await _wait_done(list(self.inflight), grace_s)
        for exchange in list(self.inflight):
            exchange.cancel(shutdown=True)
        await _wait_done(list(self.inflight), 5)
        unwritten = await self.receipts.aclose(self.config.audit.flush_timeout_s)
        log.info("drain: done, %d receipts could not be written", unwritten)


async def _wait_done(exchanges: list[Exchange], timeout_s: float) -> None:
    if not exchanges:
        return
    waits = [asyncio.ensure_future(ex.done.wait()) for ex in exchanges]
    _, pending = await asyncio.wait(waits, timeout=timeout_s)
    for wait in pending:
        wait.cancel()


async def build_runtime(loaded: Loaded) -> Runtime:
    config = loaded.config
    metrics = GatewayMetrics()
    launch = config.upstream.launch
    serve_identity = launch_identity(launch) if launch else None
    upstream = Upstream(config.upstream, pool_size=config.admission.capacity + 8)
    keys = load_key_set(config.auth, os.environ)
    evidence = EvidenceService.from_config(config.staging, metrics.leases_active.set)
    # One server per staging dir: clear temp files and leases a crash left behind.
    await anyio.to_thread.run_sync(evidence.recover)
    audit = config.audit
    receipts = ReceiptWriter(
        audit.path,
        max_pending=audit.max_pending,
        rotate_bytes=audit.rotate_bytes,
        keep=audit.keep,
        on_error=metrics.receipt_errors.inc,
        on_lost=metrics.receipts_lost.inc,
        on_pending=metrics.receipts_pending.set,
    )
    await receipts.start()
    ratelimit = build_limits_store(config, metrics)
    await ratelimit.start()
    metrics.watch_limits_store(lambda: ratelimit.healthy, lambda: ratelimit.pending_settlements)
    admission = Admission(
        config.admission.capacity,
        config.admission.max_queue,
        on_change=metrics.on_admission_change,
    )
    # Only issuers with jwks_url need HTTP; never follow redirects for keys.
    keys_http = (
        httpx.AsyncClient(follow_redirects=False, trust_env=False, timeout=5)
        if any(i.jwks_url for i in config.auth.issuers)
        else None
    )
    runtime = Runtime(
        loaded=loaded,
        policies=loaded.policies,
        auth=Authenticator(keys, http=keys_http),
        upstream=upstream,
        readiness=Readiness(upstream, metrics),
        admission=admission,
        ratelimit=ratelimit,
        evidence=evidence,
        receipts=receipts,
        metrics=metrics,
        serve_identity=serve_identity,
        keys_http=keys_http,
    )
    for problem in await runtime.auth.prefetch():
        log.warning("jwks prefetch: %s", problem)
    return runtime


async def close_runtime(runtime: Runtime) -> None:
    await runtime.readiness.aclose()
    await runtime.receipts.aclose(runtime.config.audit.flush_timeout_s)
    await runtime.ratelimit.aclose(_LIMITS_CLOSE_S)
    await runtime.upstream.aclose()
    if runtime.keys_http is not None:
        await runtime.keys_http.aclose()
    runtime.evidence.close()
