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
from gateway.core.outcome import decide
from gateway.observe.tracing import NO_SPAN, failed
from gateway.pipeline.call import Call
from gateway.pipeline.media import record_artifacts
from gateway.pipeline.spans import request_attributes
from gateway.pipeline.timings import as_ms, ms
from gateway.pipeline.worker import usage_of_call
from gateway.upstream.confirm import CancelConfirmer, State


async def finish(call: Call, api: Api) -> None:
    await call.media.settle()
    try:
        settle(call, api)
    finally:
        try:
            await call.media.close()
        finally:
            call.rt.inflight.discard(call.exchange)
            call.exchange.done.set()


def settle(call: Call, api: Api) -> None:
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
    if call.live:
        call.worker.live -= 1
    facts.disconnected, facts.stalled = exchange.disconnected, exchange.stalled
    facts.shutdown = exchange.shutdown
    record_artifacts(receipt, call.plan, call.records)
    ttft = None
    if call.dialect is not None and relay is not None:
        report = call.dialect.report()
        facts.finished = relay.state.completed
        facts.answer_outcome = report.outcome
        receipt.stream_sha256 = relay.stream_sha256
        receipt.finish_reason = report.finish_reason
        receipt.nul_replaced = report.nul_replaced
        receipt.upstream_id = report.upstream_id
        receipt.usage = call.usage or usage_of_call(call)
        if relay.state.first_content_at is not None:
            ttft = relay.state.first_content_at - info.started
            receipt.ttft_ms = ms(ttft)
            rt.metrics.ttft.observe(ttft)
    decision = decide(facts)
    receipt.outcome, receipt.error_code = decision.outcome, decision.error_code
    receipt.cancellation = list(decision.cancellation)
    resolved = call.resolved
    if resolved is not None and resolved.release is not None and resolved.arm is not None:
        # The arm that answered (after a fallback, the second): its count and window (§18).
        rt.table.releases.settled(
            resolved.release,
            resolved.arm,
            receipt.outcome,
            receipt.error_code,
            ttft,
            reached_worker=call.timings.sent_at is not None,
        )
    if call.reservation is not None:
        billed = receipt.usage is not None and (call.plan is None or call.plan.bills_tokens)
        used = receipt.usage.total_tokens if billed and receipt.usage is not None else 0
        rt.ratelimit.settle(call.reservation, used)
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
    if call.permit is None or call.resolved is None or call.worker.confirmer is None:
        return None
    producer = call.producer
    if producer is None or not producer.complete:
        return None  # a body cut short is discarded by the worker: nothing runs
    facts = call.facts
    gave_up = call.timings.head_at is None and facts.error_code == "upstream_timeout"
    return call.worker.confirmer if facts.upstream_closed or gave_up else None


def _account(call: Call, confirmation: State | None) -> None:
    """The permits back, the receipt written, the outcome counted: at the end,
    or once the worker confirmed (or could not)."""
    rt, receipt = call.rt, call.receipt
    if confirmation is not None:
        receipt.cancellation.append(confirmation)
    if call.permit is not None:
        call.permit.release()
    rt.receipts.write(receipt)
    metrics, tenant = rt.metrics, receipt.tenant
    metrics.child(metrics.stream_outcomes, tenant, receipt.outcome).inc()
    if receipt.usage is not None:
        source = receipt.usage.source
        metrics.child(metrics.tokens, tenant, "prompt", source).inc(receipt.usage.prompt_tokens)
        metrics.child(metrics.tokens, tenant, "completion", source).inc(
            receipt.usage.completion_tokens
        )


def _record_timings(call: Call, ended: float) -> None:
    timings = call.timings
    if call.producer is not None and call.producer.media_s:
        timings.add_media(call.producer.media_s)
    first = call.relay.state.first_content_at if call.relay is not None else None
    stages = timings.stages(first, ended)
    call.receipt.timings_ms = as_ms(stages)
    metrics = call.rt.metrics
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
    if call.worker_span is not None:
        call.worker_span.end(error=error, failed=failed(info.status, receipt.error_code))
    info.span.set(request_attributes(receipt, api.operation))
    alias = receipt.model_alias
    info.span_name = f"{api.operation} {alias}" if alias else api.operation
