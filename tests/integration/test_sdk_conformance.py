"""What the official ``openai`` SDK receives from the real gateway in front of the
protocol simulator validates against the SDK's own types, strictly
(``model_validate(..., strict=True)``): chat, completions, Responses (every
event, function calls, ``GET``), embeddings, models; plus Responses
``include`` and ``responses.cancel`` over HTTP.

The SDK parses its answers without validating them, so each call is made
through the SDK's raw-response API (same request, same client) and the body
it received is validated here; the typed objects the SDK builds are checked
too. Where a shape cannot be strict (a completion stream's ``finish_reason:
null`` before the last chunk, as OpenAI sends it): tests/apis/test_sdk_types.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pydantic
import pytest
from openai.types import Completion, CreateEmbeddingResponse, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import (
    Response,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
)

from gateway.testing.harness import DEMO_SECRET_ENV
from tests.support.jwt import HS_SECRET
from tests.support.stack import Stack, running_stack, worker_posts

ENDPOINTS = ["chat.completions", "completions", "responses", "embeddings", "models", "evidence"]
ALIAS = "gemma-4-mm"
EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
TOOLS: Any = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
CHAT_TOOLS: Any = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    mp = pytest.MonkeyPatch()
    mp.setenv(DEMO_SECRET_ENV, HS_SECRET)
    policy = {"endpoints": ENDPOINTS}
    try:
        with running_stack(tmp_path_factory.mktemp("sdk"), acme=policy) as running:
            yield running
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return stack.sdk()


def strict(model: type[pydantic.BaseModel], obj: Any) -> Any:
    return model.model_validate(obj, strict=True)


def events(streamed: Any) -> list[tuple[str | None, Any]]:
    """The SSE events of a ``with_streaming_response`` body: (event name, data), up to
    ``[DONE]``, which must be the last."""
    out: list[tuple[str | None, Any]] = []
    name: str | None = None
    data: list[str] = []
    for line in streamed.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
        elif not line and data:
            out.append((name, "\n".join(data)))
            name, data = None, []
    if data:
        out.append((name, "\n".join(data)))
    assert out and out[-1] == (None, "[DONE]"), out[-1:]
    return [(n, json.loads(d)) for n, d in out[:-1]]


# -- chat and completions ------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [{}, {"tools": CHAT_TOOLS, "messages": [{"role": "user", "content": "[[sim tool_call=1]]"}]}],
    ids=["text", "tool_call"],
)
def test_chat(client: openai.OpenAI, extra: dict[str, Any]) -> None:
    request: dict[str, Any] = {
        "model": ALIAS,
        "messages": [{"role": "user", "content": "hi [[sim chunks=3]]"}],
        **extra,
    }
    raw = client.chat.completions.with_raw_response.create(**request)
    strict(ChatCompletion, raw.http_response.json())
    with client.chat.completions.with_streaming_response.create(
        **request, stream=True, stream_options={"include_usage": True}
    ) as streamed:
        chunks = events(streamed)
    assert chunks
    for name, chunk in chunks:
        assert name is None
        strict(ChatCompletionChunk, chunk)


def test_completions(client: openai.OpenAI) -> None:
    raw = client.completions.with_raw_response.create(model=ALIAS, prompt="hi", max_tokens=4)
    strict(Completion, raw.http_response.json())
    with client.completions.with_streaming_response.create(
        model=ALIAS, prompt="hi [[sim chunks=3]]", stream=True
    ) as streamed:
        chunks = [chunk for _, chunk in events(streamed)]
    strict(Completion, chunks[-1])
    for chunk in chunks[:-1]:
        # OpenAI's own chunks carry finish_reason null too; everything else is strict
        strict(Completion, {**chunk, "choices": [{**chunk["choices"][0], "finish_reason": "stop"}]})


# -- Responses -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        {"input": "hi [[sim chunks=3]]"},
        {"input": "hi [[sim tool_call=1]]", "tools": TOOLS},
        {"input": "hi [[sim chunks=2 terminal=incomplete]]"},
        {"input": "hi [[sim chunks=2 terminal=failed]]"},
    ],
    ids=["text", "function_call", "incomplete", "failed"],
)
def test_responses_stream_events_and_answer(client: openai.OpenAI, extra: dict[str, Any]) -> None:
    with client.responses.with_streaming_response.create(
        model=ALIAS, stream=True, **extra
    ) as streamed:
        seen = events(streamed)
    for name, data in seen:
        assert data["type"] == name
        EVENT.validate_python(data, strict=True)
    terminal = seen[-1][1]["response"]
    strict(Response, terminal)
    raw = client.responses.with_raw_response.create(model=ALIAS, **extra)
    answer = strict(Response, raw.http_response.json())
    assert answer.model == ALIAS and answer.status == terminal["status"]


def test_the_sdk_stream_has_item_ids(client: openai.OpenAI) -> None:
    stream = client.responses.create(
        model=ALIAS, input="hi [[sim chunks=2 tool_call=1]]", tools=TOOLS, stream=True
    )
    items: dict[int, str] = {}
    deltas: list[ResponseTextDeltaEvent] = []
    arguments: list[ResponseFunctionCallArgumentsDeltaEvent] = []
    for event in stream:
        if event.type == "response.output_item.added":
            assert event.item.id is not None
            items[event.output_index] = event.item.id
        elif isinstance(event, ResponseTextDeltaEvent):
            deltas.append(event)
        elif isinstance(event, ResponseFunctionCallArgumentsDeltaEvent):
            arguments.append(event)
    assert deltas and arguments
    assert all(d.item_id == items[d.output_index] and d.logprobs == [] for d in deltas)
    assert [a.item_id for a in arguments] == [items[arguments[0].output_index]]
    assert arguments[0].item_id.startswith("fc_")


def test_retrieve_answers_the_filled_copy(client: openai.OpenAI) -> None:
    created = client.responses.create(model=ALIAS, input="keep [[sim chunks=2]]")
    raw = client.responses.with_raw_response.retrieve(created.id)
    fetched = strict(Response, raw.http_response.json())
    assert (fetched.id, fetched.output_text) == (created.id, created.output_text)
    assert (fetched.tool_choice, fetched.parallel_tool_calls, fetched.tools) == ("auto", True, [])


def test_include_values_the_worker_parses_are_forwarded(
    stack: Stack, client: openai.OpenAI
) -> None:
    include: Any = ["reasoning.encrypted_content", "message.input_image.image_url"]
    response = client.responses.create(model=ALIAS, input="hi", include=include)
    assert response.status == "completed"
    sent = worker_posts(stack.sim)[-1].json
    assert isinstance(sent, dict) and sent["include"] == include


@pytest.mark.parametrize(
    ("include", "param"),
    [
        (["message.output_text.logprobs"], "include[0]"),
        (["reasoning.encrypted_content", "web_search_call.results"], "include[1]"),
        (["code_interpreter_call.outputs"], "include[0]"),
    ],
)
def test_include_values_refused_name_their_index(
    stack: Stack, client: openai.OpenAI, include: Any, param: str
) -> None:
    before = len(worker_posts(stack.sim))
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=ALIAS, input="hi", include=include)
    assert (info.value.code, info.value.param) == ("unsupported_field", param)
    assert len(worker_posts(stack.sim)) == before


def test_cancel_says_background_responses_are_not_served(
    stack: Stack, client: openai.OpenAI
) -> None:
    own = client.responses.create(model=ALIAS, input="hi [[sim chunks=1]]")
    before = len(worker_posts(stack.sim))
    for response_id in (own.id, "resp_00000000-0000-0000-0000-000000000000", "not-an-id"):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.cancel(response_id)
        error = info.value.body
        assert isinstance(error, dict)
        assert (error["code"], error["param"], error["type"]) == (
            "invalid_request",
            "background",
            "invalid_request_error",
        )
        assert "Background responses are not served" in error["message"]
    assert len(worker_posts(stack.sim)) == before, "the worker's cancel route is never reached"
    with stack.client(token="not-a-token") as anonymous:
        refused = anonymous.post(f"/v1/responses/{own.id}/cancel")
    assert (refused.status_code, refused.json()["error"]["code"]) == (401, "invalid_token")
    with stack.client() as http:
        assert http.get(f"/v1/responses/{own.id}/cancel").status_code == 405


# -- embeddings and models -----------------------------------------------------------


def test_embeddings(client: openai.OpenAI) -> None:
    raw = client.embeddings.with_raw_response.create(
        model=ALIAS, input=["one", "two"], encoding_format="float"
    )
    strict(CreateEmbeddingResponse, raw.http_response.json())
    # The SDK's default asks for base64 and decodes it itself.
    decoded = client.embeddings.create(model=ALIAS, input="one")
    assert decoded.model == ALIAS and all(isinstance(v, float) for v in decoded.data[0].embedding)


def test_models(client: openai.OpenAI) -> None:
    listed = client.models.with_raw_response.list().http_response.json()
    assert listed["object"] == "list"
    for entry in listed["data"]:
        strict(Model, entry)
    one = client.models.with_raw_response.retrieve(ALIAS).http_response.json()
    assert strict(Model, one).id == ALIAS
