"""What a caller gets validates against the official ``openai`` SDK's pydantic types,
strictly (``model_validate(obj, strict=True)``). No sockets.

Each case plans a request as the gateway does, plays what the worker answers
to the forwarded body (the protocol simulator's plans, called in-process, or
the byte captures in ``fixtures/sse``), runs that through the endpoint's
dialect and validates every frame and answer the caller would get: chat
chunks and answers, completions, every Responses event (function calls,
``response.incomplete`` and ``response.failed`` included) and the final
response object, embeddings, and the model entries of ``GET /v1/models``.

Two shapes cannot be strict, and :func:`test_shapes_that_cannot_be_strict`
pins exactly where they fail: a completion stream's chunks before the last
carry ``finish_reason: null``, as OpenAI's own API sends them, while the SDK
reuses ``Completion`` (``finish_reason`` a non-null literal) for chunks and
builds them unvalidated; and chat ``logprobs`` from the worker name each top
logprob by token id with its bytes as a string (reference §3.2), which no
gateway can turn into OpenAI's token text. An embeddings answer asked as
``base64`` is a string per vector, as OpenAI's is (the SDK decodes it).
"""

from __future__ import annotations

import asyncio
import types
import typing
from pathlib import Path
from typing import Any

import orjson
import pydantic
import pytest
from openai.types import Completion, CreateEmbeddingResponse, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from gateway.apis.base import Api, Dialect, Plan, PlanContext, StreamBounds
from gateway.apis.chat.api import ChatApi
from gateway.apis.chat.completions import CompletionsApi
from gateway.apis.chat.dialect import ChunkDialect
from gateway.apis.embeddings.api import EmbeddingsApi
from gateway.apis.responses.api import ResponsesApi
from gateway.apis.responses.events import ResponseEvent, ResponsesDialect
from gateway.apis.usage import public_usage, usage_of
from gateway.config import LimitsConfig
from gateway.config.policy import PolicyLimits, Tenant, TenantPolicy, resolve_limits
from gateway.core.errors import GatewayError
from gateway.core.sse import NEED_DATA, Done, KeepAlive
from gateway.http import routes
from gateway.observe.access import RequestInfo
from gateway.testing.simulator.handlers import Job, route
from gateway.testing.simulator.knobs import SimKnobs
from gateway.testing.simulator.plans import Head, Op
from gateway.testing.simulator.state import State
from gateway.upstream.readiness import classify
from tests.support.sse import named, response_bytes, response_object

ROUTE = "/srv/mosaic-models/" + "cd" * 32
ALIAS = "gemma-4-mm"
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sse"
EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
#: the Responses event names the simulator plays, every one of which a case below covers
SIMULATED_EVENTS = {
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.content_part.done",
    "response.output_item.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
}


def _tenant() -> Tenant:
    policy = TenantPolicy(
        tenant="acme",
        models={ALIAS: ROUTE},
        modalities=["text"],
        limits=PolicyLimits(max_output_tokens=512),
    )
    return Tenant("acme", policy, resolve_limits(policy.limits, LimitsConfig()))


TENANT = _tenant()


def _strict(model: type[pydantic.BaseModel], obj: Any) -> None:
    model.model_validate(obj, strict=True)


#: the union's members by event type, to say which one failed and why
_MEMBERS = {
    name: member
    for member in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
    for name in typing.get_args(member.model_fields["type"].annotation)
}


def _strict_event(data: Any) -> None:
    """``ResponseStreamEvent`` (a union) validates ``data`` strictly; on failure the
    error is the member's of that ``type`` (the union's lists every member)."""
    try:
        EVENT.validate_python(data, strict=True)
    except pydantic.ValidationError:
        _MEMBERS[data["type"]].model_validate(data, strict=True)
        raise


# -- one request, as the pipeline runs it ------------------------------------------


def worker_reply(api: Api, plan: Plan) -> bytes:
    """The simulator's answer to the body the gateway forwards (no socket)."""
    state = State([ROUTE], SimKnobs(), True, 7)
    body = orjson.dumps(api.forward(plan, ROUTE))
    headers = {"content-type": "application/json"}
    reply = route(state, "POST", api.endpoint.upstream_path, body, headers, "req_sdk_types")
    assert isinstance(reply, Job), "the simulator refused the forwarded body"
    out = bytearray()
    for step in reply.build(1):
        if isinstance(step, Head):
            assert step.status == 200
        elif isinstance(step, bytes):
            out += step
        elif step is Op.END:
            break
        elif isinstance(step, Op):
            raise AssertionError(f"unexpected plan step {step}")
    return bytes(out)


def drive(dialect: Dialect, raw: bytes) -> list[bytes]:
    """The relay's loop: every item through ``on_item``; the frames it returns."""
    frames = []
    source = dialect.source
    source.receive_data(raw)
    source.receive_data(b"")
    while not isinstance(event := source.next_event(), Done):
        assert event is not NEED_DATA, "no decision at EOF"
        if isinstance(event, KeepAlive):
            continue
        frame = dialect.on_item(event)
        if frame is not None:
            frames.append(frame)
    return frames


def sse(stream: bytes) -> list[tuple[str | None, Any]]:
    """A caller's SSE body as (event name, parsed data), ``[DONE]`` last."""
    out: list[tuple[str | None, Any]] = []
    for block in stream.split(b"\n\n"):
        if not block:
            continue
        name, data = None, []
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                data.append(line[6:])
        payload = b"\n".join(data)
        out.append((name, "[DONE]" if payload == b"[DONE]" else orjson.loads(payload)))
    assert out and out[-1] == (None, "[DONE]"), "a valid stream ends with data: [DONE]"
    return out[:-1]


def finish(dialect: Dialect, plan: Plan, frames: list[bytes]) -> Any:
    """What the caller is sent: the stream's events, or the JSON answer (parsed back)."""
    if plan.stream:
        return sse(b"".join(frames) + dialect.terminal_frame)
    report = dialect.report()
    usage = usage_of(report.counts, report.usage, plan.prompt_bytes, report.output_estimate)
    return orjson.loads(orjson.dumps(dialect.answer(public_usage(usage))))


def caller_gets(api: Api, body: dict[str, Any]) -> Any:
    plan = api.plan(body, PlanContext(TENANT, "0123456789abcdef"))
    dialect = api.dialect(plan, StreamBounds(), collect=not plan.stream)
    return finish(dialect, plan, drive(dialect, worker_reply(api, plan)))


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": ALIAS, "messages": [{"role": "user", "content": text}], **extra}


def create(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": ALIAS, "input": text, **extra}


# -- chat and completions ------------------------------------------------------------

CHAT_STREAMS = {
    "plain": chat("hi [[sim chunks=3]]", stream=True),
    "include_usage": chat(
        "hi [[sim chunks=2]]", stream=True, stream_options={"include_usage": True}
    ),
    "no_usage": chat("hi [[sim chunks=2]]", stream=True, stream_options={"include_usage": False}),
    "unicode": chat("hi [[sim chunks=5 unicode=1]]", stream=True),
    "length": chat("hi [[sim chunks=6]]", stream=True, max_tokens=3),
    "extras": chat("hi [[sim chunks=2 extras=1]]", stream=True),
    "tool_call": chat("hi [[sim tool_call=1]]", stream=True, tools=CHAT_TOOLS),
}
CHAT_ANSWERS = {
    "plain": chat("hi [[sim chunks=3]]"),
    "length": chat("hi [[sim chunks=6]]", max_tokens=3),
    "extras": chat("hi [[sim chunks=2 extras=1]]"),
    "tool_call": chat("hi [[sim tool_call=1]]", tools=CHAT_TOOLS),
    "empty": chat("hi [[sim chunks=0]]"),
}


@pytest.mark.parametrize("name", sorted(CHAT_STREAMS))
def test_chat_stream_chunks(name: str) -> None:
    events = caller_gets(ChatApi(), CHAT_STREAMS[name])
    assert events
    for event_name, chunk in events:
        assert event_name is None
        _strict(ChatCompletionChunk, chunk)
        assert chunk["model"] == ALIAS


@pytest.mark.parametrize("name", sorted(CHAT_ANSWERS))
def test_chat_answer(name: str) -> None:
    answer = caller_gets(ChatApi(), CHAT_ANSWERS[name])
    _strict(ChatCompletion, answer)
    if name == "tool_call":
        assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "lookup"


@pytest.mark.parametrize(
    "text", ["hi [[sim chunks=3]]", "hi [[sim chunks=6]]", "hi [[sim chunks=0]]"]
)
def test_completion_answer(text: str) -> None:
    body = {"model": ALIAS, "prompt": text, "max_tokens": 4}
    _strict(Completion, caller_gets(CompletionsApi(), body))


def test_completion_stream_final_chunk() -> None:
    events = caller_gets(CompletionsApi(), {"model": ALIAS, "prompt": "hi", "stream": True})
    _strict(Completion, events[-1][1])
    # The chunks before it: test_shapes_that_cannot_be_strict.


# -- Responses -----------------------------------------------------------------------

RESPONSE_STREAMS = {
    "plain": create("hi [[sim chunks=3]]", stream=True),
    "unicode": create("hi [[sim chunks=4 unicode=1]]", stream=True),
    "empty": create("hi [[sim chunks=0]]", stream=True),
    "length": create("hi [[sim chunks=6]]", stream=True, max_output_tokens=3),
    "function_call": create("hi [[sim tool_call=1]]", stream=True, tools=TOOLS),
    "function_call_only": create("hi [[sim chunks=0 tool_call=1]]", stream=True, tools=TOOLS),
    "incomplete": create("hi [[sim chunks=2 terminal=incomplete]]", stream=True),
    "failed": create("hi [[sim chunks=2 terminal=failed]]", stream=True),
    "echoed": create(
        "hi [[sim chunks=1]]",
        stream=True,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        instructions="Be brief.",
        temperature=0.5,
    ),
}
RESPONSE_ANSWERS = {
    "plain": create("hi [[sim chunks=3]]"),
    "function_call": create("hi [[sim tool_call=1]]", tools=TOOLS),
    "incomplete": create("hi [[sim chunks=2 terminal=incomplete]]"),
    "failed": create("hi [[sim chunks=2 terminal=failed]]"),
    "empty": create("hi [[sim chunks=0]]"),
    "store_false": create("hi [[sim chunks=2]]", store=False),
}


def _responses_stream(name: str) -> list[tuple[str | None, Any]]:
    events: list[tuple[str | None, Any]] = caller_gets(ResponsesApi(), RESPONSE_STREAMS[name])
    return events


@pytest.mark.parametrize("name", sorted(RESPONSE_STREAMS))
def test_responses_stream_events(name: str) -> None:
    events = _responses_stream(name)
    for event_name, data in events:
        assert data["type"] == event_name
        _strict_event(data)
        if "response" in data:
            _strict(Response, data["response"])
            assert data["response"]["model"] == ALIAS


def test_every_simulated_responses_event_is_covered() -> None:
    seen = {name for case in RESPONSE_STREAMS for name, _ in _responses_stream(case)}
    assert seen == SIMULATED_EVENTS


@pytest.mark.parametrize("name", ["plain", "function_call", "incomplete", "failed"])
def test_item_ids_name_the_announced_items(name: str) -> None:
    """``item_id`` is the id ``response.output_item.added`` gave that output index:
    a message's ``msg_…`` on its text and part events, a call's ``fc_…`` (not its
    ``call_id``) on its arguments events."""
    items: dict[int, str] = {}
    named_events = 0
    for event_name, data in _responses_stream(name):
        if event_name == "response.output_item.added":
            items[data["output_index"]] = data["item"]["id"]
        elif "output_index" in data and event_name != "response.output_item.done":
            assert data["item_id"] == items[data["output_index"]], event_name
            named_events += 1
        if event_name == "response.output_text.delta":
            assert data["logprobs"] == []
            assert data["item_id"].startswith("msg_")
        if event_name and event_name.startswith("response.function_call_arguments"):
            # the gateway's ids (spec §24): the worker's call id is call-<uuid>
            assert data["item_id"].startswith("fc_") and data["call_id"].startswith("call_")
    assert named_events


def test_what_the_worker_sent_is_kept_and_only_the_rest_filled() -> None:
    events = dict(_responses_stream("echoed"))
    created = events["response.created"]["response"]
    assert (created["tool_choice"], created["parallel_tool_calls"]) == ("required", False)
    assert created["tools"][0]["name"] == "lookup"
    plain = dict(_responses_stream("plain"))
    for name in ("response.created", "response.in_progress", "response.completed"):
        response = plain[name]["response"]
        assert (response["tools"], response["tool_choice"], response["parallel_tool_calls"]) == (
            [],
            "auto",
            True,
        )
    final = plain["response.completed"]["response"]
    assert final["usage"] == {
        "input_tokens": final["usage"]["input_tokens"],
        "output_tokens": 3,
        "total_tokens": final["usage"]["input_tokens"] + 3,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    assert final["output"][0]["content"][0]["annotations"] == []
    failed = dict(_responses_stream("failed"))["response.failed"]["response"]
    assert failed["error"] == {
        "type": "model_error",
        "message": "simulated model error",
        "code": "server_error",
    }


@pytest.mark.parametrize("name", sorted(RESPONSE_ANSWERS))
def test_responses_answer(name: str) -> None:
    answer = caller_gets(ResponsesApi(), RESPONSE_ANSWERS[name])
    _strict(Response, answer)
    assert answer["model"] == ALIAS
    if name == "function_call":
        kinds = [item["type"] for item in answer["output"]]
        assert kinds == ["function_call", "message"]


def test_the_kept_copy_for_get_is_the_filled_response() -> None:
    plan = ResponsesApi().plan(create("hi [[sim chunks=2]]", stream=True), PlanContext(TENANT, "n"))
    dialect = ResponsesDialect(plan, StreamBounds(), collect=False)
    drive(dialect, worker_reply(ResponsesApi(), plan))
    final = dialect.report().final
    assert final is not None
    _strict(Response, orjson.loads(orjson.dumps(final)))


def _reasoning_stream() -> bytes:
    """The worker's events for a reasoning model's answer (its ``responses.rs``: the
    reasoning events carry ``item_id``; the resource repeats the reasoning text as a
    string ``reasoning``)."""
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "content": []}
    done_reasoning = {
        **reasoning,
        "content": [{"type": "reasoning_text", "text": "hmm"}],
        "status": "completed",
    }
    message = {"type": "message", "id": "msg_2", "role": "assistant", "content": []}
    message["status"] = "in_progress"
    part = {"type": "output_text", "text": "ok"}
    done_message = {**message, "content": [part], "status": "completed"}
    final = response_object(
        "completed",
        output=[done_reasoning, done_message],
        output_text="ok",
        reasoning="hmm",
        usage={"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
        tools=TOOLS,
    )
    bodies: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": response_object("queued")}),
        ("response.in_progress", {"response": response_object(reasoning="h")}),
        (
            "response.output_item.added",
            {"output_index": 0, "item": {**reasoning, "status": "in_progress"}},
        ),
        (
            "response.reasoning_text.delta",
            {"item_id": "rs_1", "output_index": 0, "content_index": 0, "delta": "hmm"},
        ),
        (
            "response.reasoning_text.done",
            {"item_id": "rs_1", "output_index": 0, "content_index": 0, "text": "hmm"},
        ),
        ("response.output_item.done", {"output_index": 0, "item": done_reasoning}),
        ("response.output_item.added", {"output_index": 1, "item": message}),
        (
            "response.content_part.added",
            {"output_index": 1, "content_index": 0, "part": {**part, "text": ""}},
        ),
        (
            "response.output_text.delta",
            {"output_index": 1, "content_index": 0, "delta": "ok"},
        ),
        ("response.content_part.done", {"output_index": 1, "content_index": 0, "part": part}),
        ("response.output_item.done", {"output_index": 1, "item": done_message}),
        ("response.completed", {"response": final}),
    ]
    events = [
        (name, {"type": name, "sequence_number": n, **body})
        for n, (name, body) in enumerate(bodies)
    ]
    return response_bytes(events)


def test_reasoning_events_and_the_reasoning_string() -> None:
    plan = Plan("responses", ALIAS, {}, True, True, 64, 10, "n")
    dialect = ResponsesDialect(plan, StreamBounds(), collect=False)
    events = finish(dialect, plan, drive(dialect, _reasoning_stream()))
    for _, data in events:
        _strict_event(data)
    by_name = {name: data for name, data in events}
    final = by_name["response.completed"]["response"]
    # The gateway's ids (spec §24), the same in the events and in the final output.
    reasoning_id, message_id = (item["id"] for item in final["output"])
    assert by_name["response.output_text.delta"]["item_id"] == message_id != "msg_2"
    assert by_name["response.reasoning_text.delta"]["item_id"] == reasoning_id != "rs_1"
    assert message_id.startswith("msg_") and reasoning_id.startswith("rs_")
    assert "reasoning" not in final, "a string is not OpenAI's reasoning config"
    assert final["output"][0]["content"] == [{"type": "reasoning_text", "text": "hmm"}]
    collected = ResponsesDialect(
        Plan("responses", ALIAS, {}, False, True, 64, 10, "n"), StreamBounds(), collect=True
    )
    drive(collected, _reasoning_stream())
    _strict(Response, orjson.loads(orjson.dumps(collected.answer({}))))


def test_an_event_for_an_unannounced_item_gets_no_invented_id() -> None:
    """No ``output_item.added`` at that index: ``item_id`` stays absent rather than
    made up (the grammar does not require the announcement)."""
    stray = {"type": "response.output_text.delta", "sequence_number": 1}
    stray.update(output_index=5, content_index=0, delta="x")
    data = named(
        "response.created",
        {"type": "response.created", "sequence_number": 0, "response": response_object("queued")},
    )
    plan = Plan("responses", ALIAS, {}, True, True, 64, 10, "n")
    dialect = ResponsesDialect(plan, StreamBounds(), collect=False)
    dialect.source.receive_data(data + named("response.output_text.delta", stray))
    frames = []
    while (event := dialect.source.next_event()) is not NEED_DATA:
        assert isinstance(event, ResponseEvent)
        frame = dialect.on_item(event)
        assert frame is not None
        frames.append(frame)
    delta = orjson.loads(frames[-1].split(b"data: ", 1)[1])
    assert "item_id" not in delta and delta["logprobs"] == []


def test_the_gateways_own_error_event() -> None:
    plan = Plan("responses", ALIAS, {}, True, True, 64, 10, "n")
    dialect = ResponsesDialect(plan, StreamBounds(), collect=False)
    frame = dialect.error_frame(GatewayError("upstream_timeout"))
    (name, data), *_ = sse(frame + b"data: [DONE]\n\n")
    assert name == "error"
    _strict_event(data)


# -- captures of the worker's bytes --------------------------------------------------

#: capture -> whether its request asked for tools
CHAT_FIXTURES = {
    "chat_valid.sse": False,
    "chat_valid_crlf.sse": False,
    "chat_tool_calls.sse": True,
    "chat_extra_fields.sse": False,
    "chat_usage_only_chunk.sse": False,
    "chat_nul.sse": False,
}
RESPONSE_FIXTURES = [
    "valid.sse",
    "valid_crlf.sse",
    "valid_incomplete.sse",
    "valid_failed.sse",
    "nul_delta.sse",
]


def _chunk_dialect(name: str, stream: bool) -> tuple[ChunkDialect, Plan]:
    tools = CHAT_FIXTURES[name]
    plan = Plan("chat", ALIAS, {}, stream, True, 64, 10, "n", tools_requested=tools)
    return ChunkDialect("chat", plan, StreamBounds(), collect=not stream), plan


@pytest.mark.parametrize("name", sorted(CHAT_FIXTURES))
def test_chat_captures(name: str) -> None:
    data = (FIXTURES / name).read_bytes()
    dialect, plan = _chunk_dialect(name, True)
    for _, chunk in finish(dialect, plan, drive(dialect, data)):
        _strict(ChatCompletionChunk, chunk)
    if name == "chat_extra_fields.sse":
        return  # its logprobs: test_shapes_that_cannot_be_strict
    dialect, plan = _chunk_dialect(name, False)
    _strict(ChatCompletion, finish(dialect, plan, drive(dialect, data)))


@pytest.mark.parametrize("name", RESPONSE_FIXTURES)
def test_responses_captures(name: str) -> None:
    data = (FIXTURES / "responses" / name).read_bytes()
    for stream in (True, False):
        plan = Plan("responses", ALIAS, {}, stream, True, 64, 10, "n")
        dialect = ResponsesDialect(plan, StreamBounds(), collect=not stream)
        out = finish(dialect, plan, drive(dialect, data))
        if stream:
            for _, event in out:
                _strict_event(event)
        else:
            _strict(Response, out)


# -- embeddings and models -----------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"input": "one"},
        {"input": ["one", "two [[sim dims=3]]"]},
        {"input": [[1, 2, 3]], "encoding_format": "float"},
    ],
    ids=["string", "list", "tokens"],
)
def test_embeddings_answer(body: dict[str, Any]) -> None:
    answer = caller_gets(EmbeddingsApi(), {"model": ALIAS, **body})
    _strict(CreateEmbeddingResponse, answer)
    assert answer["model"] == ALIAS


def test_models_entries() -> None:
    """``GET /v1/models`` and ``/v1/models/{alias}`` through the handler, with the
    worker's ``created`` and status read from the simulator's listing."""
    listing = State([ROUTE], SimKnobs(), True, 7).routes.models_list(1_755_870_000)
    status, _, created = classify(listing, ROUTE)
    state = types.SimpleNamespace(status=status, created=created)
    runtime = types.SimpleNamespace(
        readiness=types.SimpleNamespace(state=lambda _route: state), started_unix=1
    )

    async def tenant_for(scope: Any, rt: Any, endpoint: str) -> Tenant:
        return TENANT

    def call(alias: str | None) -> Any:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async def receive() -> dict[str, Any]:
            raise AssertionError("the models handler reads no body")

        scope: dict[str, Any] = {
            "app": types.SimpleNamespace(state=types.SimpleNamespace(runtime=runtime)),
            "state": {"gateway": RequestInfo("req_models", 0.0)},
            "path_params": {} if alias is None else {"alias": alias},
        }
        asyncio.run(routes.models(scope, receive, send))
        assert sent[0]["status"] == 200
        return orjson.loads(sent[1]["body"])

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(routes, "tenant_for", tenant_for)
        listed = call(None)
        one = call(ALIAS)
    assert listed["object"] == "list" and [m["id"] for m in listed["data"]] == [ALIAS]
    for entry in [*listed["data"], one]:
        _strict(Model, entry)
        assert entry["created"] == 1_755_870_000


# -- what cannot be strict -----------------------------------------------------------


def _errors(model: type[pydantic.BaseModel], obj: Any) -> list[tuple[tuple[Any, ...], Any]]:
    try:
        model.model_validate(obj, strict=True)
    except pydantic.ValidationError as exc:
        return [(tuple(e["loc"]), e["input"]) for e in exc.errors()]
    return []


def test_shapes_that_cannot_be_strict() -> None:
    events = caller_gets(
        CompletionsApi(), {"model": ALIAS, "prompt": "x [[sim chunks=3]]", "stream": True}
    )
    *middle, last = [chunk for _, chunk in events]
    assert middle and not _errors(Completion, last)
    for chunk in middle:
        assert _errors(Completion, chunk) == [(("choices", 0, "finish_reason"), None)]
        # with the one field OpenAI's API also sends as null taken out of the check:
        relaxed = {**chunk, "choices": [{**chunk["choices"][0], "finish_reason": "stop"}]}
        assert not _errors(Completion, relaxed)

    data = (FIXTURES / "chat_extra_fields.sse").read_bytes()
    plan = Plan("chat", ALIAS, {"logprobs": True}, False, True, 64, 10, "n")
    dialect = ChunkDialect("chat", plan, StreamBounds(), collect=True)
    answer = finish(dialect, plan, drive(dialect, data))
    failing = {loc[-1] for loc, _ in _errors(ChatCompletion, answer)}
    locations = {loc[:6] for loc, _ in _errors(ChatCompletion, answer)}
    assert failing == {"token", "bytes"}
    assert locations <= {("choices", 0, "logprobs", "content", i, "top_logprobs") for i in (0, 1)}

    encoded = caller_gets(
        EmbeddingsApi(), {"model": ALIAS, "input": "x", "encoding_format": "base64"}
    )
    assert {loc[:3] for loc, _ in _errors(CreateEmbeddingResponse, encoded)} == {
        ("data", 0, "embedding")
    }
