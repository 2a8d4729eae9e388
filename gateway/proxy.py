"""The inference endpoints: ``POST /v1/chat/completions`` and ``/v1/completions``.

One request: authenticate → authorize → readiness → body guard → plan
(allowlist, limits, caller URLs) → rate buckets → evidence (leases) → render
→ admission permit → worker → validator → caller. The work runs inside one
cancel scope that a disconnect watcher (or a drain past its grace) cancels;
the one ``finally`` closes the worker response, releases the permit, the
leases and the rate reservation, writes the receipt and records metrics,
whatever happened.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.to_thread
import orjson

from gateway.admission import Permit, request_weight
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
from gateway.auth import authorize
from gateway.errors import GatewayError
from gateway.limits import ClientDisconnected, parse_json, read_body
from gateway.policy import Tenant
from gateway.ratelimit import Hold, TenantLimits, estimate_prompt_tokens
from gateway.receipts import Receipt, Usage
from gateway.rewrite import (
    RequestPlan,
    ResolvedMedia,
    decode_data_url,
    media_modalities,
    plan_request,
    render,
)
from gateway.runtime import Exchange, Runtime
from gateway.sse import SSEValidator, StreamRules
from gateway.streaming import CallerStalled, Relay, Timeouts, assemble

#: how long a final message may wait for a caller that stopped reading
_LAST_WORDS_S = 1.0
_PATHS = {"chat.completions": "/v1/chat/completions", "completions": "/v1/completions"}
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


@dataclass(eq=False)
class _Call:
    """One inference request: what it was given, and what it holds until the
    one ``finally`` releases it."""

    rt: Runtime
    info: RequestInfo
    send: Send
    tenant: Tenant
    receipt: Receipt
    exchange: Exchange
    permit: Permit | None = None
    reservation: Hold | None = None
    leased: bool = False
    # Callers choose x-request-id (and may repeat it); leases need a key of our own.
    # Made only when the request has media (most have none).
    lease_key: str = ""
    #: evidence staged from this request's inline data: forgotten when it ends
    staged: list[tuple[Tenant, str]] = field(default_factory=list)
    relay: Relay | None = None
    plan: RequestPlan | None = None
    #: the thread resolving media (leases, staging): waited for even when the
    #: request is cancelled, so that what it takes is given back
    resolving: asyncio.Future[list[ResolvedMedia]] | None = None


class InferenceEndpoint:
    def __init__(self, endpoint: Literal["chat.completions", "completions"]) -> None:
        self.endpoint = endpoint
        self.path = _PATHS[endpoint]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rt = runtime_of(scope)
        info = info_of(scope)
        info.endpoint = self.endpoint
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
            endpoint=self.endpoint,
            serve_identity=rt.serve_identity,
            created=time.time(),
        )
        exchange = Exchange(abort=scope.get("extensions", {}).get(ABORT_EXTENSION))
        call = _Call(rt, info, send, tenant, receipt, exchange)
        rt.inflight.add(exchange)
        try:
            # One cancel scope from the body read on: a disconnect or a drain past
            # its grace ends the request wherever it is.
            async with asyncio.timeout(None) as cancel_scope:
                exchange.scope = cancel_scope
                try:
                    await self._serve(call, scope, receive, principal)
                finally:
                    exchange.scope = None  # no cancel can reach an exited scope
        except TimeoutError:
            if not cancel_scope.expired():
                receipt.outcome, receipt.error_code = "incomplete", "internal_error"
                raise
            if exchange.shutdown and not exchange.disconnected:
                await self._end_for_shutdown(call)
        except Exception:
            # A bug: the app answers 500; the receipt says what is known.
            receipt.outcome, receipt.error_code = "incomplete", "internal_error"
            raise
        finally:
            await self._finish(call)

    async def _serve(self, call: _Call, scope: Scope, receive: Receive, principal: Any) -> None:
        rt, tenant, receipt, info = call.rt, call.tenant, call.receipt, call.info
        try:
            authorize(principal, tenant, self.endpoint)
            if not rt.accepting():
                raise GatewayError("upstream_not_ready")
            body = await read_body(
                scope, receive, tenant.limits.max_body_bytes, rt.config.listen.body_timeout_s
            )
            plan = plan_request(
                self.endpoint,
                parse_json(body, tenant.limits.max_json_depth),
                tenant,
                tenant.policy.models,
            )
        except ClientDisconnected:
            call.exchange.disconnected = True
            return
        except GatewayError as exc:
            receipt.outcome, receipt.error_code = "rejected", exc.code
            await send_error(call.send, exc, info)
            return
        call.plan = plan
        receipt.model_alias = plan.alias
        receipt.route = tenant.policy.models[plan.alias]
        receipt.max_tokens = plan.max_tokens
        receipt.stream = plan.stream
        receipt.dropped_parts = list(plan.dropped_parts)

        watcher = asyncio.create_task(_watch_disconnect(receive, call.exchange))
        try:
            await self._exchange(call, plan)
        except GatewayError as exc:
            receipt.outcome = exc.outcome
            receipt.error_code = exc.code
            relay = call.relay
            if relay is None or not relay.state.headers_sent:
                await send_error(call.send, exc, info)
            else:
                info.error_code = exc.code
        except CallerStalled:
            call.exchange.stalled = True
            call.exchange.drop_connection()
        finally:
            watcher.cancel()

    async def _exchange(self, call: _Call, plan: RequestPlan) -> None:
        rt, tenant, receipt, info = call.rt, call.tenant, call.receipt, call.info
        limits = tenant.limits
        call.reservation = await rt.ratelimit.reserve(
            tenant.name,
            TenantLimits(
                limits.requests_per_minute,
                limits.tokens_per_minute,
                limits.tokens_per_day,
                limits.max_concurrent_requests,
            ),
            plan.max_tokens + estimate_prompt_tokens(plan.prompt_bytes),
        )
        rate_headers = call.reservation.headers()
        resolved = await self._resolve_media(call, plan)
        forwarded = render(
            plan,
            resolved,
            route=rt.config.upstream.route,
            tenant=tenant,
            max_request_bytes=rt.config.upstream.max_request_bytes,
            dumps=orjson.dumps,
        )
        receipt.request_sha256 = hashlib.sha256(forwarded).hexdigest()
        receipt.request_bytes = len(forwarded)
        admission = tenant.policy.admission
        queued_at = time.monotonic()
        call.permit = await rt.admission.acquire(
            tenant.name,
            request_weight(tenant.policy.cost, media_modalities(plan)),
            share=admission.share,
            max_permits=admission.max_permits,
            timeout_s=admission.queue_timeout_s,
        )
        waited = time.monotonic() - queued_at
        receipt.queue_ms = round(waited * 1000, 3)
        rt.metrics.admission_wait.observe(waited)

        upstream_cfg = rt.config.upstream
        validator = SSEValidator(
            StreamRules(
                kind="chat" if self.endpoint == "chat.completions" else "completion",
                max_tokens=plan.max_tokens,
                tools_requested=plan.tools_requested,
                max_line_bytes=upstream_cfg.max_line_bytes,
                max_event_bytes=upstream_cfg.max_line_bytes,
                max_stream_bytes=upstream_cfg.max_stream_bytes,
                max_events=upstream_cfg.max_events,
                loads=orjson.loads,
            )
        )
        relay = call.relay = Relay(
            validator=validator,
            alias=plan.alias,
            include_usage=plan.include_usage,
            timeouts=Timeouts(
                upstream_cfg.first_event_timeout_s,
                upstream_cfg.idle_timeout_s,
                upstream_cfg.total_timeout_s,
            ),
            # x-request-id and CORS are added by the app's one send wrapper.
            response_headers=[
                *_SSE_HEADERS,
                *((k.encode("latin-1"), v.encode("latin-1")) for k, v in rate_headers.items()),
            ],
            abort=call.exchange.drop_connection,
        )

        def opener() -> Any:
            return rt.upstream.open_stream(self.path, forwarded, info.request_id)

        if plan.stream:
            await relay.stream_to(opener, call.send)
        else:
            await relay.collect(opener)
            receipt.usage = _usage(validator, relay, plan)
            body = assemble(
                endpoint=self.endpoint,
                alias=plan.alias,
                validator=validator,
                state=relay.state,
                usage=_public_usage(receipt.usage),
            )
            relay.state.finished = True
            await send_json(call.send, 200, body, rate_headers)

    async def _resolve_media(self, call: _Call, plan: RequestPlan) -> list[ResolvedMedia]:
        pending = plan.media
        if not pending:
            return []
        tenant = call.tenant
        staging = call.rt.config.staging
        evidence = call.rt.evidence
        call.lease_key = "lease_" + os.urandom(16).hex()

        def resolve() -> list[ResolvedMedia]:
            ids: list[str] = []
            inline: dict[str, bytes] = {}  # staged here: the bytes are in hand
            for ref in pending:
                if ref.source == "evidence":
                    assert ref.evidence_id is not None
                    ids.append(ref.evidence_id)
                else:
                    assert ref.data_url is not None
                    mime, data = decode_data_url(ref.data_url, tenant.limits.max_media_bytes)
                    staged = evidence.upload(tenant, data, mime, None).id
                    call.staged.append((tenant, staged))
                    inline[staged] = data
                    ids.append(staged)
            records = evidence.lease(call.lease_key, tenant, ids)
            call.leased = True
            out = []
            for record in records:
                if staging.worker_media == "data_url":
                    data = inline.get(record.id) or evidence.read_bytes(record)
                    encoded = base64.b64encode(data).decode("ascii")
                    url = f"data:{record.media_type};base64,{encoded}"
                else:
                    url = f"{staging.worker_url_prefix}/{record.sha256}.{record.ext}"
                out.append(
                    ResolvedMedia(
                        url=url,
                        modality=record.modality,
                        media_type=record.media_type,
                        size=record.bytes,
                        evidence_id=record.id,
                        sha256=record.sha256,
                        locator_sha256=record.locator_sha256,
                    )
                )
            return out

        call.resolving = asyncio.get_running_loop().run_in_executor(None, resolve)
        # Shielded: a cancel (disconnect, drain) must not leave the thread's
        # leases and staged files unowned; _finish waits for it.
        return await asyncio.shield(call.resolving)

    async def _end_for_shutdown(self, call: _Call) -> None:
        """Past the drain grace: end the request with upstream_unavailable (spec §11)."""
        exc = GatewayError("upstream_unavailable")
        call.receipt.outcome, call.receipt.error_code = "incomplete", exc.code
        call.info.error_code = exc.code
        relay = call.relay
        if relay is not None and relay.state.finished:
            return
        if relay is not None and relay.state.headers_sent:
            await relay.end_with_error(call.send, exc, _LAST_WORDS_S)
            return
        try:
            # A caller that stopped reading must not hold the drain.
            async with asyncio.timeout(_LAST_WORDS_S):
                await send_error(call.send, exc, call.info)
        except TimeoutError:
            call.exchange.drop_connection()

    async def _finish(self, call: _Call) -> None:
        """Release everything and account for the request.

        All of it is synchronous except waiting for a media thread still
        running and giving back evidence leases (SQLite, in a thread), which
        come last: a cancellation of the request task (the server's own
        shutdown) cannot cost a permit, a receipt or a count.
        """
        resolving = call.resolving
        if resolving is not None:
            if not resolving.done():
                await asyncio.wait({resolving})
            if not resolving.cancelled() and resolving.exception() is None:
                _record_artifacts(call.receipt, resolving.result())
        try:
            self._settle(call)
        finally:
            try:
                if call.leased or call.staged:
                    await anyio.to_thread.run_sync(
                        _release_evidence, call.rt, call.lease_key, call.staged
                    )
            finally:
                call.rt.inflight.discard(call.exchange)
                call.exchange.done.set()

    def _settle(self, call: _Call) -> None:
        rt, info, receipt, exchange = call.rt, call.info, call.receipt, call.exchange
        relay = call.relay
        closed_early = relay.close() if relay is not None else False
        if call.permit is not None:
            call.permit.release()
        if exchange.disconnected or exchange.stalled:
            receipt.cancellation.append(
                "caller_disconnected" if exchange.disconnected else "caller_stalled"
            )
            receipt.outcome = "canceled"
            receipt.error_code = None
        if closed_early:
            receipt.cancellation.append("upstream_closed")
        plan = call.plan
        if relay is not None and plan is not None:
            validator = relay.validator
            receipt.stream_sha256 = relay.stream_sha256
            receipt.finish_reason = validator.finish_reason
            if receipt.usage is None:
                receipt.usage = _usage(validator, relay, plan)
            if relay.state.first_content_at is not None:
                receipt.ttft_ms = round((relay.state.first_content_at - info.started) * 1000, 3)
                rt.metrics.ttft.observe(relay.state.first_content_at - info.started)
            if receipt.error_code is None and not exchange.disconnected and relay.state.finished:
                receipt.outcome = "length" if validator.finish_reason == "length" else "complete"
        elif plan is not None and receipt.error_code is None and not exchange.disconnected:
            receipt.outcome = "rejected"
        if call.reservation is not None:
            used = receipt.usage.total_tokens if receipt.usage is not None else 0
            rt.ratelimit.settle(call.reservation, used)
        receipt.duration_ms = round((time.monotonic() - info.started) * 1000, 3)
        info.outcome = receipt.outcome
        rt.receipts.write(receipt)
        metrics, tenant = rt.metrics, receipt.tenant
        metrics.child(metrics.stream_outcomes, tenant, receipt.outcome).inc()
        if receipt.usage is not None:
            source = receipt.usage.source
            metrics.child(metrics.tokens, tenant, "prompt", source).inc(receipt.usage.prompt_tokens)
            metrics.child(metrics.tokens, tenant, "completion", source).inc(
                receipt.usage.completion_tokens
            )


def _record_artifacts(receipt: Receipt, resolved: list[ResolvedMedia]) -> None:
    receipt.artifacts = [
        {"evidence_id": m.evidence_id, "sha256": m.sha256, "media_type": m.media_type}
        for m in resolved
    ]
    receipt.locator_sha256 = [m.locator_sha256 for m in resolved]


def _release_evidence(rt: Runtime, lease_key: str, staged: list[tuple[Tenant, str]]) -> None:
    rt.evidence.release(lease_key)
    for tenant, evidence_id in staged:
        # Inline data was staged only for this request; its file goes with the record.
        with contextlib.suppress(GatewayError):
            rt.evidence.delete(tenant, evidence_id)


async def _watch_disconnect(receive: Receive, exchange: Exchange) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            exchange.cancel()
            return


def _usage(validator: SSEValidator, relay: Relay, plan: RequestPlan) -> Usage:
    reported = validator.usage
    if reported is not None:
        return Usage(
            prompt_tokens=int(reported["prompt_tokens"]),
            completion_tokens=int(reported["completion_tokens"]),
            total_tokens=int(reported["total_tokens"]),
            source="reported",
            reported=dict(reported),
        )
    # No terminal usage (completions never stream it; disconnects and failures lose it).
    prompt = estimate_prompt_tokens(plan.prompt_bytes)
    completion = max(relay.state.content_chunks, math.ceil(validator.text_bytes / 4))
    return Usage(prompt, completion, prompt + completion, "estimated")


def _public_usage(usage: Usage) -> dict[str, Any]:
    if usage.reported is not None:
        return dict(usage.reported)
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
