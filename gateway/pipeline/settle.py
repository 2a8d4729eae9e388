"""The one ``finally``: whatever happened, release everything and account for
the request.

All of it is synchronous except waiting for a media thread still running and
giving back evidence leases (SQLite, in a thread), which come last: a
cancellation of the request task (the server's own shutdown) cannot cost a
permit, a receipt or a count.
"""

from __future__ import annotations

import functools
import time

from gateway.apis.base import Api
from gateway.apis.usage import Usage
from gateway.core.outcome import decide
from gateway.observe.tracing import NO_SPAN, failed
from gateway.pipeline.call import Call
from gateway.pipeline.media import record_artifacts
from gateway.pipeline.spans import request_attributes
from gateway.pipeline.timings import as_ms, ms
from gateway.pipeline.worker import usage_of
from gateway.upstream.confirm import CancelConfirmer, State


async def finish(call: Call, api: Api) -> None:
    await call.media.settle()
    try:
        settle(call, api)
    finally:
        try:
            await call.media.close()
        finally:
            call.services.inflight.discard(call.exchange)
            call.exchange.done.set()


def settle(call: Call, api: Api) -> None:
    services, info, receipt, exchange, facts = (
        call.services,
        call.info,
        call.receipt,
        call.exchange,
        call.facts,
    )
    routed, attempt = call.routed, call.attempt
    ttft = None
    if attempt is not None:
        assert routed is not None and call.plan is not None
        relay, producer = attempt.relay, attempt.producer
        facts.upstream_closed = relay.close()
        producer.close()
        if producer.complete:
            receipt.request_sha256 = producer.hasher.hexdigest()
            receipt.request_bytes = producer.layout.size
        if attempt.live:
            routed.worker.live -= 1
        report = attempt.dialect.report()
        facts.finished = relay.state.completed
        facts.answer_outcome = report.outcome
        receipt.stream_sha256 = relay.stream_sha256
        receipt.finish_reason = report.finish_reason
        receipt.nul_replaced = report.nul_replaced
        receipt.upstream_id = report.upstream_id
        if report.media_usage is not None:
            # Images and audio (spec §23): what was made, not tokens.
            receipt.usage, receipt.outputs = report.media_usage, report.outputs
        else:
            receipt.usage = call.usage or usage_of(attempt.dialect, call.plan)
        if attempt.agent is not None:
            receipt.agent = attempt.agent.receipt()
            services.metrics.agent_rounds.observe(attempt.agent.machine.rounds)
        if relay.state.first_content_at is not None:
            ttft = relay.state.first_content_at - info.started
            receipt.ttft_ms = ms(ttft)
            services.metrics.ttft.observe(ttft)
    facts.disconnected, facts.stalled = exchange.disconnected, exchange.stalled
    facts.shutdown = exchange.shutdown
    if routed is not None:
        record_artifacts(receipt, call.plan, routed.records)
    decision = decide(facts)
    receipt.outcome, receipt.error_code = decision.outcome, decision.error_code
    receipt.cancellation = list(decision.cancellation)
    if routed is not None:
        resolved = routed.resolved
        if resolved.release is not None and resolved.arm is not None:
            # The arm that answered (after a fallback, the second): its count and window (§18).
            services.table.releases.settled(
                resolved.release,
                resolved.arm,
                receipt.outcome,
                receipt.error_code,
                ttft,
                reached_worker=call.timings.sent_at is not None,
            )
        if routed.reservation is not None:
            usage = receipt.usage
            billed = isinstance(usage, Usage) and (call.plan is None or call.plan.bills_tokens)
            used = usage.total_tokens if billed and isinstance(usage, Usage) else 0
            services.limits.settle(routed.reservation, used)
    ended = time.monotonic()
    receipt.duration_ms = ms(ended - info.started)
    _record_timings(call, ended)
    info.outcome = receipt.outcome
    if facts.shutdown and info.error_code is None and not facts.finished:
        info.error_code = "upstream_unavailable"
    _trace(call, api)
    confirmer = _confirmer(call)
    if confirmer is None:
        _account(call, None)
    else:
        # The worker may still be running it: its permits wait for the worker's word.
        confirmer.hold(functools.partial(_account, call))


def _confirmer(call: Call) -> CancelConfirmer | None:
    """The confirmation a request that reached its worker but did not end there
    waits for (spec §20): its whole body was sent, and the gateway closed the
    worker's response before its end or gave up waiting for its head."""
    routed, attempt = call.routed, call.attempt
    if routed is None or routed.permit is None or attempt is None:
        return None
    confirmer = routed.worker.confirmer
    if confirmer is None or not attempt.producer.complete:
        return None  # off, or a body cut short (the worker discards it: nothing runs)
    facts = call.facts
    gave_up = call.timings.head_at is None and facts.error_code == "upstream_timeout"
    return confirmer if facts.upstream_closed or gave_up else None


def _account(call: Call, confirmation: State | None) -> None:
    """The permits back, the receipt written, the outcome counted: at the end,
    or once the worker confirmed (or could not)."""
    services, receipt = call.services, call.receipt
    if confirmation is not None:
        receipt.cancellation.append(confirmation)
    if call.routed is not None and call.routed.permit is not None:
        call.routed.permit.release()
    services.receipts.write(receipt)
    metrics, tenant = services.metrics, receipt.tenant
    metrics.child(metrics.stream_outcomes, tenant, receipt.outcome).inc()
    usage = receipt.usage
    if isinstance(usage, Usage):
        source = usage.source
        metrics.child(metrics.tokens, tenant, "prompt", source).inc(usage.prompt_tokens)
        metrics.child(metrics.tokens, tenant, "completion", source).inc(usage.completion_tokens)


def _record_timings(call: Call, ended: float) -> None:
    timings, attempt = call.timings, call.attempt
    if attempt is not None and attempt.producer.media_s:
        timings.add_media(attempt.producer.media_s)
    first = attempt.relay.state.first_content_at if attempt is not None else None
    stages = timings.stages(first, ended)
    call.receipt.timings_ms = as_ms(stages)
    metrics = call.services.metrics
    for stage, seconds in stages.items():
        if seconds is not None:
            metrics.child(metrics.stages, stage).observe(seconds)


def _trace(call: Call, api: Api) -> None:
    """GenAI attributes on the request's span; the worker call's span ends
    with the request's outcome (the app's wrapper ends the request's)."""
    info, receipt = call.info, call.receipt
    if info.span is NO_SPAN:
        return
    error = receipt.error_code or ("canceled" if receipt.outcome == "canceled" else None)
    span = call.attempt.span if call.attempt is not None else None
    if span is not None:
        span.end(error=error, failed=failed(info.status, receipt.error_code))
    info.span.set(request_attributes(receipt, api.endpoint.operation))
    alias = receipt.model_alias
    info.span_name = f"{api.endpoint.operation} {alias}" if alias else api.endpoint.operation
