"""Ids inside an answer are the gateway's (spec §21, §24; ``gateway/apis/ids.py``):
tool calls, Responses output items and their call ids, Anthropic tool uses --
random, one replacement per worker id within an answer, streamed or not."""

from __future__ import annotations

import re
from typing import Any

import orjson

from gateway.apis.base import Plan, StreamBounds
from gateway.apis.chat.dialect import ChunkDialect
from gateway.apis.ids import InnerIds, gateway_id
from gateway.apis.messages.events import MessagesDialect
from gateway.apis.responses.events import ResponsesDialect
from gateway.apis.usage import public_usage, usage_of
from gateway.core.sse import NEED_DATA, Done, KeepAlive
from tests.support.sse import chunk, event, response_bytes, response_object, usage

ALIAS = "alias-x"
#: the worker's ids: a counter, as some builds make them
WORKER_IDS = ("call-1", "call-2", "fc_1", "msg_0", "rs_0")
HEX24 = "[0-9a-f]{24}"


def _plan(endpoint: str, *, stream: bool, tools: bool = True) -> Plan:
    return Plan(endpoint, ALIAS, {}, stream, True, 64, 10, "n", tools_requested=tools)


def _drive(dialect: Any, raw: bytes) -> list[bytes]:
    frames = []
    source = dialect.source
    source.receive_data(raw)
    source.receive_data(b"")
    while not isinstance(item := source.next_event(), Done):
        assert item is not NEED_DATA
        if isinstance(item, KeepAlive):
            continue
        frame = dialect.on_item(item)
        if frame is not None:
            frames.append(frame)
    return frames


def _answer(dialect: Any, plan: Plan) -> Any:
    report = dialect.report()
    counts = usage_of(report.counts, report.usage, plan.prompt_bytes, report.output_estimate)
    return orjson.loads(orjson.dumps(dialect.answer(public_usage(counts))))


def _no_worker_id(data: bytes | Any) -> None:
    text = data if isinstance(data, bytes) else orjson.dumps(data)
    for worker in WORKER_IDS:
        assert f'"{worker}"'.encode() not in text, worker


# -- the table -----------------------------------------------------------------------


def test_one_replacement_per_worker_id_random_and_prefixed() -> None:
    ids = InnerIds()
    first = ids.swap("call-1", "call_")
    assert re.fullmatch("call_" + HEX24, first)
    assert ids.swap("call-1", "call_") == first  # the same id: the same replacement
    assert ids.swap("call-2", "call_") != first
    assert re.fullmatch("fc_" + HEX24, ids.swap("fc_7"))  # the worker's prefix kept
    assert re.fullmatch("item_" + HEX24, ids.swap("0"))  # a bare counter
    assert ids.swap(7) == 7 and ids.swap(None) is None  # not an id: untouched
    assert InnerIds().swap("call-1", "call_") != first  # another answer, another id
    assert gateway_id("x_") != gateway_id("x_")


# -- chat tool calls -----------------------------------------------------------------


def _calls(*calls: dict[str, Any], finish: str | None = None, **top: Any) -> dict[str, Any]:
    c = chunk(None, finish, **top)
    c["choices"][0]["delta"]["tool_calls"] = list(calls)
    return c


def _call(index: int, call_id: str | None, arguments: str, name: str | None = "f") -> Any:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    call: dict[str, Any] = {"index": index, "type": "function", "function": function}
    if call_id is not None:
        call["id"] = call_id
    return call


TOOL_STREAM = (
    b"".join(
        event(c)
        for c in (
            _calls(_call(0, "call-1", '{"a":')),
            _calls(_call(0, "call-1", "1}", name=None)),  # the id repeated
            _calls(_call(1, "call-2", "{}", name="g")),
            chunk("", "tool_calls", usage()),
        )
    )
    + b"data: [DONE]\n\n"
)


def test_chat_tool_call_ids_are_replaced_in_the_stream_consistently() -> None:
    dialect = ChunkDialect(
        "chat", _plan("chat.completions", stream=True), StreamBounds(), collect=False
    )
    frames = _drive(dialect, TOOL_STREAM)
    _no_worker_id(b"".join(frames))
    chunks = [orjson.loads(f[6:]) for f in frames]
    ids = [
        call["id"]
        for c in chunks
        for call in c["choices"][0]["delta"].get("tool_calls") or []
        if "id" in call
    ]
    assert len(ids) == 3 and ids[0] == ids[1] != ids[2]
    assert all(re.fullmatch("call_" + HEX24, i) for i in ids)


def test_chat_tool_call_ids_are_replaced_in_the_answer() -> None:
    plan = _plan("chat.completions", stream=False)
    dialect = ChunkDialect("chat", plan, StreamBounds(), collect=True)
    assert _drive(dialect, TOOL_STREAM) == []
    answer = _answer(dialect, plan)
    _no_worker_id(answer)
    calls = answer["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["f", "g"]
    assert len({c["id"] for c in calls}) == 2
    assert all(re.fullmatch("call_" + HEX24, c["id"]) for c in calls)


def test_a_plain_chat_has_nothing_to_replace() -> None:
    stream = event(chunk("hi")) + event(chunk("", "stop", usage())) + b"data: [DONE]\n\n"
    dialect = ChunkDialect(
        "chat", _plan("chat.completions", stream=True, tools=False), StreamBounds(), collect=False
    )
    _drive(dialect, stream)
    assert dialect.inner is None  # nothing made on a plain chat's path


# -- Anthropic tool uses -------------------------------------------------------------


def test_anthropic_tool_use_ids_are_toolu_and_the_gateways() -> None:
    dialect = MessagesDialect(_plan("messages", stream=True), StreamBounds(), collect=False)
    frames = b"".join(_drive(dialect, TOOL_STREAM)) + dialect.terminal_frame
    _no_worker_id(frames)
    starts = re.findall(rb'"content_block":\{"type":"tool_use","id":"([^"]+)"', frames)
    assert len(starts) == 2 and len(set(starts)) == 2
    assert all(re.fullmatch(("toolu_" + HEX24).encode(), s) for s in starts)
    plan = _plan("messages", stream=False)
    collected = MessagesDialect(plan, StreamBounds(), collect=True)
    _drive(collected, TOOL_STREAM)
    answer = _answer(collected, plan)
    _no_worker_id(answer)
    uses = [b["id"] for b in answer["content"] if b["type"] == "tool_use"]
    assert len(set(uses)) == 2 and all(re.fullmatch("toolu_" + HEX24, u) for u in uses)


# -- Responses output items ----------------------------------------------------------


def _responses_call_stream() -> bytes:
    """A reasoning item, a message, and a function call with its arguments events
    naming the worker's call id only, as the worker sends them."""
    reasoning = {"type": "reasoning", "id": "rs_0", "summary": [], "content": []}
    message = {"type": "message", "id": "msg_0", "role": "assistant", "content": []}
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call-1",
        "name": "f",
        "arguments": "{}",
        "status": "completed",
    }
    done_message = {
        **message,
        "status": "completed",
        "content": [{"type": "output_text", "text": "ok"}],
    }
    final = response_object(
        "completed",
        completed_at=1755870001,
        output=[reasoning, call, done_message],
        usage={"input_tokens": 9, "output_tokens": 2, "total_tokens": 11},
    )
    bodies: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": response_object("queued")}),
        ("response.output_item.added", {"output_index": 0, "item": reasoning}),
        ("response.output_item.done", {"output_index": 0, "item": reasoning}),
        ("response.output_item.added", {"output_index": 1, "item": call}),
        (
            "response.function_call_arguments.delta",
            {"output_index": 1, "call_id": "call-1", "delta": "{}"},
        ),
        (
            "response.function_call_arguments.done",
            {"output_index": 1, "call_id": "call-1", "arguments": "{}"},
        ),
        ("response.output_item.done", {"output_index": 1, "item": call}),
        ("response.output_item.added", {"output_index": 2, "item": message}),
        (
            "response.output_text.delta",
            {"output_index": 2, "item_id": "msg_0", "content_index": 0, "delta": "ok"},
        ),
        ("response.output_item.done", {"output_index": 2, "item": done_message}),
        ("response.completed", {"response": final}),
    ]
    return response_bytes(
        [(n, {"type": n, "sequence_number": i, **b}) for i, (n, b) in enumerate(bodies)]
    )


def test_responses_item_and_call_ids_are_the_same_replacement_everywhere() -> None:
    plan = _plan("responses", stream=True)
    dialect = ResponsesDialect(plan, StreamBounds(), collect=False)
    frames = b"".join(_drive(dialect, _responses_call_stream()))
    _no_worker_id(frames)
    events = [
        orjson.loads(block.split(b"\ndata: ", 1)[1]) for block in frames.split(b"\n\n") if block
    ]
    added = {e["output_index"]: e["item"] for e in events if e["type"].endswith("item.added")}
    done = {e["output_index"]: e["item"] for e in events if e["type"].endswith("item.done")}
    final = next(e for e in events if e["type"] == "response.completed")["response"]["output"]
    reasoning_id, call_id, message_id = (added[i]["id"] for i in range(3))
    assert re.fullmatch("rs_" + HEX24, reasoning_id)
    assert re.fullmatch("fc_" + HEX24, call_id)
    assert re.fullmatch("msg_" + HEX24, message_id)
    assert [done[i]["id"] for i in range(3)] == [reasoning_id, call_id, message_id]
    assert [item["id"] for item in final] == [reasoning_id, call_id, message_id]
    gateway_call = added[1]["call_id"]
    assert re.fullmatch("call_" + HEX24, gateway_call)
    assert done[1]["call_id"] == final[1]["call_id"] == gateway_call
    arguments = [e for e in events if e["type"].startswith("response.function_call_arguments")]
    assert all(e["call_id"] == gateway_call and e["item_id"] == call_id for e in arguments)
    delta = next(e for e in events if e["type"] == "response.output_text.delta")
    assert delta["item_id"] == message_id
    # The copy kept for GET and follow-ups is what the caller saw.
    kept = dialect.report().final
    assert kept is not None and [item["id"] for item in kept["output"]] == [
        reasoning_id,
        call_id,
        message_id,
    ]


def test_responses_answer_ids_are_replaced_and_differ_per_answer() -> None:
    answers = []
    for _ in range(2):
        plan = _plan("responses", stream=False)
        dialect = ResponsesDialect(plan, StreamBounds(), collect=True)
        assert _drive(dialect, _responses_call_stream()) == []
        answer = _answer(dialect, plan)
        _no_worker_id(answer)
        answers.append(answer)
    first, second = ([item["id"] for item in a["output"]] for a in answers)
    assert not set(first) & set(second)  # random: another answer, other ids
    assert answers[0]["output"][1]["call_id"] != answers[1]["output"][1]["call_id"]
