"""The worker call: the relay set up for the request's dialect, the body sent
in pieces (evidence read only now), the answer streamed or collected.

A Responses answer is kept (``keep_response``) before the caller can use its
id: before the stream's terminator, before the collected answer. A keep the
state store refuses is ``state_unavailable``: a non-streaming caller gets the
503, a stream (its head already sent) ends with one ``event: error`` naming
it instead of ``[DONE]``.

Fallback (spec §18): when the alias names a release with ``fallback``, a
connection refused or reset before the worker's response head, or a 5xx
head, is sent once to the other arm (``reroute``: that arm's body and permit,
the first permit given back first). Nothing else is retried: not a timeout,
not a failure after the head. The caller sees one answer; the receipt names
the arm that answered, and the failed attempt is counted for its own arm.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson

from gateway.apis.base import Api, Plan, StreamBounds
from gateway.apis.responses.conversation import kept_input
from gateway.apis.usage import Usage, public_usage, usage_of
from gateway.books.evidence.encode import BodyProducer
from gateway.books.receipts import ReleaseMark
from gateway.core.body import Layout, MediaSlot
from gateway.core.errors import GatewayError
from gateway.core.replies import encode_headers
from gateway.observe.tracing import NO_SPAN, NS
from gateway.pipeline.call import Call
from gateway.pipeline.relay import Relay, Timeouts
from gateway.pipeline.timings import now
from gateway.upstream.client import UpstreamStream
from gateway.upstream.table import Resolved

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


#: the other arm's forwarded body, once its permit is held (``steps._reroute``)
Reroute = Callable[[Resolved], Awaitable[Layout]]
#: failures before the worker's head that a release's fallback retries once
_FALLBACK_CODES = frozenset({"upstream_unavailable", "upstream_error"})


async def call_worker(
    call: Call,
    api: Api,
    plan: Plan,
    body: Layout,
    rate_headers: dict[str, str],
    reroute: Reroute | None = None,
) -> None:
    try:
        await _attempt(call, api, plan, body, rate_headers)
    except GatewayError as exc:
        other = _fallback_arm(call, exc) if reroute is not None else None
        if reroute is None or other is None:
            raise
        _abandon(call, exc)
        try:
            body = await reroute(other)
        except GatewayError:
            raise exc from None  # no fallback after all: the caller hears the first failure
        _switch(call, other, exc)
        await _attempt(call, api, plan, body, rate_headers)


def _fallback_arm(call: Call, exc: GatewayError) -> Resolved | None:
    """The other arm, when this failure may be sent there: refused, reset or
    5xx before the worker's head (the relay sent nothing yet), the other arm ready."""
    resolved = call.resolved
    other = resolved.other if resolved is not None else None
    if other is None or exc.code not in _FALLBACK_CODES:
        return None
    timings, relay = call.timings, call.relay
    if timings.sent_at is None or timings.head_at is not None:
        return None
    if relay is not None and relay.state.headers_sent:
        return None
    return other if call.rt.readiness.ready(other.route) else None


def _abandon(call: Call, exc: GatewayError) -> None:
    """Let go of the failed attempt: its worker's live count, its body, its span."""
    if call.live:
        call.worker.live -= 1
        call.live = False
    if call.producer is not None:
        call.producer.close()  # kept: a fallback that does not happen leaves its digest
    if call.worker_span is not None:
        call.worker_span.end(error=exc.code, failed=True)
        call.worker_span = None


def _switch(call: Call, other: Resolved, exc: GatewayError) -> None:
    """From now on the request is the other arm's; the failed attempt is counted
    for its own arm (a canary's fallback is a canary failure in the gate)."""
    first = call.resolved
    assert first is not None and first.release is not None and first.arm is not None
    call.rt.table.releases.settled(
        first.release, first.arm, exc.outcome, exc.code, None, reached_worker=True
    )
    call.resolved = other
    receipt = call.receipt
    receipt.route, receipt.upstream = other.route, other.worker.name
    receipt.serve_identity = other.worker.serve_identity
    assert other.release is not None and other.arm is not None
    receipt.release = ReleaseMark(other.release, other.arm, fallback_from=first.arm)
    timings, producer = call.timings, call.producer
    if producer is not None and producer.media_s:
        timings.add_media(producer.media_s)  # the next attempt brings its own producer
    call.producer = None
    timings.sent_at = None


async def _attempt(
    call: Call, api: Api, plan: Plan, body: Layout, rate_headers: dict[str, str]
) -> None:
    """One worker call: the relay set up for this worker, the body sent, the answer relayed."""
    rt, info, worker = call.rt, call.info, call.worker
    upstream_cfg = worker.config
    bounds = StreamBounds(
        framing=upstream_cfg.framing,
        text_nul=upstream_cfg.text_nul,
        max_prompt_tokens=prompt_token_bound(body, plan),
    )
    dialect = call.dialect = api.dialect(plan, bounds, collect=not plan.stream)
    headers = [*_SSE_HEADERS, *encode_headers(rate_headers)]
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
    )
    producer = call.producer = BodyProducer(body, rt.evidence.store)
    traceparent = None
    if info.span is not NO_SPAN:
        span = call.worker_span = info.span.child(
            f"POST {api.upstream_path}",
            kind="client",
            attributes={
                "http.request.method": "POST",
                "server.address": upstream_cfg.host,
                "server.port": upstream_cfg.port,
                "url.path": api.upstream_path,
                NS + "upstream": worker.name,
            },
        )
        traceparent = span.traceparent()

    timings = call.timings

    async def opener() -> UpstreamStream:
        timings.sent_at = now()
        worker.live += 1
        call.live = True
        stream = await worker.client.open_stream(
            api.upstream_path,
            producer.pieces(),
            info.request_id,
            size=body.size,
            accept=api.exchange,
            traceparent=traceparent,
        )
        timings.head_at = now()
        return stream

    if plan.stream:
        await relay.stream_to(opener, call.send)
        try:
            await keep_response(call)
        except GatewayError as exc:
            # After headers: the stream ends with one error event, never [DONE].
            await relay.end_with_error(call.send, exc, upstream_cfg.idle_timeout_s)
            raise
        await relay.end(call.send)
        return
    await relay.collect(opener)
    usage = call.usage = usage_of_call(call)
    answer = dialect.answer(public_usage(usage, full=plan.full_usage))
    await keep_response(call)
    await relay.reply(call.send, answer, {**rate_headers, "x-usage-source": usage.source})


def prompt_token_bound(body: Layout, plan: Plan) -> int:
    """The most prompt tokens the worker may bill for this body (spec §21): a
    token is at least one byte of the forwarded text (media at their staged
    size), plus 4 per message or input and 1,024 of template overhead."""
    staged = body.size
    for segment in body.segments:
        if isinstance(segment, MediaSlot):
            staged += segment.raw_bytes - segment.size
    return staged + 4 * plan.turns + 1024


def usage_of_call(call: Call) -> Usage:
    assert call.dialect is not None and call.plan is not None
    report = call.dialect.report()
    return usage_of(report.counts, report.usage, call.plan.prompt_bytes, report.output_estimate)


async def keep_response(call: Call) -> None:
    """Keep a relayed Responses answer for its tenant (spec §17) before the
    caller can name its id; unless the request said ``store: false``."""
    if call.dialect is None or call.plan is None or call.relayed_response is not None:
        return
    report = call.dialect.report()
    if report.response_id is None or report.final is None:
        return
    call.relayed_response = report.response_id
    plan = call.plan
    if plan.body.get("store", True) is False:
        return
    book = call.rt.responses
    row = book.row(
        tenant=call.tenant.name,
        response_id=report.response_id,
        alias=plan.alias,
        previous_id=plan.previous_response_id,
        input_items=orjson.dumps(kept_input(plan)),
        output_items=orjson.dumps(report.final.get("output") or []),
        body=orjson.dumps(report.final),
        upstream_id=report.upstream_id,
    )
    try:
        await book.keep(row, call.tenant.policy.responses.max_bytes)
    except GatewayError as exc:
        # The answer was made (and is billed) but cannot be named later.
        raise GatewayError(exc.code, exc.message, outcome="incomplete") from exc
