"""Prometheus metrics on the app's own registry (spec §10).

Label values come only from config (tenant names) or fixed sets (endpoints,
outcomes, token kinds); ``tenant="-"`` before a caller is authenticated.
Nothing here is module-level state: each app builds its own
:class:`GatewayMetrics` on its own ``CollectorRegistry``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.observe.histogram import FastHistogram

UNKNOWN_TENANT = "-"

#: every label value of gateway_auth_failures_total, in documentation order
#: (``gateway.auth.failures`` folds each rejection onto one of them)
AUTH_REASONS = (
    "missing",
    "malformed",
    "unknown_api_key",
    "issuer",
    "algorithm",
    "unknown_kid",
    "signature",
    "audience",
    "expired",
    "not_yet_valid",
    "lifetime",
    "missing_claim",
)

# TTFT on CPU workers ranges from tens of ms to minutes under load.
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)
# Whole requests: from fast refusals to long streams (total timeout 600 s).
_DURATION_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_STORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
# Stages: from a few µs (auth with a cached key) to a worker's minutes-long first token.
_STAGE_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 120)
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry
        self.requests = Counter(
            "gateway_requests_total",
            "Requests answered, by tenant, endpoint and HTTP status.",
            ["tenant", "endpoint", "status"],
            registry=r,
        )
        self.duration = FastHistogram(
            "gateway_request_duration_seconds",
            "Time from request start to the last byte sent.",
            ["endpoint"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.ttft = FastHistogram(
            "gateway_ttft_seconds",
            "Time from request start to the first content event sent or assembled.",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.stream_outcomes = Counter(
            "gateway_stream_outcomes_total",
            "Inference request outcomes (receipt outcome).",
            ["tenant", "outcome"],
            registry=r,
        )
        self.tokens = Counter(
            "gateway_tokens_total",
            "Tokens by tenant, kind (prompt|completion) and source (reported|estimated).",
            ["tenant", "kind", "source"],
            registry=r,
        )
        self.permits_in_use = Gauge(
            "gateway_permits_in_use", "Admission permit units held.", ["upstream"], registry=r
        )
        self.queue_depth = Gauge(
            "gateway_admission_queue_depth",
            "Requests waiting for permits.",
            ["upstream"],
            registry=r,
        )
        self.admission_wait = FastHistogram(
            "gateway_admission_wait_seconds",
            "Time spent waiting for admission permits.",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.stages = FastHistogram(
            "gateway_stage_seconds",
            "Time per stage of an inference request (receipt timings_ms, spec §20).",
            ["stage"],
            buckets=_STAGE_BUCKETS,
            registry=r,
        )
        self.cancel_confirm = FastHistogram(
            "gateway_cancel_confirm_seconds",
            "From a canceled request's end to the worker's confirmation that it stopped.",
            ["upstream"],
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.cancel_unconfirmed = Counter(
            "gateway_cancel_unconfirmed_total",
            "Canceled requests whose permits went back at confirm_cancel.timeout_s.",
            ["upstream"],
            registry=r,
        )
        self.rejections = Counter(
            "gateway_rejections_total",
            "Refused requests by tenant and error code.",
            ["tenant", "code"],
            registry=r,
        )
        self.auth_failures = Counter(
            "gateway_auth_failures_total",
            "Failed authentications by reason (callers only see missing_credentials "
            "or invalid_token).",
            ["reason"],
            registry=r,
        )
        for reason in AUTH_REASONS:
            self.auth_failures.labels(reason)
        self.upstream_ready = Gauge(
            "gateway_upstream_ready",
            "1 while the route is ready (listed loaded once, probe passed).",
            ["upstream", "route"],
            registry=r,
        )
        self.leases_active = Gauge(
            "gateway_evidence_leases_active", "Evidence leases held by requests.", registry=r
        )
        self.receipt_errors = Counter(
            "gateway_receipt_errors_total",
            "Failed attempts to write receipts to the audit file.",
            registry=r,
        )
        self.receipts_lost = Counter(
            "gateway_receipts_lost_total",
            "Receipts dropped because the in-memory backlog was full (audit.max_pending).",
            registry=r,
        )
        self.receipts_pending = Gauge(
            "gateway_receipts_pending", "Receipts waiting to be written.", registry=r
        )
        self.receipts_chain_seq = Gauge(
            "gateway_receipts_chain_seq",
            "The seq of this replica's receipt chain's last line on disk (spec section 24).",
            ["replica"],
            registry=r,
        )
        self.reloads = Counter(
            "gateway_reloads_total", "Policy/key reloads by result.", ["result"], registry=r
        )
        for result in ("applied", "refused"):
            self.reloads.labels(result)
        # Limits store calls (spec §15): loopback Redis answers in ~0.1-1 ms.
        self.limits_store_seconds = FastHistogram(
            "gateway_limits_store_seconds",
            "Time of one limits-store call, by operation (reserve|settle|probe).",
            ["op"],
            buckets=_STORE_BUCKETS,
            registry=r,
        )
        self.limits_store_errors = Counter(
            "gateway_limits_store_errors_total",
            "Failed limits-store calls (unreachable, timed out, refused), by operation.",
            ["op"],
            registry=r,
        )
        for op in ("reserve", "settle", "probe", "renew"):
            self.limits_store_errors.labels(op)
        # State store calls (spec §17): evidence, leases, kept responses.
        self.state_store_seconds = FastHistogram(
            "gateway_state_store_seconds",
            "Time of one state-store call (SQLite or PostgreSQL), by operation.",
            ["op"],
            buckets=_STORE_BUCKETS,
            registry=r,
        )
        self.state_store_errors = Counter(
            "gateway_state_store_errors_total",
            "Failed state-store calls (unreachable, slower than state.timeout_ms, refused).",
            registry=r,
        )
        # Releases (spec §18): label values are release names and arms from config.
        self.release_requests = Counter(
            "gateway_release_requests_total",
            "Requests of a release by arm (stable|canary) and receipt outcome; a canary "
            "attempt that fell back counts once more, with its own outcome.",
            ["release", "arm", "outcome"],
            registry=r,
        )
        self.release_ttft = FastHistogram(
            "gateway_release_ttft_seconds",
            "Time to first token of a release's requests, by arm.",
            ["release", "arm"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.release_canary_percent = Gauge(
            "gateway_release_canary_percent",
            "The canary's effective percent (config, operator override, or 0 rolled back).",
            ["release"],
            registry=r,
        )
        self.release_rollbacks = Counter(
            "gateway_release_rollbacks_total",
            "Canaries rolled back by their gate on this replica (operator rollbacks not counted).",
            ["release"],
            registry=r,
        )
        self.agent_tool_calls = Counter(
            "gateway_agent_tool_calls_total",
            "Tool calls the worker asked to run for a tenant (spec §22), by the tool's policy "
            "word (web_search, python, mcp, other) and the gateway's decision (approve, deny).",
            ["tenant", "tool", "decision"],
            registry=r,
        )
        self.agent_rounds = FastHistogram(
            "gateway_agent_rounds",
            "Tool rounds of each agentic request.",
            [],
            buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=r,
        )
        self.agent_files_dropped = Counter(
            "gateway_agent_files_dropped_total",
            "Files the worker produced that were not kept (over agents.files bounds, elided).",
            ["tenant"],
            registry=r,
        )
        # Read from the store at scrape time (watch_limits_store).
        self.limits_store_healthy = Gauge(
            "gateway_limits_store_healthy",
            "1 while the limits store answers (its last call or probe succeeded).",
            registry=r,
        )
        self.limits_settlements_pending = Gauge(
            "gateway_limits_settlements_pending",
            "Limits settlements (refunds, slot releases) queued and not yet applied.",
            registry=r,
        )

    def child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, remembered: prometheus_client validates and
        locks on every ``labels`` call, which the profile showed per request.
        Bounded like the label values themselves (config and fixed sets)."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def request_done(
        self, tenant: str, endpoint: str, status: int, elapsed_s: float, error_code: str | None
    ) -> None:
        self.child(self.requests, tenant, endpoint, str(status)).inc()
        self.child(self.duration, endpoint).observe(elapsed_s)
        if error_code is not None:
            self.child(self.rejections, tenant, error_code).inc()

    def auth_failed(self, reason: str) -> None:
        self.child(self.auth_failures, reason).inc()

    def on_admission_change(self, upstream: str, in_use: int, queue_depth: int) -> None:
        self.child(self.permits_in_use, upstream).set(in_use)
        self.child(self.queue_depth, upstream).set(queue_depth)

    def watch_limits_store(self, healthy: Callable[[], bool], pending: Callable[[], int]) -> None:
        """Gauges read at scrape time: ``healthy()`` and ``pending()`` of the store."""
        self.limits_store_healthy.set_function(lambda: 1.0 if healthy() else 0.0)
        self.limits_settlements_pending.set_function(lambda: float(pending()))

    # StoreMetrics (gateway.ratelimit.base): the limits store reports here.
    def limits_store_call(self, op: str, seconds: float) -> None:
        self.child(self.limits_store_seconds, op).observe(seconds)

    def state_store_call(self, op: str, seconds: float) -> None:
        self.child(self.state_store_seconds, op).observe(seconds)

    def limits_store_error(self, op: str) -> None:
        self.child(self.limits_store_errors, op).inc()
