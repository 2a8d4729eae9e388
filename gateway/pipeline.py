"""The inference lifecycle: one pipeline for every endpoint descriptor.

One request: authenticate → authorize (issuer, endpoint, scope) →
readiness and books → body guard → plan (the descriptor: allowlist, bounds,
media parts) → media records (catalog lookups and leases, no file read) →
rate limits → admission permit → media (inline data staged, the body laid
out) → worker (the body sent in pieces, evidence read only now) → relay
(stream or collect) → the one ``finally``.

Cost before work (spec §13): everything a request may cost -- body bytes,
prompt bytes, output tokens, media count, types and bytes, the forwarded
body's size -- is checked from what is known before the permit; media bytes
are read only after it, in bounded pieces (``gateway/evidence/encode.py``).

The work runs inside one cancel scope (``gateway/cancel.py``); the one
``finally`` closes the worker response, releases the permit, the leases and
the rate reservation, decides the outcome from the facts
(``gateway/outcome.py``), writes the receipt and records metrics, whatever
happened. No ``if endpoint == …`` here: what differs lives in the
descriptor (``gateway/apis``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import orjson

from gateway.admission import Permit, request_weight
from gateway.apis.base import Api, Dialect, Plan, PlanContext, StreamBounds
from gateway.apis.media import check_records, data_url_parts, evidence_ids
from gateway.apis.usage import Usage, estimate_prompt_tokens, public_usage, usage_of
from gateway.asgi import (
    ABORT_EXTENSION,
    Receive,
    RequestInfo,
    Scope,
    Send,
    authorization_values,
    info_of,
    runtime_of,
    send_error,
    send_json,
)
from gateway.auth import Principal, authorize
from gateway.body import Layout, MediaSlot, check_size, layout
from gateway.cancel import LAST_WORDS_S, CallerStalled, Exchange, watch_disconnect
from gateway.config import StagingConfig
from gateway.errors import GatewayError
from gateway.evidence.catalog import EvidenceRecord
from gateway.evidence.encode import BodyProducer
from gateway.limits import ClientDisconnected, parse_json, read_body
from gateway.outcome import Facts, decide
from gateway.policy import Tenant
from gateway.ratelimit import Hold, TenantLimits
from gateway.receipts import Receipt
from gateway.relay import Relay, Timeouts
from gateway.runtime import Runtime
from gateway.tracing import NO_SPAN, NS, Span, failed, request_attributes, step
from gateway.upstream.table import Worker

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


@dataclass(eq=False)
class _Call:
    """One inference request: what it was given, what it holds until the one
    ``finally`` releases it, and the facts its outcome is decided from."""

    rt: Runtime
    info: RequestInfo
    send: Send
    tenant: Tenant
    receipt: Receipt
    exchange: Exchange
    facts: Facts = field(default_factory=Facts)
    plan: Plan | None = None
    #: the route's worker, resolved once after planning
    worker: Worker | None = None
    permit: Permit | None = None
    reservation: Hold | None = None
    # Callers choose x-request-id (and may repeat it); leases need a key of our own.
    # Made only when the request has media (most have none).
    lease_key: str = ""
    leased: bool = False
    #: evidence staged from this request's inline data: forgotten when it ends
    staged: list[str] = field(default_factory=list)
    #: threads taking leases or staging media: waited for even when the request
    #: is cancelled, so that what they take is given back
    threads: list[asyncio.Future[Any]] = field(default_factory=list)
    #: media slot -> its record (named evidence before admission, inline data after)
    resolved: dict[int, EvidenceRecord] = field(default_factory=dict)
    dialect: Dialect | None = None
    relay: Relay | None = None
    producer: BodyProducer | None = None
    usage: Usage | None = None
    #: a Responses id the caller was shown: recorded as the tenant's
    relayed_response: str | None = None
    #: the worker call's span: ended when the worker's response is closed
    worker_span: Span | None = None

    def fail(self, exc: GatewayError) -> None:
        self.facts.error_code, self.facts.error_outcome = exc.code, exc.outcome
        self.info.error_code = exc.code


class InferenceEndpoint:
    """The raw ASGI handler of one descriptor's path."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.path = api.path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rt = runtime_of(scope)
        info = info_of(scope)
        info.endpoint = self.api.name
        policies = rt.policies  # one snapshot for the whole request (reloads swap it)
        try:
            principal = await rt.auth.authenticate(authorization_values(scope), policies)
        except GatewayError as exc:
            await send_error(send, exc, info)
            return
        tenant = policies.tenants[principal.tenant]
        info.tenant = tenant.name
        receipt = Receipt(
            request_id=info.request_id,
            tenant=tenant.name,
            subject=principal.subject,
            endpoint=self.api.name,
            serve_identity=None,
            created=time.time(),
        )
        exchange = Exchange(abort=scope.get("extensions", {}).get(ABORT_EXTENSION))
        call = _Call(rt, info, send, tenant, receipt, exchange)
        rt.inflight.add(exchange)
        try:
            ended = await exchange.run(lambda: self._serve(call, scope, receive, principal))
            if not ended and exchange.shutdown and not exchange.disconnected:
                await self._end_for_shutdown(call)
        except Exception:
            # A bug: the app answers 500; the receipt says what is known.
            call.facts.internal = True
            raise
        finally:
            await self._finish(call)

    # -- before the worker ------------------------------------------------------

    async def _serve(
        self, call: _Call, scope: Scope, receive: Receive, principal: Principal
    ) -> None:
        rt, tenant, info = call.rt, call.tenant, call.info
        try:
            authorize(principal, tenant, self.api.name, self.api.scope)
            rt.check_serving()
            body = await read_body(
                scope, receive, tenant.limits.max_body_bytes, rt.config.listen.body_timeout_s
            )
            plan = self.api.plan(
                parse_json(body, tenant.limits.max_json_depth),
                PlanContext(tenant, os.urandom(8).hex()),
            )
            call.plan = plan
            self._resolve(call, plan)
        except ClientDisconnected:
            call.exchange.disconnected = True
            return
        except GatewayError as exc:
            call.fail(exc)
            await send_error(call.send, exc, info)
            return

        watcher = asyncio.create_task(watch_disconnect(receive, call.exchange))
        try:
            await self._exchange(call, plan)
        except GatewayError as exc:
            call.fail(exc)
            relay = call.relay
            if relay is None or not relay.state.headers_sent:
                await send_error(call.send, exc, info)
        except CallerStalled:
            call.exchange.stall()
        finally:
            watcher.cancel()

    def _resolve(self, call: _Call, plan: Plan) -> None:
        """The route's worker, once for the whole request (spec §16): a reload that
        moves the alias later does not move this request."""
        route = call.tenant.policy.models[plan.alias]
        worker = call.worker = call.rt.table.worker_for(route)
        receipt = call.receipt
        receipt.model_alias = plan.alias
        receipt.route = route
        receipt.upstream = worker.name
        receipt.serve_identity = worker.serve_identity
        receipt.max_tokens = plan.max_tokens
        receipt.stream = plan.stream
        receipt.dropped_parts = list(plan.dropped_parts)
        if not call.rt.readiness.ready(route):
            # Its worker is not touched; other routes keep serving.
            raise GatewayError("upstream_not_ready")

    async def _exchange(self, call: _Call, plan: Plan) -> None:
        rt, tenant, worker = call.rt, call.tenant, call.worker
        assert worker is not None
        config = rt.config
        route = tenant.policy.models[plan.alias]
        forward = self.api.forward(plan, route)
        if plan.previous_response_id is not None:
            await self._own_response(call, plan.previous_response_id)
        await self._media_records(call, plan)
        body = self._layout(forward, plan, call.resolved, config.staging)
        check_size(body.size, worker.config.max_request_bytes)

        limits = tenant.limits
        with step(call.info.span, "gateway.limits"):
            call.reservation = await rt.ratelimit.reserve(
                tenant.name,
                TenantLimits(
                    limits.requests_per_minute,
                    limits.tokens_per_minute,
                    limits.tokens_per_day,
                    limits.max_concurrent_requests,
                ),
                (plan.max_tokens or 0) + estimate_prompt_tokens(plan.prompt_bytes),
                # The slot must outlast the admission wait as well as the worker call.
                wait_s=tenant.policy.admission.queue_timeout_s,
            )
        rate_headers = call.reservation.headers()
        admission = tenant.policy.admission
        queued_at = time.monotonic()
        with step(call.info.span, "gateway.admission", {NS + "upstream": worker.name}):
            call.permit = await worker.admission.acquire(
                tenant.name,
                request_weight(tenant.policy.cost, [m.kind for m in plan.media]),
                share=admission.share,
                max_permits=admission.max_permits,
                timeout_s=admission.queue_timeout_s,
            )
        waited = time.monotonic() - queued_at
        call.receipt.queue_ms = round(waited * 1000, 3)
        rt.metrics.admission_wait.observe(waited)

        if any(ref.source == "data" for ref in plan.media):
            # Inline data is decoded and staged only now, after the permit.
            await self._stage_inline(call, plan)
            body = self._layout(forward, plan, call.resolved, config.staging)
            check_size(body.size, worker.config.max_request_bytes)
        await self._relay(call, plan, body, rate_headers)

    async def _own_response(self, call: _Call, response_id: str) -> None:
        """Forward a previous_response_id only if it is one of the tenant's own."""
        if await call.rt.responses.alias(call.tenant.name, response_id) is None:
            raise GatewayError("response_not_found", param="previous_response_id")

    async def _media_records(self, call: _Call, plan: Plan) -> None:
        """Look up and lease the plan's evidence (catalog only; no file is read)."""
        ids = evidence_ids(plan.media)
        records: dict[str, EvidenceRecord] = {}
        if ids:
            call.lease_key = "lease_" + os.urandom(16).hex()
            evidence, tenant = call.rt.evidence, call.tenant

            def lease() -> list[EvidenceRecord]:
                taken = evidence.lease(call.lease_key, tenant, ids)
                call.leased = True
                return taken

            for record in await self._in_thread(call, lease):
                records[record.id] = record
        for item in check_records(plan, records, call.tenant, "messages"):
            if item.record is not None:
                call.resolved[item.ref.slot] = records[item.record.id]

    async def _stage_inline(self, call: _Call, plan: Plan) -> None:
        evidence, tenant = call.rt.evidence, call.tenant
        inline = [ref for ref in plan.media if ref.source == "data"]
        if not call.lease_key:
            call.lease_key = "lease_" + os.urandom(16).hex()

        def stage() -> None:
            for ref in inline:
                assert ref.data_url is not None
                mime, payload = data_url_parts(ref.data_url)
                record = evidence.upload_inline(tenant, payload, mime, ref.kind)
                call.staged.append(record.id)
                call.resolved[ref.slot] = record
            # Leased like named evidence, so an expiry sweep cannot take their files.
            evidence.lease(call.lease_key, tenant, call.staged)
            call.leased = True

        await self._in_thread(call, stage)

    async def _in_thread(self, call: _Call, work: Callable[[], Any]) -> Any:
        future = asyncio.get_running_loop().run_in_executor(None, work)
        call.threads.append(future)
        # Shielded: a cancel (disconnect, drain) must not leave the thread's
        # leases and staged files unowned; _finish waits for it.
        return await asyncio.shield(future)

    def _layout(
        self,
        forward: dict[str, Any],
        plan: Plan,
        resolved: dict[int, EvidenceRecord],
        staging: StagingConfig,
    ) -> Layout:
        fills: list[bytes | MediaSlot] = []
        for ref in plan.media:
            record = resolved.get(ref.slot)
            if record is None:
                # Inline data not staged yet: its declared type stands in for the size check.
                assert ref.data_url is not None
                mime = data_url_parts(ref.data_url)[0] or "application/octet-stream"
                fills.append(MediaSlot(mime, ref.inline_bytes, "0" * 64, "bin"))
            elif staging.worker_media == "data_url":
                fills.append(MediaSlot(record.media_type, record.bytes, record.sha256, record.ext))
            else:
                url = f"{staging.worker_url_prefix}/{record.sha256}.{record.ext}"
                fills.append(orjson.dumps(url))
        return layout(forward, plan.nonce, fills, orjson.dumps)

    # -- the worker -------------------------------------------------------------

    async def _relay(
        self, call: _Call, plan: Plan, body: Layout, rate_headers: dict[str, str]
    ) -> None:
        rt, info, worker = call.rt, call.info, call.worker
        assert worker is not None
        upstream_cfg = worker.config
        bounds = StreamBounds(framing=upstream_cfg.framing, text_nul=upstream_cfg.text_nul)
        dialect = call.dialect = self.api.dialect(plan, bounds, collect=not plan.stream)
        headers = [*_SSE_HEADERS, *_encode(rate_headers)]
        if plan.stream:
            headers.append((b"x-usage-source", dialect.usage_source.encode()))
        relay = call.relay = Relay(
            dialect,
            timeouts=Timeouts(
                upstream_cfg.first_event_timeout_s,
                upstream_cfg.idle_timeout_s,
                upstream_cfg.total_timeout_s,
            ),
            # x-request-id and CORS are added by the app's one send wrapper.
            response_headers=headers,
            abort=call.exchange.drop_connection,
            before_end=lambda: self._note_response(call),
        )
        producer = call.producer = BodyProducer(body, rt.evidence.store)
        traceparent = None
        if info.span is not NO_SPAN:
            span = call.worker_span = info.span.child(
                f"POST {self.api.path}",
                kind="client",
                attributes={
                    "http.request.method": "POST",
                    "server.address": upstream_cfg.host,
                    "server.port": upstream_cfg.port,
                    "url.path": self.api.path,
                    NS + "upstream": worker.name,
                },
            )
            traceparent = span.traceparent()

        def opener() -> Awaitable[Any]:
            return worker.client.open_stream(
                self.api.path,
                producer.pieces(),
                info.request_id,
                size=body.size,
                accept=self.api.exchange,
                traceparent=traceparent,
            )

        if plan.stream:
            await relay.stream_to(opener, call.send)
            return
        await relay.collect(opener)
        usage = call.usage = self._usage(call)
        answer = dialect.answer(public_usage(usage))
        self._note_response(call)
        reply_headers = {**rate_headers, "x-usage-source": usage.source}
        await send_json(call.send, 200, answer, reply_headers)
        relay.state.finished = relay.state.completed = True

    async def _end_for_shutdown(self, call: _Call) -> None:
        """Past the drain grace: end the request with upstream_unavailable (spec §11)."""
        exc = GatewayError("upstream_unavailable")
        call.info.error_code = exc.code
        relay = call.relay
        if relay is not None and relay.state.finished:
            return
        if relay is not None and relay.state.headers_sent:
            await relay.end_with_error(call.send, exc, LAST_WORDS_S)
            return
        try:
            # A caller that stopped reading must not hold the drain.
            async with asyncio.timeout(LAST_WORDS_S):
                await send_error(call.send, exc, call.info)
        except TimeoutError:
            call.exchange.drop_connection()

    def _note_response(self, call: _Call) -> None:
        """A Responses id becomes the tenant's before the caller can use it."""
        if call.dialect is None or call.plan is None or call.relayed_response is not None:
            return
        report = call.dialect.report()
        response_id = report.response_id
        if response_id is None:
            return
        keep = report.final is not None and call.plan.body.get("store", True) is not False
        body = orjson.dumps(report.final) if keep else None
        call.rt.responses.note(call.tenant.name, response_id, call.plan.alias, body)
        call.relayed_response = response_id

    # -- the one finally --------------------------------------------------------

    async def _finish(self, call: _Call) -> None:
        """Release everything and account for the request.

        All of it is synchronous except waiting for a media thread still
        running and giving back evidence leases (SQLite, in a thread), which
        come last: a cancellation of the request task (the server's own
        shutdown) cannot cost a permit, a receipt or a count.
        """
        pending = [t for t in call.threads if not t.done()]
        if pending:
            await asyncio.wait(pending)
        try:
            self._settle(call)
        finally:
            try:
                if call.leased or call.staged:
                    await anyio.to_thread.run_sync(_after, call)
            finally:
                call.rt.inflight.discard(call.exchange)
                call.exchange.done.set()

    def _usage(self, call: _Call) -> Usage:
        assert call.dialect is not None and call.plan is not None
        report = call.dialect.report()
        return usage_of(report.counts, report.usage, call.plan.prompt_bytes, report.output_estimate)

    def _settle(self, call: _Call) -> None:
        rt, info, receipt, exchange, facts = (
            call.rt,
            call.info,
            call.receipt,
            call.exchange,
            call.facts,
        )
        relay = call.relay
        facts.upstream_closed = relay.close() if relay is not None else False
        if call.producer is not None:
            call.producer.close()
            if call.producer.complete:
                receipt.request_sha256 = call.producer.hasher.hexdigest()
                receipt.request_bytes = call.producer.layout.size
        if call.permit is not None:
            call.permit.release()
        facts.disconnected, facts.stalled = exchange.disconnected, exchange.stalled
        facts.shutdown = exchange.shutdown
        _record_artifacts(receipt, call.plan, call.resolved)
        if call.dialect is not None and relay is not None:
            report = call.dialect.report()
            facts.finished = relay.state.completed
            facts.answer_outcome = report.outcome
            receipt.stream_sha256 = relay.stream_sha256
            receipt.finish_reason = report.finish_reason
            receipt.nul_replaced = report.nul_replaced
            if relay.state.headers_sent or facts.finished:
                self._note_response(call)  # a stream the caller saw begin, ended or not
            receipt.usage = call.usage or self._usage(call)
            if relay.state.first_content_at is not None:
                ttft = relay.state.first_content_at - info.started
                receipt.ttft_ms = round(ttft * 1000, 3)
                rt.metrics.ttft.observe(ttft)
        decision = decide(facts)
        receipt.outcome, receipt.error_code = decision.outcome, decision.error_code
        receipt.cancellation = list(decision.cancellation)
        if call.reservation is not None:
            used = receipt.usage.total_tokens if receipt.usage is not None else 0
            rt.ratelimit.settle(call.reservation, used)
        receipt.duration_ms = round((time.monotonic() - info.started) * 1000, 3)
        info.outcome = receipt.outcome
        if facts.shutdown and info.error_code is None and not facts.finished:
            info.error_code = "upstream_unavailable"
        rt.receipts.write(receipt)
        self._trace(call)
        metrics, tenant = rt.metrics, receipt.tenant
        metrics.child(metrics.stream_outcomes, tenant, receipt.outcome).inc()
        if receipt.usage is not None:
            source = receipt.usage.source
            metrics.child(metrics.tokens, tenant, "prompt", source).inc(receipt.usage.prompt_tokens)
            metrics.child(metrics.tokens, tenant, "completion", source).inc(
                receipt.usage.completion_tokens
            )

    def _trace(self, call: _Call) -> None:
        """GenAI attributes on the request's span; the worker call's span ends
        with the request's outcome (the app's wrapper ends the request's)."""
        info, receipt = call.info, call.receipt
        if info.span is NO_SPAN:
            return
        error = receipt.error_code or ("canceled" if receipt.outcome == "canceled" else None)
        if call.worker_span is not None:
            call.worker_span.end(error=error, failed=failed(info.status, receipt.error_code))
        info.span.set(request_attributes(receipt, self.api.operation))
        alias = receipt.model_alias
        info.span_name = f"{self.api.operation} {alias}" if alias else self.api.operation


def _encode(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


def _record_artifacts(
    receipt: Receipt, plan: Plan | None, resolved: dict[int, EvidenceRecord]
) -> None:
    """Artifacts in request order, a repeated ID once per part (spec §10)."""
    if plan is None:
        return
    records = [resolved[ref.slot] for ref in plan.media if ref.slot in resolved]
    receipt.artifacts = [
        {"evidence_id": r.id, "sha256": r.sha256, "media_type": r.media_type} for r in records
    ]
    receipt.locator_sha256 = [r.locator_sha256 for r in records]


def _after(call: _Call) -> None:
    """The request's evidence work after it ended (in a thread): leases back,
    its inline data forgotten."""
    evidence = call.rt.evidence
    if call.leased:
        evidence.release(call.lease_key)
    for evidence_id in call.staged:
        # Inline data was staged only for this request; its file goes with the record.
        with contextlib.suppress(GatewayError):
            evidence.delete(call.tenant, evidence_id)
