"""The request's one ``finally`` (``settle.finish``/``settle.settle``) and the
worker call's bookkeeping (``worker.keep_response``, ``worker.usage_of``),
on small real objects: a real chat dialect and relay over a fake worker stream,
real metrics, recording fakes for the receipt writer, limits and Responses ids."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import orjson
import pytest

from gateway.apis.base import MediaRef, OneCall, Report, StreamBounds
from gateway.apis.chat.api import ChatApi
from gateway.apis.usage import Usage
from gateway.core.errors import GatewayError
from gateway.pipeline.call import Attempt, Call
from gateway.pipeline.relay import Relay, Timeouts
from gateway.pipeline.settle import finish, settle
from gateway.pipeline.worker import keep_response, usage_of
from tests.pipeline.support import (
    ALIAS,
    TENANT,
    Caller,
    FakeMedia,
    FakeUpstream,
    attempt_of,
    chat_plan,
    hold,
    limits_of,
    make_call,
    receipts_of,
    record,
    responses_of,
    route_call,
    sent_body,
    sse_fixture,
)
from tests.support.sse import chunk, event

API = ChatApi()
VALID = sse_fixture("chat_valid.sse")
RESPONSE_ID = "resp_0123-abcd"


def _sample(call: Call, name: str, **labels: str) -> float:
    value = call.services.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def _streamed(call: Call, raw: bytes, *, end: bool = True) -> FakeUpstream:
    """Run a real relay over ``raw`` for ``call`` as ``worker.call_worker`` does."""
    plan = call.plan = call.plan or chat_plan()
    if call.routed is None:
        route_call(call)
    dialect = API.dialect(plan, StreamBounds(), collect=False)
    relay = Relay(dialect, timeouts=Timeouts(5, 0.05, 5), response_headers=[])
    call.attempt = Attempt(dialect, relay, sent_body())
    upstream = FakeUpstream([raw], end=end)
    try:
        async with asyncio.timeout(5):
            await relay.stream_to(upstream.opener(), call.send)
            await relay.end(call.send)
    except GatewayError as exc:
        call.fail(exc)
    return upstream


# -- settle: what the receipt says --------------------------------------------


async def test_a_refusal_before_the_worker_is_one_rejected_receipt() -> None:
    call = make_call()
    call.fail(GatewayError("rate_limited"))
    settle(call, API)
    (receipt,) = receipts_of(call.services).written
    assert receipt is call.receipt
    assert (receipt.outcome, receipt.error_code) == ("rejected", "rate_limited")
    assert receipt.usage is None and receipt.stream_sha256 is None and receipt.ttft_ms is None
    assert receipt.cancellation == [] and call.info.outcome == "rejected"
    assert not call.facts.upstream_closed
    assert _sample(call, "gateway_stream_outcomes_total", tenant=TENANT, outcome="rejected") == 1
    assert receipt.duration_ms is not None and receipt.duration_ms >= 0


async def test_a_complete_stream_is_accounted_for_whole() -> None:
    call = make_call()
    routed = route_call(call)
    routed.reservation = hold()
    permit = routed.permit = await routed.worker.admission.acquire(
        TENANT, 1, share=1, max_permits=4, timeout_s=1
    )
    upstream = await _streamed(call, VALID)
    settle(call, API)
    receipt = call.receipt
    assert (receipt.outcome, receipt.error_code) == ("complete", None)
    assert receipt.finish_reason == "stop" and receipt.nul_replaced == 0
    assert receipt.stream_sha256 == hashlib.sha256(VALID).hexdigest()
    assert isinstance(receipt.usage, Usage)
    assert (receipt.usage.prompt_tokens, receipt.usage.completion_tokens) == (9, 12)
    assert receipt.usage.source == "reported"
    assert receipt.ttft_ms is not None and receipt.ttft_ms >= 0
    assert permit.released and routed.worker.admission.in_use == 0
    assert limits_of(call.services).settled == [(routed.reservation, 21)]
    assert upstream.close_calls == 0 and not call.facts.upstream_closed
    tokens = {"tenant": TENANT, "source": "reported"}
    assert _sample(call, "gateway_tokens_total", kind="prompt", **tokens) == 9
    assert _sample(call, "gateway_tokens_total", kind="completion", **tokens) == 12
    assert _sample(call, "gateway_ttft_seconds_count") == 1


async def test_a_length_finish_is_the_dialects_outcome() -> None:
    raw = event(chunk("a")) + event(
        chunk("", "length", {"completion_tokens": 1, "prompt_tokens": 2, "total_tokens": 3})
    )
    call = make_call()
    await _streamed(call, raw + b"data: [DONE]\n\n")
    settle(call, API)
    assert (call.receipt.outcome, call.receipt.finish_reason) == ("length", "length")


async def test_a_stream_cut_short_is_incomplete_with_estimated_usage() -> None:
    call = make_call()
    call.plan = chat_plan(prompt_bytes=40)
    await _streamed(call, event(chunk("abcdefgh")) + event(chunk("ij")))
    settle(call, API)
    receipt = call.receipt
    assert (receipt.outcome, receipt.error_code) == ("incomplete", "upstream_unavailable")
    assert receipt.usage == Usage(10, 3, 13, "estimated")
    assert receipt.finish_reason is None
    assert receipts_of(call.services).written == [receipt]


async def test_a_caller_gone_mid_stream_is_canceled_and_the_worker_closed() -> None:
    call = make_call()
    call.exchange.disconnected = True
    # The worker is still sending when the request ends.
    upstream = await _streamed(call, event(chunk("a")), end=False)
    settle(call, API)
    assert upstream.close_calls == 1
    assert call.receipt.outcome == "canceled"
    assert call.receipt.cancellation == ["caller_disconnected", "upstream_closed"]
    assert call.facts.disconnected and call.facts.upstream_closed


async def test_a_stalled_caller_is_canceled_as_stalled() -> None:
    call = make_call()
    call.exchange.stall()
    settle(call, API)
    assert call.receipt.outcome == "canceled"
    assert call.receipt.cancellation == ["caller_stalled"]


async def test_a_shutdown_before_the_end_is_upstream_unavailable() -> None:
    call = make_call()
    call.exchange.shutdown = True
    settle(call, API)
    assert (call.receipt.outcome, call.receipt.error_code) == ("incomplete", "upstream_unavailable")
    assert call.info.error_code == "upstream_unavailable"


async def test_a_finished_stream_is_not_blamed_on_a_later_shutdown() -> None:
    call = make_call()
    await _streamed(call, VALID)
    call.exchange.shutdown = True
    settle(call, API)
    assert call.receipt.outcome == "complete" and call.info.error_code is None


@pytest.mark.parametrize("complete", [True, False])
async def test_the_request_digest_is_recorded_only_for_a_body_sent_whole(complete: bool) -> None:
    call = make_call()
    call.plan = chat_plan()
    route_call(call)
    dialect = API.dialect(call.plan, StreamBounds(), collect=False)
    relay = Relay(dialect, timeouts=Timeouts(1, 1, 1), response_headers=[])
    producer = sent_body(complete=complete)
    closed: list[bool] = []
    producer.close = lambda: closed.append(True)  # type: ignore[method-assign]
    call.attempt = Attempt(dialect, relay, producer)
    settle(call, API)
    assert closed == [True]
    if complete:
        assert call.receipt.request_sha256 == hashlib.sha256(b'{"model":"x"}').hexdigest()
        assert call.receipt.request_bytes == len(b'{"model":"x"}')
    else:
        assert call.receipt.request_sha256 is None and call.receipt.request_bytes is None


async def test_artifacts_reach_the_receipt() -> None:
    call = make_call()
    plan = call.plan = chat_plan()
    png = record("ev_png")
    plan.media = [MediaRef(0, 0, "image", "evidence", "ev_png")]
    route_call(call).records = {0: png}
    settle(call, API)
    assert call.receipt.artifacts == [
        {"evidence_id": "ev_png", "sha256": png.sha256, "media_type": "image/png"}
    ]


async def test_a_reservation_is_settled_with_zero_without_usage() -> None:
    call = make_call()
    held = route_call(call).reservation = hold()
    call.fail(GatewayError("upstream_not_ready"))
    settle(call, API)
    assert limits_of(call.services).settled == [(held, 0)]


# -- finish: the order of the finally -----------------------------------------


async def test_finish_settles_media_then_books_then_gives_back() -> None:
    media = FakeMedia()
    call = make_call(media=media)
    call.services.inflight.add(call.exchange)
    await finish(call, API)
    assert media.events == ["settle", "close"]
    assert call.exchange.done.is_set()
    assert call.exchange not in call.services.inflight
    assert len(receipts_of(call.services).written) == 1


async def test_finish_gives_everything_back_even_when_the_books_fail() -> None:
    media = FakeMedia()
    call = make_call(media=media)
    call.services.inflight.add(call.exchange)

    def broken(receipt: object) -> None:
        raise OSError("disk full")

    receipts_of(call.services).write = broken  # type: ignore[method-assign]
    with pytest.raises(OSError, match="disk full"):
        await finish(call, API)
    assert media.events == ["settle", "close"]
    assert call.exchange.done.is_set() and not call.services.inflight


# -- keep_response and usage_of ----------------------------------------------


class _ReportingDialect(OneCall):
    """A dialect whose report is given (the Responses dialect's id and final object)."""

    has_content = True
    terminal_frame = b"data: [DONE]\n\n"
    usage_source = "reported"

    def __init__(self, report: Report) -> None:
        self._report = report
        # No worker byte was read (stream_sha256 asks).
        self.source = type("NoBytes", (), {"bytes_received": 0})()

    def on_item(self, item: Any) -> bytes | None:
        return None

    def error_frame(self, exc: GatewayError) -> bytes:
        return b""

    def answer(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {}

    def report(self) -> Report:
        return self._report


FINAL = {
    "id": RESPONSE_ID,
    "status": "completed",
    "output": [{"type": "message", "role": "assistant", "content": []}],
}


def _keeping(report: Report, **body: Any) -> Call:
    call = make_call()
    call.plan = chat_plan(input="hello", **body)
    route_call(call)
    dialect = _ReportingDialect(report)
    relay = Relay(dialect, timeouts=Timeouts(1, 1, 1), response_headers=[])
    call.attempt = Attempt(dialect, relay, sent_body())
    return call


async def _keep(call: Call) -> None:
    assert call.plan is not None
    await keep_response(call, attempt_of(call).dialect, call.plan)


async def test_keep_response_keeps_the_items_and_the_final_object() -> None:
    call = _keeping(Report(response_id=RESPONSE_ID, upstream_id="resp_w", final=FINAL))
    assert call.plan is not None
    call.plan.previous_response_id = "resp_before"
    await _keep(call)
    (kept,) = responses_of(call.services).kept
    assert (kept.tenant, kept.id, kept.alias, kept.previous_id, kept.upstream_id) == (
        TENANT,
        RESPONSE_ID,
        ALIAS,
        "resp_before",
        "resp_w",
    )
    assert kept.body == orjson.dumps(FINAL)
    assert orjson.loads(kept.output_items) == FINAL["output"]
    (item,) = orjson.loads(kept.input_items)
    assert (item["role"], item["content"]) == ("user", [{"type": "input_text", "text": "hello"}])
    assert responses_of(call.services).bounds == [call.tenant.policy.responses.max_bytes]
    assert call.relayed_response == RESPONSE_ID


@pytest.mark.parametrize(
    ("report", "body"),
    [
        (Report(response_id=RESPONSE_ID, final=FINAL), {"store": False}),
        (Report(response_id=RESPONSE_ID, final=None), {}),
        (Report(final=FINAL), {}),
    ],
    ids=["store-false", "no-final", "no-id"],
)
async def test_keep_response_keeps_nothing_when_nothing_may_be_kept(
    report: Report, body: dict[str, Any]
) -> None:
    call = _keeping(report, **body)
    await _keep(call)
    assert responses_of(call.services).kept == []


async def test_keep_response_keeps_once() -> None:
    call = _keeping(Report(response_id=RESPONSE_ID, final=FINAL))
    await _keep(call)
    await _keep(call)
    assert len(responses_of(call.services).kept) == 1


async def test_a_refused_keep_is_state_unavailable_for_an_answer_already_made() -> None:
    call = _keeping(Report(response_id=RESPONSE_ID, final=FINAL))
    responses_of(call.services).fail = GatewayError("state_unavailable")
    with pytest.raises(GatewayError) as caught:
        await _keep(call)
    assert (caught.value.code, caught.value.outcome) == ("state_unavailable", "incomplete")


async def test_settle_keeps_nothing_of_a_stream_cut_short() -> None:
    call = _keeping(Report(response_id=RESPONSE_ID))
    attempt_of(call).relay.state.headers_sent = True
    call.fail(GatewayError("upstream_timeout"))
    settle(call, API)
    assert responses_of(call.services).kept == []


def test_usage_of_takes_the_workers_counts() -> None:
    reported = {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10, "extra": 1.5}
    call = _keeping(Report(usage=reported, counts=(4, 6, 10), output_estimate=99))
    assert call.plan is not None
    assert usage_of(attempt_of(call).dialect, call.plan) == Usage(4, 6, 10, "reported", reported)


def test_usage_of_estimates_without_counts() -> None:
    call = _keeping(Report(output_estimate=7), prompt_bytes=0)
    call.plan = chat_plan(prompt_bytes=9)
    # Prompt: 9 bytes / 4, rounded up; completion: the dialect's estimate.
    assert usage_of(attempt_of(call).dialect, call.plan) == Usage(3, 7, 10, "estimated")


async def test_a_collected_answer_settles_with_the_usage_it_was_sent_with() -> None:
    call = make_call(send=Caller().send)
    call.plan = chat_plan(stream=False)
    route_call(call)
    dialect = API.dialect(call.plan, StreamBounds(), collect=True)
    relay = Relay(dialect, timeouts=Timeouts(5, 5, 5), response_headers=[])
    call.attempt = Attempt(dialect, relay, sent_body())
    await relay.collect(FakeUpstream([VALID]).opener())
    call.usage = Usage(1, 2, 3, "estimated")  # what the reply carried
    await relay.reply(call.send, {}, {})
    settle(call, API)
    assert call.receipt.usage is call.usage
    assert call.receipt.outcome == "complete"
