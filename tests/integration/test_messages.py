"""The Anthropic Messages API through the real gateway, with the official
``anthropic`` SDK as the client (spec §19, issue 22)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from gateway.apis.messages.events import EventGrammar
from gateway.testing.harness import DEMO_SECRET_ENV, SIM_ROUTE
from tests.support.anthropic import check_grammar, check_sdk_types
from tests.support.evidence import PNG, decoded, no_leases, staged
from tests.support.faults import CHAT_FAULTS, STATUS
from tests.support.jwt import HS_SECRET
from tests.support.poll import eventually
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


def test_a_tool_choice_without_its_name_is_refused_with_the_plan(stack: Stack) -> None:
    token = stack.rs256()
    body = {
        "model": "gemma-4-mm",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "x"}],
        "tools": [{"name": "look", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool"},
    }
    before = len(worker_posts(stack.sim))
    refused = httpx.post(
        stack.url + "/v1/messages", json=body, headers={"x-api-key": token}, timeout=10
    )
    assert refused.status_code == 400
    assert refused.json()["type"] == "error"
    assert refused.json()["error"]["param"] == "tool_choice.name"
    receipt = stack.receipt(refused.headers["x-request-id"])
    assert receipt["error_code"] == "invalid_request"
    assert receipt["queue_ms"] in (None, 0), "refused before the permit"
    assert len(worker_posts(stack.sim)) == before


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


# ---------------------------------------------------------------- a second stack
#
# Fast worker timeouts (hang faults in about a second), a token budget to read
# the reservation from, evidence uploads, and a tenant with two requests a minute.

FAST = {
    "first_event_timeout_s": 0.6,
    "idle_timeout_s": 0.6,
    "total_timeout_s": 5,
    "max_line_bytes": 65_536,
}
TOKENS_PER_MINUTE = 100_000


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    mp = pytest.MonkeyPatch()
    mp.setenv(DEMO_SECRET_ENV, HS_SECRET)
    acme = {
        "endpoints": [*ENDPOINTS, "evidence"],
        "limits": {
            "max_output_tokens": 512,
            "requests_per_minute": 6000,
            "tokens_per_minute": TOKENS_PER_MINUTE,
        },
    }
    globex = {"endpoints": ["messages"], "limits": {"requests_per_minute": 2}}
    try:
        with running_stack(
            tmp_path_factory.mktemp("messages-fast"), acme=acme, globex=globex, upstream=FAST
        ) as running:
            yield running
    finally:
        mp.undo()


def _user(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(blocks)}]


def _last_chat(stack: Stack) -> dict[str, Any]:
    seen = [p for p in worker_posts(stack.sim) if p.path == "/v1/chat/completions"][-1]
    assert isinstance(seen.json, dict)
    return seen.json


# ---------------------------------------------------------------- count_tokens


def test_count_tokens_with_the_sdk_is_the_workers_count(stack: Stack) -> None:
    messages: Any = [{"role": "user", "content": "How many tokens is this?"}]
    with _client(stack) as client:
        raw = client.messages.with_raw_response.count_tokens(
            model="gemma-4-mm", system="Count.", messages=messages
        )
        counted = raw.parse()
        created = client.messages.create(
            model="gemma-4-mm", max_tokens=4, system="Count.", messages=messages
        )
    assert counted.input_tokens > 0
    # The simulator estimates a prompt the same way on both routes.
    assert counted.input_tokens == created.usage.input_tokens
    [seen] = [p for p in worker_posts(stack.sim) if p.path == "/v1/messages/count_tokens"][-1:]
    assert seen.json == {
        "model": SIM_ROUTE,
        "system": "Count.",
        "messages": [{"role": "user", "content": "How many tokens is this?"}],
    }
    assert not any(k.startswith("anthropic") or k == "x-api-key" for k in seen.headers)
    receipt = stack.receipt(raw.headers["x-request-id"])
    assert receipt["endpoint"] == "messages.count_tokens"
    assert (receipt["outcome"], receipt["error_code"]) == ("complete", None)
    assert receipt["usage"]["prompt_tokens"] == counted.input_tokens
    assert receipt["usage"]["completion_tokens"] == 0


def test_count_tokens_bills_no_tokens(fast: Stack) -> None:
    messages: Any = [{"role": "user", "content": "x" * 400}]
    with _client(fast) as client:
        first = client.messages.with_raw_response.count_tokens(
            model="gemma-4-mm", messages=messages
        )
        second = client.messages.with_raw_response.count_tokens(
            model="gemma-4-mm", messages=messages
        )
        spent = client.messages.with_raw_response.create(
            model="gemma-4-mm", max_tokens=300, messages=messages
        )
        third = client.messages.with_raw_response.count_tokens(
            model="gemma-4-mm", messages=messages
        )

    def remaining(response: Any) -> int:
        return int(response.headers["x-ratelimit-remaining-tokens"])

    assert first.headers["x-ratelimit-limit-tokens"] == str(TOKENS_PER_MINUTE)
    # A count reserves nothing (the bucket only refills between them) ...
    assert remaining(second) >= remaining(first)
    # ... while a message reserves max_tokens and its prompt before it is sent,
    assert remaining(spent) <= remaining(second) - 300
    # and settles what it used: the next count sees only that.
    used = spent.parse().usage
    assert remaining(third) >= remaining(second) - used.input_tokens - used.output_tokens
    for response in (first, second, third):
        receipt = fast.receipt(response.headers["x-request-id"])
        assert receipt["endpoint"] == "messages.count_tokens"
        assert receipt["outcome"] == "complete"


def test_count_tokens_refuses_max_tokens(stack: Stack) -> None:
    before = len(worker_posts(stack.sim))
    with _client(stack) as client, pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.count_tokens(
            model="gemma-4-mm",
            messages=[{"role": "user", "content": "x"}],
            extra_body={"max_tokens": 16},
        )
    error = raised.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert (error["code"], error["param"]) == ("unsupported_field", "max_tokens")
    assert len(worker_posts(stack.sim)) == before


@pytest.mark.parametrize("fault", ["bad_body", "bad_count", "extra_field"])
def test_a_malformed_count_is_a_protocol_error(stack: Stack, fault: str) -> None:
    with _client(stack) as client, pytest.raises(anthropic.InternalServerError) as raised:
        client.messages.with_raw_response.count_tokens(
            model="gemma-4-mm", messages=[{"role": "user", "content": f"[[sim fault={fault}]]"}]
        )
    assert raised.value.status_code == 502
    body = raised.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"] == {
        **body["error"],
        "type": "api_error",
        "code": "upstream_protocol_error",
    }
    receipt = stack.receipt(raised.value.response.headers["x-request-id"])
    assert (receipt["endpoint"], receipt["outcome"]) == ("messages.count_tokens", "protocol_error")


# ---------------------------------------------------------------- images


def test_an_evidence_image_reaches_the_worker_as_verified_bytes(fast: Stack) -> None:
    record = staged(fast, PNG, "image/png")
    image = {"type": "image", "source": {"type": "url", "url": f"evidence:{record['id']}"}}
    with _client(fast) as client:
        message = client.messages.create(
            model="gemma-4-mm",
            max_tokens=8,
            messages=_user(image, {"type": "text", "text": "What is in it?"}),
        )
        counted = client.messages.count_tokens(
            model="gemma-4-mm", messages=_user(image, {"type": "text", "text": "What is in it?"})
        )
    assert message.stop_reason == "max_tokens" and counted.input_tokens > 0
    parts = _last_chat(fast)["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["image_url", "text"]
    media_type, data = decoded(parts[0]["image_url"]["url"])
    assert (media_type, data) == ("image/png", PNG)
    seen = [p for p in worker_posts(fast.sim) if p.path == "/v1/messages/count_tokens"][-1]
    assert isinstance(seen.json, dict)
    source = seen.json["messages"][0]["content"][0]["source"]
    assert source["type"] == "url" and decoded(source["url"]) == ("image/png", PNG)
    for post in worker_posts(fast.sim):
        assert b"evidence:" not in post.body and b"https://" not in post.body
    assert no_leases(fast)


@pytest.mark.parametrize(
    "source",
    [
        {"type": "url", "url": "https://example.com/cat.png"},
        {"type": "url", "url": "http://127.0.0.1:8080/v1/models"},
        {"type": "url", "url": "file:///etc/passwd"},
        {"type": "base64", "media_type": "image/png", "data": base64.b64encode(PNG).decode()},
    ],
    ids=["https", "loopback", "file", "base64"],
)
@pytest.mark.parametrize("path", ["messages", "count_tokens"])
def test_caller_urls_and_inline_data_are_refused_by_default(
    stack: Stack, source: dict[str, Any], path: str
) -> None:
    before = len(worker_posts(stack.sim))
    messages: Any = _user({"type": "image", "source": source}, {"type": "text", "text": "x"})
    with _client(stack) as client, pytest.raises(anthropic.BadRequestError) as raised:
        if path == "messages":
            client.messages.create(model="gemma-4-mm", max_tokens=8, messages=messages)
        else:
            client.messages.count_tokens(model="gemma-4-mm", messages=messages)
    error = raised.value.body["error"]  # type: ignore[index]
    assert error["code"] == "caller_url_forbidden"
    assert error["param"] == "messages[0].content[0].source"
    assert len(worker_posts(stack.sim)) == before


# ---------------------------------------------------------------- thinking


def test_an_assistant_thinking_block_is_forwarded_as_reasoning_content(stack: Stack) -> None:
    with _client(stack) as client:
        client.messages.create(
            model="gemma-4-mm",
            max_tokens=8,
            thinking={"type": "enabled", "budget_tokens": 1024},
            messages=[
                {"role": "user", "content": "2+2?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Add them.", "signature": "sig"},
                        {"type": "redacted_thinking", "data": "opaque"},
                        {"type": "text", "text": "4"},
                    ],
                },
                {"role": "user", "content": "And 3+3?"},
            ],
        )
    seen = _last_chat(stack)
    assert seen["messages"][1] == {
        "role": "assistant",
        "content": "4",
        "reasoning_content": "Add them.",
    }
    assert seen["enable_thinking"] is True
    assert "sig" not in json.dumps(seen) and "opaque" not in json.dumps(seen)


def test_worker_reasoning_becomes_a_thinking_block(stack: Stack) -> None:
    prompt = [{"role": "user", "content": "[[sim chunks=2 reasoning=3]] think"}]
    with _client(stack) as client:
        answer = client.messages.create(model="gemma-4-mm", max_tokens=16, messages=prompt)
        with client.messages.stream(model="gemma-4-mm", max_tokens=16, messages=prompt) as s:
            streamed = s.get_final_message()
    for message in (answer, streamed):
        assert [b.type for b in message.content] == ["thinking", "text"]
        thinking = message.content[0]
        assert thinking.type == "thinking"
        assert thinking.thinking == "sim-thinking-0 sim-thinking-1 sim-thinking-2 "
        assert message.usage.output_tokens == 5
    assert streamed.content[1].type == "text"
    assert streamed.content[1].text == "sim-token-0 sim-token-1 "
    response = httpx.post(
        stack.url + "/v1/messages",
        json={"model": "gemma-4-mm", "max_tokens": 16, "stream": True, "messages": prompt},
        headers={"x-api-key": stack.rs256()},
        timeout=10,
    )
    events = _sse_events(response.text)
    check_grammar(events)
    check_sdk_types(events)
    starts = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
    assert starts == ["thinking", "text"]


# ---------------------------------------------------------------- worker faults

# A worker Anthropic caller is served from its chat stream: chat's faults, chat's answers.
STREAM_FAULTS = CHAT_FAULTS


def test_the_fault_table_covers_every_chat_fault_but_the_harmless() -> None:
    from gateway.testing.simulator import FAULTS

    assert set(STREAM_FAULTS) == FAULTS - {"nul_text", "no_request_id"}


@pytest.mark.parametrize("fault", sorted(STREAM_FAULTS))
def test_every_chat_fault_ends_a_stream_with_one_error_event(fast: Stack, fault: str) -> None:
    code, outcome, column = STREAM_FAULTS[fault]
    body = {
        "model": "gemma-4-mm",
        "max_tokens": 16,
        "stream": True,
        "messages": [{"role": "user", "content": f"go [[sim fault={fault} chunks=6]]"}],
    }
    response = httpx.post(
        fast.url + "/v1/messages", json=body, headers={"x-api-key": fast.rs256()}, timeout=10
    )
    if column == "head":
        assert response.status_code == STATUS[code]
        error = response.json()
        assert error["type"] == "error"
    else:
        assert response.status_code == 200
        events = _sse_events(response.text)
        names = [n for n, _ in events]
        assert names.count("error") == 1 and names[-1] == "error"
        assert "message_stop" not in names and "[DONE]" not in response.text
        assert names[0] == "message_start"
        # everything before the error is a valid prefix of an Anthropic stream
        grammar = EventGrammar()
        for name, data in events[:-1]:
            grammar.feed(name, data)
        error = events[-1][1]
    assert error["error"]["type"] == "api_error"
    assert error["error"]["code"] == code
    receipt = fast.receipt(response.headers["x-request-id"])
    assert (receipt["outcome"], receipt["error_code"]) == (outcome, code)
    assert receipt["endpoint"] == "messages"
    assert receipt["usage"]["source"] in ("reported", "estimated")


def test_nul_from_the_worker_is_replaced_not_an_error(fast: Stack) -> None:
    prompt = [{"role": "user", "content": "[[sim fault=nul_text chunks=4]]"}]
    with (
        _client(fast) as client,
        client.messages.stream(model="gemma-4-mm", max_tokens=16, messages=prompt) as stream,
    ):
        text = "".join(stream.text_stream)
    assert "\x00" not in text and "\ufffd" in text


# ---------------------------------------------------------------- SDK error classes


def test_429_is_the_sdks_rate_limit_error_with_retry_after(fast: Stack) -> None:
    token = fast.rs256(tenant="globex")
    prompt: Any = [{"role": "user", "content": "x"}]
    with _client(fast, token=token) as client:
        for _ in range(2):
            client.messages.create(model="gemma-4-mm", max_tokens=4, messages=prompt)
        with pytest.raises(anthropic.RateLimitError) as raised:
            client.messages.create(model="gemma-4-mm", max_tokens=4, messages=prompt)
        with pytest.raises(anthropic.RateLimitError):
            client.messages.count_tokens(model="gemma-4-mm", messages=prompt)
    assert raised.value.status_code == 429
    assert int(raised.value.response.headers["retry-after"]) >= 1
    error = raised.value.body["error"]  # type: ignore[index]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limited")


def test_403_is_the_sdks_permission_error_without_the_endpoint(stack: Stack) -> None:
    before = len(worker_posts(stack.sim))
    prompt: Any = [{"role": "user", "content": "x"}]
    with _client(stack, token=stack.rs256(tenant="globex")) as client:
        with pytest.raises(anthropic.PermissionDeniedError) as raised:
            client.messages.create(model="gemma-4-mm", max_tokens=4, messages=prompt)
        with pytest.raises(anthropic.PermissionDeniedError):
            client.messages.count_tokens(model="gemma-4-mm", messages=prompt)
    error = raised.value.body["error"]  # type: ignore[index]
    assert (error["type"], error["code"]) == ("permission_error", "endpoint_not_allowed")
    assert len(worker_posts(stack.sim)) == before


def test_503_is_the_sdks_internal_server_error_while_the_worker_is_not_ready(
    fast: Stack,
) -> None:
    prompt: Any = [{"role": "user", "content": "x"}]

    def ready() -> int:
        return httpx.get(fast.url + "/readyz", timeout=5).status_code

    fast.sim.set_model_status("unloaded")
    try:
        assert eventually(lambda: ready() == 503)
        with _client(fast) as client:
            with pytest.raises(anthropic.InternalServerError) as raised:
                client.messages.create(model="gemma-4-mm", max_tokens=4, messages=prompt)
            with pytest.raises(anthropic.InternalServerError):
                client.messages.count_tokens(model="gemma-4-mm", messages=prompt)
    finally:
        fast.sim.set_model_status("loaded")
        assert eventually(lambda: ready() == 200)
    assert raised.value.status_code == 503
    error = raised.value.body["error"]  # type: ignore[index]
    assert (error["type"], error["code"]) == ("api_error", "upstream_not_ready")
