"""The request's steps after planning (``steps.resolve`` and ``steps.run``) with
a real route table, admission pools and in-memory limits; the worker is a fake
client that reads the forwarded body and answers with a fake stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest

from gateway.admission import AdmissionGroup
from gateway.apis.base import MediaRef, Plan, PlanContext
from gateway.apis.chat.api import ChatApi
from gateway.apis.responses.api import ResponsesApi
from gateway.apis.responses.conversation import MAX_LINKS
from gateway.books.protocols import KeptResponse
from gateway.config import GatewayConfig
from gateway.core.body import placeholder
from gateway.core.errors import GatewayError
from gateway.pipeline import steps
from gateway.pipeline.call import Call
from gateway.pipeline.services import Services
from gateway.pipeline.settle import settle
from gateway.ratelimit.memory import MemoryLimitsStore
from gateway.upstream.base import Accept, Rejection, WorkerStream
from gateway.upstream.table import RouteTable, capacities
from tests.pipeline.support import (
    ALIAS,
    NONCE,
    ROUTE,
    Caller,
    FakeMedia,
    FakeTransport,
    FakeUpstream,
    attempt_of,
    chat_plan,
    make_call,
    make_services,
    make_tenant,
    read_body,
    record,
    responses_of,
    routed_of,
    run_steps,
    sse_fixture,
)

API = ChatApi()
RESPONSES = ResponsesApi()
VALID = sse_fixture("chat_valid.sse")
RESPONSES_VALID = sse_fixture("responses/valid.sse")
PREFIX = "file:///srv/evidence"


class _Readiness:
    def __init__(self, ready: bool = True) -> None:
        self.is_ready = ready
        self.asked: list[str] = []

    def ready(self, route: str) -> bool:
        self.asked.append(route)
        return self.is_ready


class _Worker(FakeTransport):
    """The worker's transport: reads the body it is sent, answers with ``upstream``."""

    def __init__(self, upstream: FakeUpstream) -> None:
        self.upstream = upstream
        self.calls: list[dict[str, Any]] = []
        self.body = b""

    async def open_stream(
        self,
        path: str,
        body: bytes | AsyncIterator[bytes],
        request_id: str,
        *,
        size: int | None = None,
        accept: Accept = "sse",
        traceparent: bytes | None = None,
        rejection: Rejection = "classified",
    ) -> WorkerStream:
        self.body = await read_body(body)
        self.calls.append({"path": path, "request_id": request_id, "size": size, "accept": accept})
        return self.upstream


def _config(**upstream: Any) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "upstream": {"base_url": "http://127.0.0.1:1234", "route": ROUTE, **upstream},
            "staging": {"worker_media": "file_url", "worker_url_prefix": PREFIX},
        }
    )


class _Rig:
    def __init__(self, table: RouteTable, services: Services, readiness: _Readiness) -> None:
        self.table, self.services, self.readiness = table, services, readiness
        self.responses = responses_of(services)
        self.worker = table.workers["default"]

    def call(self, plan: Plan, media: FakeMedia | None = None) -> tuple[Call, Caller]:
        caller = Caller()
        call = make_call(self.services, media=media, send=caller.send)
        call.plan = plan
        return call, caller

    def answer(self, raw: bytes) -> _Worker:
        fake = _Worker(FakeUpstream([raw]))
        self.worker.client = fake
        return fake


@asynccontextmanager
async def _rig(config: GatewayConfig) -> AsyncIterator[_Rig]:
    admissions = AdmissionGroup(capacities(config), config.admission.max_queue)
    table = RouteTable.build(config, admissions)
    client = table.workers["default"].client
    readiness = _Readiness()
    services = make_services(
        table=table, readiness=readiness, config=config, limits=MemoryLimitsStore()
    )
    try:
        yield _Rig(table, services, readiness)
    finally:
        await client.aclose()


@pytest.fixture
async def rig() -> AsyncIterator[_Rig]:
    async with _rig(_config()) as built:
        yield built


_run = run_steps
CHAT = ChatApi.endpoint


# -- resolve -----------------------------------------------------------------------


async def test_resolve_fills_the_receipt_and_holds_the_worker(rig: _Rig) -> None:
    plan = chat_plan(max_tokens=33)
    plan.dropped_parts = [2]
    call, _ = rig.call(plan)
    routed = steps.resolve(call, plan, CHAT)
    assert call.routed is routed and routed.worker is rig.worker
    receipt = call.receipt
    assert (receipt.model_alias, receipt.route, receipt.upstream) == (ALIAS, ROUTE, "default")
    assert receipt.serve_identity is None
    assert (receipt.max_tokens, receipt.stream, receipt.dropped_parts) == (33, True, [2])
    assert rig.readiness.asked == [ROUTE]


async def test_resolve_copies_the_dropped_parts(rig: _Rig) -> None:
    plan = chat_plan()
    plan.dropped_parts = [1]
    call, _ = rig.call(plan)
    steps.resolve(call, plan, CHAT)
    plan.dropped_parts.append(5)
    assert call.receipt.dropped_parts == [1]


async def test_a_route_not_ready_is_refused_after_the_receipt_is_filled(rig: _Rig) -> None:
    rig.readiness.is_ready = False
    call, _ = rig.call(chat_plan(stream=False))
    assert call.plan is not None
    with pytest.raises(GatewayError) as caught:
        steps.resolve(call, call.plan, CHAT)
    assert (caught.value.code, caught.value.status) == ("upstream_not_ready", 503)
    # The receipt still says where the request would have gone.
    assert (call.receipt.route, call.receipt.upstream, call.receipt.stream) == (
        ROUTE,
        "default",
        False,
    )
    assert routed_of(call).resolved.ready is False


# -- run: from the records to the worker's answer -------------------------------


async def test_a_streamed_request_reaches_the_worker_and_the_caller(rig: _Rig) -> None:
    worker = rig.answer(VALID)
    call, caller = rig.call(chat_plan(max_tokens=40, stop=["\n"]))
    await _run(call)
    (sent,) = worker.calls
    assert sent == {
        "path": "/v1/chat/completions",
        "request_id": "req-1",
        "size": len(worker.body),
        "accept": "sse",
    }
    forwarded = orjson.loads(worker.body)
    assert forwarded["model"] == ROUTE and forwarded["stream"] is True
    assert forwarded["stream_options"] == {"include_usage": True}
    assert forwarded["max_tokens"] == 40 and forwarded["stop"] == ["\n"]
    start = caller.starts[0]
    headers = dict(start["headers"])
    assert headers[b"content-type"].startswith(b"text/event-stream")
    assert headers[b"x-usage-source"] == b"reported"
    assert caller.bodies[-1] == b"data: [DONE]\n\n"
    assert call.relay is not None and call.relay.state.completed
    assert attempt_of(call).producer.complete


async def test_run_holds_a_permit_and_a_reservation_until_settled(rig: _Rig) -> None:
    rig.answer(VALID)
    call, _ = rig.call(chat_plan())
    await _run(call)
    admission = rig.worker.admission
    permit, reservation = routed_of(call).permit, routed_of(call).reservation
    assert permit is not None and reservation is not None
    assert call.receipt.queue_ms is not None and call.receipt.queue_ms >= 0
    assert admission.in_use == permit.weight >= 1
    assert not reservation.settled
    settle(call, API)
    assert permit.released and admission.in_use == 0
    assert reservation.settled
    assert call.receipt.outcome == "complete"


async def test_a_non_streaming_request_gets_one_answer(rig: _Rig) -> None:
    rig.answer(VALID)
    call, caller = rig.call(chat_plan(stream=False))
    await _run(call)
    assert call.usage is not None and call.usage.source == "reported"
    start, body = caller.messages
    assert dict(start["headers"])[b"x-usage-source"] == b"reported"
    answer = orjson.loads(body["body"])
    assert answer["model"] == ALIAS and answer["usage"]["total_tokens"] == 21
    assert call.relay is not None and call.relay.state.completed


async def test_a_body_over_the_workers_limit_is_refused_before_any_hold() -> None:
    async with _rig(_config(max_request_bytes=64)) as rig:
        worker = rig.answer(VALID)
        call, caller = rig.call(chat_plan(messages=[{"role": "user", "content": "x" * 100}]))
        with pytest.raises(GatewayError, match="media_limit_exceeded"):
            await _run(call)
        assert routed_of(call).reservation is None and routed_of(call).permit is None
        assert worker.calls == [] and caller.messages == []


async def test_a_previous_response_of_another_tenant_is_not_found(rig: _Rig) -> None:
    worker = rig.answer(VALID)
    plan = chat_plan()
    plan.previous_response_id = "resp_theirs"
    call, _ = rig.call(plan)
    with pytest.raises(GatewayError) as caught:
        await _run(call)
    assert (caught.value.code, caught.value.param) == (
        "response_not_found",
        "previous_response_id",
    )
    assert worker.calls == [] and routed_of(call).reservation is None


def _responses_plan(**body: Any) -> Plan:
    return RESPONSES.plan(
        {"model": ALIAS, "input": "hi", "stream": True, **body}, PlanContext(make_tenant(), NONCE)
    )


@pytest.mark.parametrize(
    "plan",
    [
        pytest.param(lambda: _responses_plan(), id="streamed-kept-response"),
        pytest.param(lambda: _responses_plan(stream=False), id="kept-response"),
        pytest.param(lambda: _responses_plan(store=True), id="store-true"),
        pytest.param(lambda: _follow_up("resp_two"), id="follow-up"),
    ],
)
async def test_while_the_store_is_known_down_what_needs_it_never_reaches_the_worker(
    rig: _Rig, plan: Any
) -> None:
    """Spec §24: a kept Response (streamed or not) and a follow-up are refused
    503 ``state_unavailable`` before the worker is called, with nothing sent to
    the caller (once, a stream ran on the worker and then ended in an error
    event after ``response.completed``)."""
    rig.services.state.degraded = True
    worker = rig.answer(RESPONSES_VALID)
    call, caller = rig.call(plan())
    with pytest.raises(GatewayError) as caught:
        await _run_responses(call)
    assert (caught.value.code, caught.value.status) == ("state_unavailable", 503)
    assert worker.calls == [] and caller.messages == []
    assert routed_of(call).reservation is None and routed_of(call).permit is None
    assert rig.responses.kept == []


async def test_while_the_store_is_known_down_what_needs_none_is_served(rig: _Rig) -> None:
    rig.services.state.degraded = True
    worker = rig.answer(RESPONSES_VALID)
    call, caller = rig.call(_responses_plan(store=False))
    await _run_responses(call)
    assert len(worker.calls) == 1 and caller.starts[0]["status"] == 200
    rig.answer(VALID)
    chat, chatter = rig.call(chat_plan())
    await _run(chat)
    assert chatter.bodies[-1] == b"data: [DONE]\n\n"


def _link(rid: str, text: str, previous: str | None = None) -> KeptResponse:
    user = {
        "id": "msg_u",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [{"type": "input_text", "text": text}],
    }
    answer = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "re: " + text}],
    }
    return KeptResponse(
        "acme", rid, ALIAS, 0.0, 60, previous, orjson.dumps([user]), orjson.dumps([answer]), None
    )


def _follow_up(previous: str) -> Plan:
    body = {"model": ALIAS, "input": "three", "previous_response_id": previous}
    return RESPONSES.plan(body, PlanContext(make_tenant(), NONCE))


async def _run_responses(call: Call) -> None:
    assert call.plan is not None
    routed = steps.resolve(call, call.plan, RESPONSES.endpoint)
    async with asyncio.timeout(5):
        await steps.run(call, routed, RESPONSES, call.plan)


async def test_a_previous_response_is_forwarded_as_its_whole_conversation(rig: _Rig) -> None:
    rig.responses.chains[("acme", "resp_two")] = [
        _link("resp_one", "one"),
        _link("resp_two", "two", previous="resp_one"),
    ]
    worker = rig.answer(RESPONSES_VALID)
    plan = _follow_up("resp_two")
    alone = plan.prompt_bytes
    call, _ = rig.call(plan)
    await _run_responses(call)
    sent = orjson.loads(worker.body)
    assert "previous_response_id" not in sent and sent["store"] is False
    texts = [item["content"] if item.get("type") is None else item for item in sent["input"]]
    assert [t["content"][0]["text"] for t in texts[:4]] == ["one", "re: one", "two", "re: two"]
    assert sent["input"][-1] == {"type": "message", "role": "user", "content": "three"}
    assert plan.prompt_bytes == alone + len("onere: onetwore: two")
    assert plan.turns == 5


@pytest.mark.parametrize(
    ("chain", "code", "message"),
    [
        ([], "response_not_found", "No such response."),
        (
            [_link("resp_two", "two", previous="resp_gone")],
            "response_not_found",
            "An earlier response of this conversation is no longer kept.",
        ),
    ],
    ids=["unknown", "broken"],
)
async def test_a_conversation_not_kept_whole_is_not_forwarded(
    rig: _Rig, chain: list[KeptResponse], code: str, message: str
) -> None:
    rig.responses.chains[("acme", "resp_two")] = chain
    worker = rig.answer(RESPONSES_VALID)
    call, _ = rig.call(_follow_up("resp_two"))
    with pytest.raises(GatewayError) as caught:
        await _run_responses(call)
    assert (caught.value.code, caught.value.param, caught.value.message) == (
        code,
        "previous_response_id",
        message,
    )
    assert worker.calls == [] and routed_of(call).reservation is None


async def test_a_conversation_longer_than_its_bound_is_too_large(rig: _Rig) -> None:
    links = [_link(f"resp_{i}", "x", previous=f"resp_{i - 1}") for i in range(MAX_LINKS + 1)]
    rig.responses.chains[("acme", "resp_last")] = links
    worker = rig.answer(RESPONSES_VALID)
    call, _ = rig.call(_follow_up("resp_last"))
    with pytest.raises(GatewayError) as caught:
        await _run_responses(call)
    assert (caught.value.code, caught.value.param) == ("prompt_too_large", "previous_response_id")
    assert worker.calls == [] and routed_of(call).reservation is None


async def test_evidence_is_leased_before_and_inline_data_staged_after_the_permit(
    rig: _Rig,
) -> None:
    png, staged = record("ev_png"), record("ev_inline", size=3)
    media = FakeMedia([png], staged={1: staged})
    plan = chat_plan()
    plan.media = [
        MediaRef(0, 0, "image", "evidence", "ev_png"),
        MediaRef(1, 1, "image", "data", data_url="data:image/png;base64,YWJj", inline_bytes=3),
    ]
    plan.body["messages"][0]["content"] = [
        {"type": "image_url", "image_url": {"url": placeholder(NONCE, 0)}},
        {"type": "image_url", "image_url": {"url": placeholder(NONCE, 1)}},
    ]
    worker = rig.answer(VALID)
    call, _ = rig.call(plan, media)
    await _run(call)
    assert media.events == [
        ("lease", ["ev_png"]),
        ("stage", [(1, "image/png", "YWJj", "image")]),
    ]
    parts = orjson.loads(worker.body)["messages"][0]["content"]
    assert [p["image_url"]["url"] for p in parts] == [
        f"{PREFIX}/{png.sha256}.png",
        f"{PREFIX}/{staged.sha256}.png",
    ]
    assert routed_of(call).records == {0: png, 1: staged}


async def test_a_worker_failure_after_headers_leaves_the_hold_for_settle(rig: _Rig) -> None:
    rig.answer(sse_fixture("bad_missing_done.sse"))
    call, caller = rig.call(chat_plan())
    with pytest.raises(GatewayError, match="upstream_unavailable"):
        await _run(call)
    assert routed_of(call).permit is not None and call.relay is not None
    assert b"data: [DONE]" not in caller.body
