"""The Anthropic Messages API through the real gateway, with the official
``anthropic`` SDK as the client (spec §19, issue 22)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from gateway.apis.message_events import EventGrammar
from gateway.testing.harness import DEMO_SECRET_ENV, SIM_ROUTE
from tests.support.jwt import HS_SECRET
from tests.support.stack import Stack, running_stack, worker_posts

ENDPOINTS = ["chat.completions", "messages", "models"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    mp = pytest.MonkeyPatch()
    mp.setenv(DEMO_SECRET_ENV, HS_SECRET)
    try:
        with running_stack(
            tmp_path_factory.mktemp("messages"), acme={"endpoints": ENDPOINTS}
        ) as running:
            yield running
    finally:
        mp.undo()


def _client(stack: Stack, *, token: str | None = None, v1: bool = False, **kw: Any) -> Any:
    return anthropic.Anthropic(
        base_url=stack.url + ("/v1" if v1 else ""),
        api_key=token or stack.rs256(),
        max_retries=0,
        timeout=10,
        **kw,
    )


def _sse_events(body: str) -> list[tuple[str, Any]]:
    import json

    events = []
    for block in body.strip().split("\n\n"):
        name = data = None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        if name is not None:
            events.append((name, data))
    return events


def test_create_answers_a_typed_message_with_reported_usage(stack: Stack) -> None:
    with _client(stack) as client:
        message = client.messages.create(
            model="gemma-4-mm",
            max_tokens=16,
            messages=[{"role": "user", "content": "[[sim chunks=3]] Hello"}],
        )
    assert message.type == "message" and message.role == "assistant"
    assert message.model == "gemma-4-mm"
    assert message.id.startswith("msg_") and len(message.id) >= 4 + 24
    assert message.stop_reason == "end_turn"
    assert message.content and message.content[0].type == "text"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens == 3
    [seen] = [p for p in worker_posts(stack.sim) if p.path == "/v1/chat/completions"][-1:]
    assert seen.json is not None and seen.json["model"] == SIM_ROUTE
    assert seen.json["max_tokens"] == 16 and seen.json["stream"] is True
    assert not any(k.startswith("anthropic") for k in seen.headers)


def test_stream_text_and_final_message(stack: Stack) -> None:
    with (
        _client(stack, v1=True) as client,
        client.messages.stream(
            model="gemma-4-mm",
            max_tokens=32,
            system="Be brief.",
            messages=[{"role": "user", "content": "[[sim chunks=5]] Hi"}],
        ) as stream,
    ):
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].type == "text"
    assert final.content[0].text == text
    assert final.usage.output_tokens == 5 and final.usage.input_tokens > 0
    assert final.stop_reason == "end_turn"


def test_the_stream_follows_the_anthropic_grammar(stack: Stack) -> None:
    token = stack.rs256()
    body = {
        "model": "gemma-4-mm",
        "max_tokens": 8,
        "stream": True,
        "messages": [{"role": "user", "content": "[[sim chunks=8 finish=length]] x"}],
    }
    response = httpx.post(
        stack.url + "/v1/messages",
        json=body,
        headers={"x-api-key": token, "anthropic-version": "2023-06-01"},
        timeout=10,
    )
    assert response.status_code == 200
    assert "[DONE]" not in response.text
    grammar = EventGrammar()
    events = _sse_events(response.text)
    for name, data in events:
        grammar.feed(name, data)
    grammar.end()
    assert events[0][0] == "message_start" and events[-1][0] == "message_stop"
    delta = next(d for n, d in events if n == "message_delta")
    assert delta["delta"]["stop_reason"] == "max_tokens"
    assert delta["usage"]["output_tokens"] == 8
    receipt = stack.receipt(response.headers["x-request-id"])
    assert receipt["endpoint"] == "messages" and receipt["usage"]["source"] == "reported"


def test_tool_use_round_trip(stack: Stack) -> None:
    tools = [
        {
            "name": "get_weather",
            "description": "Weather in a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    with _client(stack) as client:
        first = client.messages.create(
            model="gemma-4-mm",
            max_tokens=64,
            tools=tools,
            messages=[{"role": "user", "content": "[[sim tool_call=true]] weather?"}],
        )
        assert first.stop_reason == "tool_use"
        [use] = [b for b in first.content if b.type == "tool_use"]
        assert isinstance(use.input, dict)
        second = client.messages.create(
            model="gemma-4-mm",
            max_tokens=16,
            tools=tools,
            messages=[
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": first.content},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
                },
            ],
        )
    assert second.stop_reason == "end_turn"
    seen = [p for p in worker_posts(stack.sim) if p.path == "/v1/chat/completions"][-1]
    assert seen.json is not None
    roles = [m["role"] for m in seen.json["messages"]]
    assert roles == ["user", "assistant", "tool"]
    assert seen.json["messages"][1]["tool_calls"][0]["id"] == use.id
    assert seen.json["messages"][2] == {"role": "tool", "tool_call_id": use.id, "content": "sunny"}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"mcp_servers": []}, "mcp_servers"),
        ({"container": "c"}, "container"),
        ({"enable_code_execution": True}, "enable_code_execution"),
        ({"session_id": "s"}, "session_id"),
        ({"unknown_field": 1}, "unknown_field"),
    ],
)
def test_server_tools_and_agentic_extensions_are_refused(
    stack: Stack, extra: dict[str, Any], param: str
) -> None:
    before = len(worker_posts(stack.sim))
    with _client(stack) as client, pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(
            model="gemma-4-mm",
            max_tokens=8,
            messages=[{"role": "user", "content": "x"}],
            extra_body=extra,
        )
    error = raised.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "unsupported_field" and error["param"] == param
    assert len(worker_posts(stack.sim)) == before


def test_metadata_service_tier_and_cache_control_are_dropped(stack: Stack) -> None:
    with _client(stack) as client:
        client.messages.create(
            model="gemma-4-mm",
            max_tokens=8,
            metadata={"user_id": "u1"},
            system=[{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
                    ],
                }
            ],
            extra_body={"service_tier": "auto"},
        )
    seen = [p for p in worker_posts(stack.sim) if p.path == "/v1/chat/completions"][-1]
    assert seen.json is not None
    assert "metadata" not in seen.json and "service_tier" not in seen.json
    assert "cache_control" not in str(seen.json)
    assert seen.json["messages"][0] == {"role": "system", "content": "sys"}


@pytest.mark.parametrize(
    ("status", "kwargs", "exception", "etype"),
    [
        (401, {"token": "not-a-key"}, anthropic.AuthenticationError, "authentication_error"),
        (404, {"model": "nope"}, anthropic.NotFoundError, "not_found_error"),
        (400, {"max_tokens": 10**9}, anthropic.BadRequestError, "invalid_request_error"),
    ],
)
def test_errors_are_anthropic_shaped_and_raise_the_sdk_class(
    stack: Stack, status: int, kwargs: dict[str, Any], exception: type[Exception], etype: str
) -> None:
    token = kwargs.pop("token", None)
    with _client(stack, token=token) as client, pytest.raises(exception) as raised:
        client.messages.create(
            model=kwargs.get("model", "gemma-4-mm"),
            max_tokens=kwargs.get("max_tokens", 8),
            messages=[{"role": "user", "content": "x"}],
        )
    body = raised.value.body  # type: ignore[attr-defined]
    assert body["type"] == "error" and body["error"]["type"] == etype
    assert raised.value.status_code == status  # type: ignore[attr-defined]


def test_headers_x_api_key_and_anthropic_version(stack: Stack) -> None:
    token = stack.rs256()
    url = stack.url + "/v1/messages"
    body = {"model": "gemma-4-mm", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
    bad_version = httpx.post(
        url, json=body, headers={"x-api-key": token, "anthropic-version": "june"}, timeout=10
    )
    assert bad_version.status_code == 400
    assert bad_version.json()["error"]["param"] == "anthropic-version"
    long_beta = httpx.post(
        url, json=body, headers={"x-api-key": token, "anthropic-beta": "b" * 1025}, timeout=10
    )
    assert long_beta.status_code == 400
    empty = httpx.post(url, json=body, headers={"x-api-key": ""}, timeout=10)
    assert empty.status_code == 401 and empty.json()["error"]["code"] == "missing_credentials"
    assert empty.headers["www-authenticate"] == "Bearer"
    both = httpx.post(
        url,
        json=body,
        headers={"x-api-key": token, "authorization": "Bearer other"},
        timeout=10,
    )
    assert both.status_code == 401 and both.json()["error"]["code"] == "invalid_token"
    models = httpx.get(stack.url + "/v1/models", headers={"x-api-key": token}, timeout=10)
    assert models.status_code == 200
    missing = httpx.post(url, json={**body, "max_tokens": None}, headers={"x-api-key": token})
    assert missing.status_code == 400
    nothing = httpx.get(stack.url + "/v1/messages/nope", headers={"x-api-key": token})
    assert nothing.status_code == 404 and nothing.json()["type"] == "error"


def test_a_worker_fault_mid_stream_ends_with_one_error_event(stack: Stack) -> None:
    token = stack.rs256()
    body = {
        "model": "gemma-4-mm",
        "max_tokens": 16,
        "stream": True,
        "messages": [{"role": "user", "content": "[[sim chunks=6 fault=close_mid]] x"}],
    }
    response = httpx.post(
        stack.url + "/v1/messages", json=body, headers={"x-api-key": token}, timeout=10
    )
    events = _sse_events(response.text)
    names = [n for n, _ in events]
    assert names.count("error") == 1 and names[-1] == "error"
    assert "message_stop" not in names
    error = events[-1][1]
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    receipt = stack.receipt(response.headers["x-request-id"])
    assert receipt["outcome"] in ("incomplete", "protocol_error")
