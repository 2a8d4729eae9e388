"""The worker call: the relay set up for the request's dialect, the body sent
in pieces (evidence read only now), the answer streamed or collected.

A Responses answer is kept (``keep_response``) before the caller can use its
id: before the stream's terminator, before the collected answer. A keep the
state store refuses is ``state_unavailable``: a non-streaming caller gets the
503, a stream (its head already sent) ends with one ``event: error`` naming
it instead of ``[DONE]``.

A release's fallback (``fallback.py``) may make a second attempt on the
other arm when the first failed before the worker's head.

A plan of several calls (spec §23) runs :func:`call_worker` once per call:
every call but the last only collects (its dialect keeps what it checked),
:func:`retire` lets go of the finished call's worker and permit, and the last
call's answer is the caller's. Images asked for as ``url`` are stored as the
tenant's files (:func:`keep_files`) before the answer names them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import cast

import orjson

from gateway.apis.base import Api, Dialect, HeadReader, OutputFile, Plan, Report, StreamBounds
from gateway.apis.responses.conversation import kept_input
from gateway.apis.usage import Usage, public_usage
from gateway.apis.usage import usage_of as settled_usage
from gateway.books.evidence.encode import BodyProducer
from gateway.core.body import Layout, MediaSlot
from gateway.core.errors import GatewayError
from gateway.core.replies import encode_headers
from gateway.observe.tracing import NO_SPAN, NS
from gateway.pipeline.agents import AgentRun, agentic, start_run
from gateway.pipeline.call import Attempt, Call, Routed
from gateway.pipeline.fallback import Fallback
from gateway.pipeline.relay import Opener, Relay, Timeouts
from gateway.pipeline.timings import now
from gateway.upstream.base import WorkerStream

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


async def call_worker(
    call: Call,
    routed: Routed,
    api: Api,
    plan: Plan,
    body: Layout,
    rate_headers: dict[str, str],
    fallback: Fallback | None = None,
    *,
    final: bool = True,
) -> None:
    """One worker call of the plan (a release's fallback may make it twice);
    ``final``: the plan's last, whose answer goes to the caller."""
    # Earlier calls of this plan read into this dialect; the first call makes one.
    carried = call.attempt.dialect if call.attempt is not None else None
    try:
        await _attempt(call, routed, api, plan, body, rate_headers, carried, final)
    except GatewayError as exc:
        other_body = await fallback.take(exc) if fallback is not None else None
        if other_body is None:
            raise exc from None
        await _attempt(call, routed, api, plan, other_body, rate_headers, carried, final)


def retire(call: Call, routed: Routed) -> None:
    """Between two calls of one plan: the finished call lets go of its worker
    (response, body, live count, span) and its permit; its answer stays with
    the dialect, and the next call's times are its own."""
    attempt, timings = call.attempt, call.timings
    if attempt is not None:
        attempt.relay.close()
        attempt.producer.close()
        if attempt.live:
            routed.worker.live -= 1
            attempt.live = False
        if attempt.producer.media_s:
            timings.add_media(attempt.producer.media_s)
            attempt.producer.media_s = 0.0
        if attempt.span is not None:
            attempt.span.end(error=None, failed=False)
            attempt.span = None
    permit, routed.permit = routed.permit, None
    if permit is not None:
        permit.release()
    timings.sent_at = timings.head_at = None


async def _attempt(
    call: Call,
    routed: Routed,
    api: Api,
    plan: Plan,
    body: Layout,
    rate_headers: dict[str, str],
    carried: Dialect | None = None,
    final: bool = True,
) -> None:
    """One worker call: the relay set up for this worker, the body sent, the answer relayed."""
    services, info, worker = call.services, call.info, routed.worker
    upstream_cfg = worker.config
    run = None
    if agentic(plan, worker, api.endpoint.tool_loop):
        run = start_run(services, call.tenant, info.request_id, worker, plan)
    if carried is None:
        bounds = StreamBounds(
            framing=upstream_cfg.framing,
            text_nul=upstream_cfg.text_nul,
            max_prompt_tokens=prompt_token_bound(body, plan),
            agent=run.machine if run is not None else None,
        )
        dialect = api.dialect(plan, bounds, collect=not plan.stream)
    else:
        dialect = carried
        dialect.next_call()  # a fresh source; what earlier calls made stays
    headers = [*_SSE_HEADERS, *encode_headers(rate_headers)]
    if plan.stream:
        headers.append((b"x-usage-source", dialect.usage_source.encode()))
    relay = Relay(
        dialect,
        timeouts=Timeouts(
            upstream_cfg.first_event_timeout_s,
            upstream_cfg.idle_timeout_s,
            upstream_cfg.total_timeout_s,
        ),
        # x-request-id and CORS are added by the app's one send wrapper.
        response_headers=headers,
        abort=call.exchange.drop_connection,
        actor=run,
        body_writer=call.exchange.body_writer,
        # An audio body's format may be in its head alone (audio/pcm;rate=…).
        on_head=_head_reader(dialect) if api.endpoint.exchange == "audio" else None,
    )
    producer = BodyProducer(body, services.blobs)
    attempt = call.attempt = Attempt(dialect, relay, producer, agent=run)
    traceparent = None
    if info.span is not NO_SPAN:
        span = attempt.span = info.span.child(
            f"POST {api.endpoint.upstream_path}",
            kind="client",
            attributes={
                "http.request.method": "POST",
                "server.address": upstream_cfg.host,
                "server.port": upstream_cfg.port,
                "url.path": api.endpoint.upstream_path,
                NS + "upstream": worker.name,
            },
        )
        traceparent = span.traceparent()

    timings = call.timings

    async def opener() -> WorkerStream:
        timings.sent_at = now()
        worker.live += 1
        attempt.live = True
        stream = await worker.client.open_stream(
            api.endpoint.upstream_path,
            producer.pieces(),
            info.request_id,
            size=body.size,
            accept=api.endpoint.exchange,
            traceparent=traceparent,
            rejection=api.endpoint.worker_rejection,
        )
        timings.head_at = now()
        return stream

    if run is None:
        await _relay(call, relay, opener, plan)
    else:
        await _agentic(call, run, relay, opener, plan)
    if plan.stream:
        await relay.end(call.send)
        return
    if not final:
        return
    report = dialect.report()
    if report.media_usage is not None:
        # Images and audio: no tokens to settle; their usage is in the answer.
        await keep_files(call, report.files)
        await relay.reply(call.send, dialect.answer({}), rate_headers)
        return
    usage = call.usage = report_usage(report, plan)
    answer = dialect.answer(public_usage(usage, full=plan.full_usage))
    if run is not None:
        assert isinstance(answer, dict)
        answer["agent"] = run.summary()
    await keep_response(call, dialect, plan)
    await relay.reply(call.send, answer, {**rate_headers, "x-usage-source": usage.source})


def _head_reader(dialect: Dialect) -> Callable[[bytes], None]:
    def on_head(content_type: bytes) -> None:
        # The current call's source (a plan's later calls get fresh ones).
        cast(HeadReader, dialect.source).receive_head(content_type)

    return on_head


async def keep_files(call: Call, files: Sequence[OutputFile]) -> None:
    """Store the outputs a ``url`` answer links to as the tenant's files (spec
    §23) and fill in their signed links, before the answer names them."""
    if not files:
        return
    store, links = call.services.image_files, call.services.links
    if store is None or links is None:
        raise GatewayError("internal_error")  # the composition root always sets both
    for output in files:
        kept = await store.put(call.tenant.name, output.data, output.name)
        output.url = links.link(kept.id)


async def _relay(call: Call, relay: Relay, opener: Opener, plan: Plan) -> None:
    """The worker's answer read whole: streamed to the caller up to its valid
    end (its Responses id kept before the terminator), or collected."""
    if not plan.stream:
        await relay.collect(opener)
        return
    await relay.stream_to(opener, call.send)
    try:
        await keep_response(call, relay.dialect, plan)
    except GatewayError as exc:
        # After headers: the stream ends with one error event, never [DONE].
        await relay.end_with_error(call.send, exc, relay.timeouts.idle_s)
        raise


async def _agentic(call: Call, run: AgentRun, relay: Relay, opener: Opener, plan: Plan) -> None:
    """An agentic answer: bounded by the tenant's ``max_run_s`` (which, unlike
    the stream's timers, does not pause for approvals), and whatever ends it
    -- the bound, the caller leaving -- a pending approval is denied before
    the worker's connection is closed (spec §22)."""
    policy = call.tenant.policy.agents
    bound = asyncio.timeout(policy.max_run_s if policy is not None else None)
    try:
        async with bound:
            await _relay(call, relay, opener, plan)
    except TimeoutError:
        if not bound.expired():
            raise
        await run.deny_pending("max_run_s")
        exc = GatewayError("agent_run_timeout", "The agent run exceeded its time limit.")
        if relay.state.headers_sent:
            await relay.end_with_error(call.send, exc, relay.timeouts.idle_s)
        raise exc from None
    finally:
        await run.deny_pending("caller_gone")


def prompt_token_bound(body: Layout, plan: Plan) -> int:
    """The most prompt tokens the worker may bill for this body (spec §21): a
    token is at least one byte of the forwarded text (media at their staged
    size), plus 4 per message or input and 1,024 of template overhead."""
    staged = body.size
    for segment in body.segments:
        if isinstance(segment, MediaSlot):
            staged += segment.raw_bytes - segment.size
    return staged + 4 * plan.turns + 1024


def usage_of(dialect: Dialect, plan: Plan) -> Usage:
    """The answer's usage: what the worker reported, else estimated."""
    return report_usage(dialect.report(), plan)


def report_usage(report: Report, plan: Plan) -> Usage:
    """The usage a dialect's report gives: what the worker reported, else estimated."""
    return settled_usage(report.counts, report.usage, plan.prompt_bytes, report.output_estimate)


async def keep_response(call: Call, dialect: Dialect, plan: Plan) -> None:
    """Keep a relayed Responses answer for its tenant (spec §17) before the
    caller can name its id; unless the request said ``store: false``."""
    if call.relayed_response is not None:
        return
    report = dialect.report()
    if report.response_id is None or report.final is None:
        return
    call.relayed_response = report.response_id
    if plan.body.get("store", True) is False:
        return
    book = call.services.responses
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
