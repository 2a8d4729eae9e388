"""The request's steps after planning, on one page (``gateway/pipeline/__init__.py``
lists them): resolve → records → layout → limits → admit → media → worker.

Cost before work (spec §13): everything a request may cost -- body bytes,
prompt bytes, output tokens, media count, types and bytes, the forwarded
body's size -- is checked from what is known before the permit; media bytes
are read only after it, in bounded pieces (``gateway/books/evidence/encode.py``).
No ``if endpoint == …`` here: what differs lives in the descriptor
(``gateway/apis``).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable
from typing import Any

from gateway.admission import Permit, request_weight
from gateway.apis.base import Api, Plan
from gateway.apis.responses.conversation import MAX_LINKS, PARAM, expand
from gateway.apis.usage import estimate_prompt_tokens
from gateway.books.receipts import ReleaseMark
from gateway.core.body import Layout, check_size
from gateway.core.errors import GatewayError
from gateway.observe.tracing import NS, step
from gateway.pipeline.call import Call
from gateway.pipeline.media import body_layout, lease_records, stage_inline
from gateway.pipeline.timings import ms, now
from gateway.pipeline.worker import call_worker
from gateway.ratelimit import TenantLimits
from gateway.upstream.table import Resolved, Worker


def resolve(call: Call, plan: Plan) -> None:
    """The route's worker, once for the whole request (spec §16): a reload that
    moves the alias later does not move this request. A release's arm is the
    cohort's: the tenant, the credential's subject, or the request id (§18)."""
    receipt = call.receipt
    resolved = call.rt.table.resolve(
        call.tenant.policy.models,
        plan.alias,
        call.rt.readiness,
        tenant=call.tenant.name,
        subject=receipt.subject,
        request_id=call.info.request_id,
    )
    if resolved is None:
        # The plan checked the alias against this policy; a reload since removed its release.
        raise GatewayError("model_not_found", param="model")
    call.resolved = resolved
    worker = resolved.worker
    receipt.model_alias = plan.alias
    receipt.route = resolved.route
    receipt.upstream = worker.name
    receipt.serve_identity = worker.serve_identity
    if resolved.release is not None and resolved.arm is not None:
        receipt.release = ReleaseMark(resolved.release, resolved.arm)
    receipt.max_tokens = plan.max_tokens
    receipt.stream = plan.stream
    receipt.dropped_parts = list(plan.dropped_parts)
    plan.full_usage = call.tenant.policy.usage_details == "full"
    if not resolved.ready:
        # Its worker is not touched; other routes keep serving.
        raise GatewayError("upstream_not_ready")


async def run(call: Call, api: Api, plan: Plan) -> None:
    """Everything from the media records to the worker's answer."""
    rt, tenant, worker, resolved = call.rt, call.tenant, call.worker, call.resolved
    assert resolved is not None
    staging = rt.config.staging
    forward = api.forward(plan, resolved.route)
    if plan.previous_response_id is not None:
        # The conversation is the gateway's (spec §17): forwarded whole, counted
        # into the prompt before the body is laid out and its tokens reserved.
        expand(forward, plan, await _conversation(call, plan.previous_response_id), tenant)
    if plan.media:
        began = now()
        await lease_records(call, plan, api.media_param)
        call.timings.add_media(now() - began)
    body = body_layout(forward, plan, call.records, staging)
    check_size(body.size, worker.config.max_request_bytes)

    limits = tenant.limits
    began = now()
    try:
        with step(call.info.span, "gateway.limits"):
            call.reservation = await rt.ratelimit.reserve(
                tenant.name,
                TenantLimits(
                    limits.requests_per_minute,
                    limits.tokens_per_minute,
                    limits.tokens_per_day,
                    limits.max_concurrent_requests,
                ),
                (plan.max_tokens or 0) + estimate_prompt_tokens(plan.prompt_bytes)
                if plan.bills_tokens
                else 0,
                # The slot must outlast the admission wait as well as the worker call.
                wait_s=tenant.policy.admission.queue_timeout_s,
            )
    finally:
        # The stage ran, refused or not (spec §20).
        call.timings.limits = now() - began
    rate_headers = call.reservation.headers()
    queued_at = now()
    with step(call.info.span, "gateway.admission", {NS + "upstream": worker.name}):
        call.permit = await _permit(call, worker, plan)
    waited = call.timings.admission = now() - queued_at
    call.receipt.queue_ms = ms(waited)
    rt.metrics.admission_wait.observe(waited)

    if any(ref.source == "data" for ref in plan.media):
        # Inline data is decoded and staged only now, after the permit.
        began = now()
        await stage_inline(call, plan)
        call.timings.add_media(now() - began)
        body = body_layout(forward, plan, call.records, staging)
        check_size(body.size, worker.config.max_request_bytes)
    reroute = None if resolved.other is None else functools.partial(_reroute, call, api, forward)
    await call_worker(call, api, plan, body, rate_headers, reroute)


def _permit(call: Call, worker: Worker, plan: Plan) -> Awaitable[Permit]:
    """The request's admission permit on ``worker``."""
    tenant = call.tenant
    admission = tenant.policy.admission
    return worker.admission.acquire(
        tenant.name,
        request_weight(tenant.policy.cost, [m.kind for m in plan.media]),
        share=admission.share,
        max_permits=admission.max_permits,
        timeout_s=admission.queue_timeout_s,
    )


async def _reroute(call: Call, api: Api, forward: dict[str, Any], other: Resolved) -> Layout:
    """A release's fallback (spec §18): the body naming the other arm's route,
    and a permit of its upstream. The first arm's permit goes back before the
    other's is waited for: a tenant's ``max_permits`` counts across upstreams,
    and the first worker has no part of the request any more."""
    plan = call.plan
    assert plan is not None
    fresh = api.forward(plan, other.route)
    # Wherever the descriptor writes the route, the other's; the rest as sent
    # (a conversation already expanded into it).
    moved = {**forward, **{key: value for key, value in fresh.items() if value == other.route}}
    body = body_layout(moved, plan, call.records, call.rt.config.staging)
    check_size(body.size, other.worker.config.max_request_bytes)
    permit: Permit | None = call.permit
    if permit is not None:
        call.permit = None
        permit.release()
    queued_at = now()
    with step(call.info.span, "gateway.admission", {NS + "upstream": other.worker.name}):
        call.permit = await _permit(call, other.worker, plan)
    waited = now() - queued_at
    call.timings.admission = (call.timings.admission or 0.0) + waited
    call.receipt.queue_ms = ms(call.timings.admission)
    return body


async def _conversation(call: Call, response_id: str) -> list[tuple[bytes, bytes]]:
    """The (input items, output items) of the tenant's conversation ending at
    ``response_id``, oldest first; never a part of it (spec §17)."""
    chain = await call.rt.responses.chain(call.tenant.name, response_id, MAX_LINKS)
    if not chain:
        raise GatewayError("response_not_found", param=PARAM)
    if chain[0].previous_id is not None:
        if len(chain) >= MAX_LINKS:
            raise GatewayError(
                "prompt_too_large",
                f"The conversation is longer than {MAX_LINKS} responses.",
                param=PARAM,
            )
        raise GatewayError(
            "response_not_found",
            "An earlier response of this conversation is no longer kept.",
            param=PARAM,
        )
    return [(link.input_items, link.output_items) for link in chain]
