"""The request's steps after planning, on one page (``gateway/pipeline/__init__.py``
lists them): resolve → records → layout → limits → admit → media → worker.

Cost before work (spec §13): everything a request may cost -- body bytes,
prompt bytes, output tokens, media count, types and bytes, the forwarded
body's size -- is checked from what is known before the permit; media bytes
are read only after it, in bounded pieces (``gateway/books/evidence/encode.py``).
No ``if endpoint == …`` here: what differs lives in the descriptor
(``gateway/apis``): the route kinds it runs on, what its permits cost, and
how many worker calls its plan makes (:attr:`~gateway.apis.base.Plan.calls`).

Several calls (an image each, spec §23) are made one after the other: every
call is counted against ``requests_per_minute`` before the first is sent (a
request the tenant cannot afford is refused whole, before any work), and
each waits for its own permit, given back before the next is asked for, so
other tenants' requests interleave with a large ``n``. One dialect reads
them all and the caller gets one answer.
"""

from __future__ import annotations

from gateway.apis.base import Api, Endpoint, Plan
from gateway.apis.responses.conversation import MAX_LINKS, PARAM, expand
from gateway.apis.usage import estimate_prompt_tokens
from gateway.books.receipts import ReleaseMark
from gateway.books.state.guard import require_state
from gateway.config.policy import Tenant
from gateway.core.body import check_size
from gateway.core.errors import GatewayError
from gateway.observe.tracing import NS, step
from gateway.pipeline.admit import permit_for, permit_now
from gateway.pipeline.call import Call, Routed
from gateway.pipeline.fallback import Fallback
from gateway.pipeline.media import body_layout, lease_records, refill, stage_inline
from gateway.pipeline.timings import ms, now
from gateway.pipeline.worker import call_worker, retire
from gateway.ratelimit.core import TenantLimits


def resolve(call: Call, plan: Plan, endpoint: Endpoint) -> Routed:
    """The route's worker, once for the whole request (spec §16): a reload that
    moves the alias later does not move this request. A release's arm is the
    cohort's: the tenant, the credential's subject, or the request id (§18).
    A route of a kind the endpoint does not run on is ``model_not_capable``
    (spec §23), before its readiness is asked."""
    receipt = call.receipt
    resolved = call.services.table.resolve(
        call.tenant.policy.models,
        plan.alias,
        call.services.readiness,
        tenant=call.tenant.name,
        subject=receipt.subject,
        request_id=call.info.request_id,
    )
    if resolved is None:
        # The plan checked the alias against this policy; a reload since removed its release.
        raise GatewayError("model_not_found", param="model")
    routed = call.routed = Routed(resolved)
    worker = resolved.worker
    receipt.model_alias = plan.alias
    mark = None
    if resolved.release is not None and resolved.arm is not None:
        mark = ReleaseMark(resolved.release, resolved.arm)
    receipt.answered_by(resolved.route, worker.name, worker.serve_identity, mark)
    receipt.max_tokens = plan.max_tokens
    receipt.stream = plan.stream
    receipt.dropped_parts = list(plan.dropped_parts)
    plan.full_usage = call.tenant.policy.usage_details == "full"
    if resolved.kind not in endpoint.route_kinds:
        raise GatewayError(
            "model_not_capable",
            f"The model cannot serve {endpoint.path} (it is a {resolved.kind} model).",
            param="model",
        )
    if not resolved.ready:
        # Its worker is not touched; other routes keep serving.
        raise GatewayError("upstream_not_ready")
    return routed


async def run(call: Call, routed: Routed, api: Api, plan: Plan) -> None:
    """Everything from the media records to the worker's answer."""
    services, tenant, resolved = call.services, call.tenant, routed.resolved
    worker = resolved.worker
    staging = services.staging
    agents = worker.config.agents
    if agents is not None and agents.mcp_config and api.endpoint.tool_loop == "ungoverned":
        # Its worker would run its MCP tools for this path unasked (reference §3.2).
        message = "This model would run its tools unasked on this path."
        raise GatewayError("model_not_capable", message, param="model")
    # The store known down: refused before any of it runs, the worker untouched (spec §24).
    require_state(services.state, plan)
    forward = api.forward(plan, resolved.route)
    if plan.previous_response_id is not None:
        # The conversation is the gateway's (spec §17): forwarded whole, counted
        # into the prompt before the body is laid out and its tokens reserved.
        expand(forward, plan, await _conversation(call, plan.previous_response_id), tenant)
    if plan.media:
        began = now()
        await lease_records(call, routed, plan, api.endpoint.media_param)
        call.timings.add_media(now() - began)
    # Laid out once; inline data refills its slots after staging (no second dump).
    body = body_layout(forward, plan, routed.records, staging)
    check_size(body.size, worker.config.max_request_bytes)

    limits = tenant.limits
    tenant_limits = TenantLimits(
        limits.requests_per_minute,
        limits.tokens_per_minute,
        limits.tokens_per_day,
        limits.max_concurrent_requests,
    )
    tokens = _reserve(plan, tenant) if plan.bills_tokens else 0
    # The slot must outlast the admission wait as well as the worker call.
    wait_s = tenant.policy.admission.queue_timeout_s
    began = now()
    try:
        with step(call.info.span, "gateway.limits"):
            # Judged at once when the store is this process's; awaited when shared.
            routed.reservation = services.limits.reserve_now(
                tenant.name, tenant_limits, tokens, wait_s=wait_s
            ) or await services.limits.reserve(tenant.name, tenant_limits, tokens, wait_s=wait_s)
            rate_headers = routed.reservation.headers()
            for _ in range(plan.calls - 1):
                # Each further worker call is a request too: counted, no slot, no token.
                more = await services.limits.reserve(
                    tenant.name, tenant_limits, 0, concurrent=False
                )
                services.limits.settle(more, 0)
                rate_headers = more.headers()
    finally:
        # The stage ran, refused or not (spec §20).
        call.timings.limits = now() - began

    for index in range(plan.calls):
        if index:
            retire(call, routed)  # the last call's worker and permit, before the next wait
            if routed.resolved is not resolved:
                # A release's fallback moved the request (spec §18): the rest go there too.
                resolved = routed.resolved
                forward = api.forward(plan, resolved.route)
                body = body_layout(forward, plan, routed.records, staging)
                check_size(body.size, resolved.worker.config.max_request_bytes)
        await _admit(call, routed, api, plan)
        if index == 0:
            # Admitted: its write-ahead line, so a replica killed from now on leaves a trace (§24).
            services.receipts.open(call.receipt)
            if any(ref.source == "data" for ref in plan.media):
                # Inline data is decoded and staged only now, after the permit.
                began = now()
                await stage_inline(call, routed, plan)
                call.timings.add_media(now() - began)
                body = refill(body, plan, routed.records, staging)
                check_size(body.size, worker.config.max_request_bytes)
        fallback = None if resolved.other is None else Fallback(call, routed, api, plan, forward)
        final = index == plan.calls - 1
        await call_worker(call, routed, api, plan, body, rate_headers, fallback, final=final)


async def _admit(call: Call, routed: Routed, api: Api, plan: Plan) -> None:
    """One worker call's permit (spec §7); the waits of several calls add up."""
    worker = routed.worker
    queued_at = now()
    tenant, endpoint = call.tenant, api.endpoint
    with step(call.info.span, "gateway.admission", {NS + "upstream": worker.name}):
        # An unloaded worker's permit without a future or a wait; else queued.
        routed.permit = permit_now(tenant, worker, plan, endpoint) or await permit_for(
            tenant, worker, plan, endpoint
        )
    waited = now() - queued_at
    call.timings.admission = (call.timings.admission or 0.0) + waited
    call.receipt.queue_ms = ms(call.timings.admission)
    call.services.metrics.admission_wait.observe(waited)


def _reserve(plan: Plan, tenant: Tenant) -> int:
    """Tokens to reserve: the output bound and a prompt estimate, and for an
    agentic request ``reserve_tokens_per_round`` per round it may run (spec §22)."""
    tokens = (plan.max_tokens or 0) + estimate_prompt_tokens(plan.prompt_bytes)
    policy = tenant.policy.agents
    if plan.agent is not None and policy is not None:
        tokens += policy.reserve_tokens_per_round * plan.agent.rounds
    return tokens


async def _conversation(call: Call, response_id: str) -> list[tuple[bytes, bytes]]:
    """The (input items, output items) of the tenant's conversation ending at
    ``response_id``, oldest first; never a part of it (spec §17)."""
    chain = await call.services.responses.chain(call.tenant.name, response_id, MAX_LINKS)
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
