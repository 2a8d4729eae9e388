"""The composition root: everything long-lived that one app serves from,
built in the lifespan, and its reload, drain and shutdown.

A :class:`Runtime` lives on ``app.state.runtime``; nothing here is
module-level. One request's steps see only its
:class:`~gateway.pipeline.services.Services` (the route table, limits, books
and metrics), never the runtime. ``policies`` is replaced whole on reload (an immutable
:class:`PolicySet`), so a request that read it once keeps that set.
In-flight inference requests register an :class:`Exchange` so that a drain
can wait for them and, past the grace period, end them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from gateway import __version__
from gateway.admission import AdmissionGroup
from gateway.auth.authenticator import Authenticator
from gateway.auth.keys import jwks_client, load_key_set
from gateway.books.anchors import start_anchors
from gateway.books.approvals import ApprovalBook
from gateway.books.evidence.service import EvidenceService
from gateway.books.files.book import FileBook
from gateway.books.interim_files import InterimFiles
from gateway.books.receipts import ReceiptWriter
from gateway.books.responses import ResponseBook
from gateway.books.state.factory import State, evidence_service, file_book, open_state
from gateway.config import GatewayConfig
from gateway.config.diff import changed_keys
from gateway.config.loader import ConfigError, Loaded, load_config, load_policies
from gateway.config.policy import EvidencePolicy, PolicySet, Tenant
from gateway.core.errors import GatewayError
from gateway.core.signed_urls import LinkSigner
from gateway.observe.listener import MetricsListener
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.tracing import NO_TRACING, Tracing, settings_from_env
from gateway.pipeline.cancel import Exchange
from gateway.pipeline.hostlookup import HostLookup
from gateway.pipeline.probe import probe
from gateway.pipeline.services import Services
from gateway.ratelimit import LimitsStore, build_limits_store
from gateway.upstream.readiness import Readiness
from gateway.upstream.releases import Releases
from gateway.upstream.table import RouteTable, capacities

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("gateway")
#: how long a shutdown waits for the limits store's pending settlements
_LIMITS_CLOSE_S = 5.0
#: how long a shutdown waits for spans still to be exported
_TRACING_CLOSE_S = 2.0
#: how long a drain waits for the requests it ended to hand in their receipts
_ENDED_WAIT_S = 5.0


def shutdown_bound_s(config: GatewayConfig) -> float:
    """The longest a SIGTERM can take to exit 0 when every store fails at once
    (a full audit disk, a dead catalog, Redis down, a silent collector): the
    pod's ``terminationGracePeriodSeconds`` must cover it, or what the later
    waits still hold is lost to the SIGKILL."""
    flush = config.audit.flush_timeout_s
    return (
        config.listen.shutdown_grace_s
        + _ENDED_WAIT_S
        + flush  # receipts (drain)
        + flush  # Responses ids (close_runtime)
        + _LIMITS_CLOSE_S
        + _TRACING_CLOSE_S
    )


@dataclass(eq=False)
class Runtime:
    loaded: Loaded
    policies: PolicySet
    auth: Authenticator
    #: route -> worker (its pool, admission, identity)
    table: RouteTable
    readiness: Readiness
    ratelimit: LimitsStore
    evidence: EvidenceService
    #: the books' backend (spec §17): SQLite for one replica, PostgreSQL shared
    state: State
    receipts: ReceiptWriter
    metrics: GatewayMetrics
    #: uploads being read (staging.max_concurrent_uploads)
    uploads: asyncio.Semaphore
    #: which Responses ids are whose
    responses: ResponseBook
    #: tenant files (spec §22): what agent runs produced, served by /v1/files
    files: FileBook
    #: caller approvals (spec §22), decided through any replica
    approvals: ApprovalBook
    #: what one request's steps use of the above
    services: Services
    #: ``url`` images and their signed links (spec §23)
    image_files: InterimFiles
    links: LinkSigner
    keys_http: httpx.AsyncClient | None = None
    draining: bool = False
    background: list[asyncio.Task[None]] = field(default_factory=list)
    metrics_listener: MetricsListener | None = None
    tracing: Tracing = NO_TRACING
    #: unix seconds of the runtime's start (``created`` before the worker reports one)
    started_unix: int = field(default_factory=lambda: int(time.time()))

    @property
    def config(self) -> GatewayConfig:
        return self.loaded.config

    @property
    def inflight(self) -> set[Exchange]:
        return self.services.inflight

    def accepting(self) -> bool:
        """Ready for traffic: every route some policy uses is ready, no drain."""
        return not self.draining and all(self.readiness.ready(r) for r in self.policy_routes())

    def policy_routes(self) -> set[str]:
        """The routes the tenants' aliases point at (what /readyz answers for):
        for a release its stable route, as the release is ready when stable is
        (its canary shows in /readyz's routes, for information only)."""
        ready_for = self.table.readiness_route
        return {
            ready_for(route)
            for t in self.policies.tenants.values()
            for route in t.policy.models.values()
        }

    def check_books(self) -> None:
        """Refuse new work while receipts cannot be written (spec §13)."""
        if not self.receipts.healthy:
            raise GatewayError("audit_unavailable")

    def check_serving(self) -> None:
        """Refuse a new inference request the gateway cannot serve or cannot
        keep books for, before it touches the worker (its route's readiness is
        checked once the route is known)."""
        self.check_books()
        if self.draining:
            raise GatewayError("upstream_not_ready")

    def not_ready_reason(self) -> str | None:
        """Why ``/readyz`` is 503 beyond the worker's routes, if it is.

        Reads state only (the receipt writer's, the limits store's from its
        last calls and probes), so a probe never waits for either. A limits
        store failing every call for ``unready_after_s`` makes the replica
        unready only under ``on_error: closed``, where it refuses inference
        (spec §15, §24); under ``open`` it serves unchecked and stays ready."""
        if not self.receipts.healthy:
            return "audit_unavailable"
        if not self.ratelimit.ready and self.config.limits_store.on_error == "closed":
            return "limits_unavailable"
        return None

    async def reload(self) -> list[str]:
        """SIGHUP: re-read policies, key files and ``releases`` (a promotion is a
        config edit, spec §18); swap only if all are valid."""
        try:
            config = load_config(self.loaded.config_path)
            running = self._with_releases(config)
            policies = load_policies(running)
            keys = load_key_set(self.config.auth, os.environ)
            waiting = [k for k in changed_keys(self.config, config) if not _at_reload(k)]
            if waiting:
                log.warning(
                    "reload: %s changed at %s; these need a restart",
                    self.loaded.config_path.name,
                    ", ".join(waiting),
                )
        except ConfigError as exc:
            self.metrics.reloads.labels("refused").inc()
            for line in exc.errors:
                log.error("reload refused: %s", line)
            return exc.errors
        if running is not self.config:
            # Standing decisions live in the store and stay; so do unchanged releases' windows.
            self.loaded = dataclasses.replace(self.loaded, config=running)
            self.table.releases.configure(running.releases)
            log.info("reload: releases applied: %d", len(running.releases))
        self.policies = policies
        self.auth.swap(keys)
        self.receipts.reopen()
        self.metrics.reloads.labels("applied").inc()
        log.info("reload applied: %d tenants", len(policies.tenants))
        return []

    def _with_releases(self, config: GatewayConfig) -> GatewayConfig:
        """The running config with ``config``'s releases, whose routes must be
        ones the running upstreams serve (upstreams change only at a restart)."""
        if config.releases == self.config.releases:
            return self.config
        served = set(self.config.routes)
        errors = [
            f"{self.loaded.config_path.name}: releases.{release.name}.{arm}: must be a route "
            "the running upstreams serve (upstreams change only at a restart)"
            for release in config.releases
            for arm, route in (("stable", release.stable), ("canary", release.canary))
            if route not in served
        ]
        if errors:
            raise ConfigError(errors)
        return self.config.model_copy(update={"releases": config.releases})

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
        await _wait_done(list(self.inflight), _ENDED_WAIT_S)
        # Requests still waiting for their worker's confirmation hand in their receipts now.
        await self.table.release_held()
        unwritten = await self.receipts.aclose(self.config.audit.flush_timeout_s)
        log.info("drain: done, %d receipts could not be written", unwritten)


def _at_reload(key: str) -> bool:
    """Whether a changed config key is applied by SIGHUP (else it waits for a restart)."""
    return key == "releases" or key.startswith(("releases[", "releases."))


async def _wait_done(exchanges: list[Exchange], timeout_s: float) -> None:
    if not exchanges:
        return
    waits = [asyncio.ensure_future(ex.done.wait()) for ex in exchanges]
    _, pending = await asyncio.wait(waits, timeout=timeout_s)
    for wait in pending:
        wait.cancel()


def link_signer(config: GatewayConfig, environ: Mapping[str, str]) -> LinkSigner:
    """The signer of ``url`` image links: the key from ``images.url_key_env``
    (the config check requires 32 bytes), else a random one per process."""
    images = config.images
    key = os.urandom(32)
    if images.url_key_env is not None:
        key = environ.get(images.url_key_env, "").encode()
    return LinkSigner(config.server.public_base_url, key, images.url_ttl_s)


def tracing_from_env(environ: Mapping[str, str]) -> Tracing:
    """The OpenTelemetry tracing the standard variables ask for, if the
    ``otel`` extra is installed; otherwise none (each reason logged once)."""
    settings = settings_from_env(environ)
    for warning in settings.warnings:
        log.warning("tracing: %s", warning)
    if not settings.enabled:
        return NO_TRACING
    try:
        from gateway.observe import otel
    except ImportError:
        log.warning("tracing: OTEL_TRACES_EXPORTER is set but the otel extra is not installed")
        return NO_TRACING
    log.info("tracing: on, exporters %s", ", ".join(settings.exporters))
    return otel.from_settings(settings, __version__)


async def build_runtime(loaded: Loaded, tracing: Tracing | None = None) -> Runtime:
    config = loaded.config
    metrics = GatewayMetrics()
    admissions = AdmissionGroup(
        capacities(config), config.admission.max_queue, on_change=metrics.on_admission_change
    )
    table = RouteTable.build(config, admissions)
    table.confirm_cancels(
        lambda upstream, seconds: metrics.child(metrics.cancel_confirm, upstream).observe(seconds),
        lambda upstream: metrics.child(metrics.cancel_unconfirmed, upstream).inc(),
    )
    keys = load_key_set(config.auth, os.environ)
    # The audit file's lock first: a second gateway on these paths stops here,
    # before it touches the first one's temp files and leases.
    audit = config.audit
    receipts = ReceiptWriter(
        audit.path,
        replica=config.state.replica,
        max_pending=audit.max_pending,
        rotate_bytes=audit.rotate_bytes,
        keep=audit.keep,
        linger_s=audit.flush_interval_ms / 1000,
        on_error=metrics.receipt_errors.inc,
        on_lost=metrics.receipts_lost.inc,
        on_pending=metrics.receipts_pending.set,
    )
    await receipts.start()
    state = open_state(config, os.environ, metrics.state_store_call, metrics.state_store_errors.inc)
    table.releases = Releases(
        config.releases, metrics, store=state.releases, replica=config.state.replica
    )
    evidence = evidence_service(config, state, metrics.leases_active.set)
    try:
        # Clear the temp files and leases a crash left behind.
        await evidence.recover()
    except GatewayError as exc:
        # A shared store down at start: serve what needs no state; the sweep retries.
        log.warning("state: recovery at start failed (%s); the lease sweep will retry", exc.code)

    def evidence_of(tenant: str) -> EvidencePolicy:
        # Read at each call (late-bound: ``runtime`` is assigned below, before any
        # request), so a reload's policies apply to files at once.
        found = runtime.policies.tenants.get(tenant)
        return found.policy.evidence if found is not None else EvidencePolicy()

    files = file_book(config, state, evidence_of)
    # Blobs a crash left unnamed (never raises: a store down is the next sweep's).
    await files.sweep(at_start=not state.shared)
    approvals = ApprovalBook(state.approvals, timeout_s=config.state.timeout_s)
    ratelimit = build_limits_store(config, metrics)
    await ratelimit.start()
    metrics.watch_limits_store(lambda: ratelimit.healthy, lambda: ratelimit.pending_settlements)
    # Only issuers with jwks_url need HTTP; never follow redirects for keys.
    keys_http = jwks_client() if any(i.jwks_url for i in config.auth.issuers) else None
    readiness = Readiness(table, metrics, probe)
    # Apart from the tenant files' blobs (files/): each store sweeps only its own directory.
    image_files = InterimFiles(config.staging.dir / "image-links", config.images.url_ttl_s)
    links = link_signer(config, os.environ)
    responses = ResponseBook(
        state.responses,
        ttl_s=config.responses.ttl_s,
        timeout_s=config.state.timeout_s,
        sweep_s=config.staging.expiry_sweep_s,
    )
    runtime = Runtime(
        loaded=loaded,
        policies=loaded.policies,
        auth=Authenticator(keys, http=keys_http),
        table=table,
        readiness=readiness,
        ratelimit=ratelimit,
        evidence=evidence,
        state=state,
        receipts=receipts,
        metrics=metrics,
        uploads=asyncio.Semaphore(config.staging.max_concurrent_uploads),
        responses=responses,
        files=files,
        approvals=approvals,
        services=Services(
            table=table,
            readiness=readiness,
            limits=ratelimit,
            responses=responses,
            receipts=receipts,
            metrics=metrics,
            staging=config.staging,
            blobs=evidence.store,
            state=state.calls,
            files=files,
            approvals=approvals,
            hosts=HostLookup(config.agents.hosts),
            session_key=_session_key(config, os.environ),
            image_files=image_files,
            links=links,
        ),
        image_files=image_files,
        links=links,
        keys_http=keys_http,
        tracing=tracing if tracing is not None else tracing_from_env(os.environ),
    )
    for problem in await runtime.auth.prefetch():
        log.warning("jwks prefetch: %s", problem)
    return runtime


def _session_key(config: GatewayConfig, environ: Mapping[str, str]) -> bytes:
    """The key of the worker's session ids (spec §22; ``check`` requires it,
    at least 32 bytes, when a route has agents)."""
    name = config.agents.session_key_env
    return environ.get(name, "").encode() if name is not None else b""


async def start_background(runtime: Runtime) -> None:
    listen = runtime.config.metrics.listen
    if listen is not None:
        runtime.metrics_listener = MetricsListener(
            runtime.metrics.registry, listen.host, listen.port, runtime.config.metrics.path
        )
        await runtime.metrics_listener.start()
    runtime.readiness.start()
    runtime.table.releases.start()
    runtime.responses.start()
    runtime.background.append(asyncio.create_task(_sweep_expired(runtime), name="evidence-expiry"))
    # The receipt chain's head into the state store (spec §24).
    anchors = start_anchors(
        runtime.receipts, runtime.state.anchors, runtime.config, runtime.metrics
    )
    runtime.background.append(anchors)


async def _sweep_expired(runtime: Runtime) -> None:
    """Forget records and files past their tenant's evidence.ttl_s (lookups
    already skip them), expired leases and approvals, blobs nothing names."""
    interval = runtime.config.staging.expiry_sweep_s
    while True:
        await asyncio.sleep(interval)
        for tenant in list(runtime.policies.tenants.values()):
            if tenant.policy.evidence.ttl_s:
                await _expire_tenant(runtime, tenant)
        try:
            # Leases a crashed replica left (spec §17): whichever replica sees them first.
            swept = await runtime.evidence.sweep()
        except GatewayError as exc:
            log.warning("evidence lease sweep failed: %s", exc.code)
        else:
            if swept:
                log.info("evidence: %d expired leases dropped", swept)
        # Files an outage or a crash left between rename and record (spec §24).
        await runtime.evidence.sweep_staged()
        await runtime.files.sweep()
        await _sweep_approvals(runtime)


async def _expire_tenant(runtime: Runtime, tenant: Tenant) -> None:
    for what, expire in (
        ("records", runtime.evidence.expire(tenant)),
        ("files", runtime.files.expire(tenant.name)),
    ):
        try:
            forgotten = await expire
        except GatewayError as exc:
            log.warning("evidence expiry (%s) for %s failed: %s", what, tenant.name, exc.code)
            continue
        if forgotten:
            log.info("evidence expiry: %d %s of %s forgotten", forgotten, what, tenant.name)


async def _sweep_approvals(runtime: Runtime) -> None:
    try:
        # A crashed replica's approvals (spec §22): whichever replica sees them first.
        swept = await runtime.approvals.sweep()
    except GatewayError as exc:
        log.warning("approvals sweep failed: %s", exc.code)
    else:
        if swept:
            log.info("approvals: %d expired approvals deleted", swept)


async def close_runtime(runtime: Runtime) -> None:
    """Stop everything; each step whatever the ones before it raised (a failing
    step must not cost the receipts, the settlements or the spans after it)."""
    for task in runtime.background:
        task.cancel()
    await asyncio.gather(*runtime.background, return_exceptions=True)
    flush_s = runtime.config.audit.flush_timeout_s

    async def responses() -> None:
        unwritten = await runtime.responses.aclose(flush_s)
        if unwritten:
            log.warning("responses: %d response ids could not be written to the catalog", unwritten)

    async def keys_http() -> None:
        if runtime.keys_http is not None:
            await runtime.keys_http.aclose()

    async def evidence() -> None:
        await runtime.state.close()

    async def tracing() -> None:
        if runtime.tracing is not NO_TRACING:
            # Bounded by close itself (a daemon thread): no worker thread is left
            # for the interpreter to wait for at exit.
            await anyio.to_thread.run_sync(runtime.tracing.close, _TRACING_CLOSE_S)

    async def metrics_listener() -> None:
        if runtime.metrics_listener is not None:
            await runtime.metrics_listener.aclose()

    steps: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("metrics listener", metrics_listener),
        ("readiness", runtime.readiness.aclose),
        ("releases", runtime.table.releases.aclose),
        ("responses", responses),
        ("approvals", runtime.approvals.aclose),
        ("cancel confirmations", runtime.table.release_held),
        ("receipts", lambda: runtime.receipts.aclose(flush_s)),
        ("limits store", lambda: runtime.ratelimit.aclose(_LIMITS_CLOSE_S)),
        ("upstreams", runtime.table.aclose),
        ("key fetcher", keys_http),
        ("evidence", evidence),
        ("tracing", tracing),
    ]
    for name, step in steps:
        try:
            await step()
        except Exception as exc:
            log.error("shutdown: closing the %s failed: %s", name, type(exc).__name__)
