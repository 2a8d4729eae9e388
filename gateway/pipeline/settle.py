"""The one ``finally``: whatever happened, release everything and account for
the request.

All of it is synchronous except waiting for a media thread still running and
giving back evidence leases (SQLite, in a thread), which come last: a
cancellation of the request task (the server's own shutdown) cannot cost a
permit, a receipt or a count.
"""

from __future__ import annotations

import time

from gateway.apis.base import Api
from gateway.core.outcome import decide
from gateway.observe.tracing import NO_SPAN, failed
from gateway.pipeline.call import Call
from gateway.pipeline.media import record_artifacts
from gateway.pipeline.spans import request_attributes
from gateway.pipeline.worker import note_response, usage_of_call


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
    if call.permit is not None:
        call.permit.release()
    facts.disconnected, facts.stalled = exchange.disconnected, exchange.stalled
    facts.shutdown = exchange.shutdown
    record_artifacts(receipt, call.plan, call.records)
    if call.dialect is not None and relay is not None:
        report = call.dialect.report()
        facts.finished = relay.state.completed
        facts.answer_outcome = report.outcome
        receipt.stream_sha256 = relay.stream_sha256
        receipt.finish_reason = report.finish_reason
        receipt.nul_replaced = report.nul_replaced
        if relay.state.headers_sent or facts.finished:
            note_response(call)  # a stream the caller saw begin, ended or not
        receipt.usage = call.usage or usage_of_call(call)
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
    _trace(call, api)
    metrics, tenant = rt.metrics, receipt.tenant
    metrics.child(metrics.stream_outcomes, tenant, receipt.outcome).inc()
    if receipt.usage is not None:
        source = receipt.usage.source
        metrics.child(metrics.tokens, tenant, "prompt", source).inc(receipt.usage.prompt_tokens)
        metrics.child(metrics.tokens, tenant, "completion", source).inc(
            receipt.usage.completion_tokens
        )


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
