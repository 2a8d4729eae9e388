"""The Anthropic Messages API through the real gateway to the real engine (tiny
random-weight model, through the adapter: test equipment; its text means
nothing). The gateway serves ``/v1/messages`` from the worker's
``/v1/chat/completions``, which is all the adapter needs to serve.

Streamed and not, the answer is the official ``anthropic`` SDK's types with
the engine's reported usage (``input_tokens > 0``), the stream passes
``EventGrammar``, and a tool call forced by a regex grammar (the engine's own
tool-call parser reads the forced JSON) comes back as a ``tool_use`` block.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from gateway.apis.chat.answer import RUST_WHITESPACE
from gateway.testing.harness import Gateway, default_policy, write_config
from tests.support.anthropic import MESSAGE, check_grammar, check_sdk_types, frames
from tests.support.engine import EngineAdapter
from tests.support.engine_stack import ALIAS, EngineStack
from tests.support.stack import issuers

#: this SDK release takes no ``temperature`` argument; the API field is still served
GREEDY = {"temperature": 0}
PROMPT: Any = [{"role": "user", "content": "Tell me about the sea."}]
WEATHER: Any = {
    "name": "get_weather",
    "description": "Weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
#: the engine's tool-call parser reads this JSON as a call (regex: braces escaped)
FORCED_CALL = {
    "type": "regex",
    "value": '\\{"name": "get_weather", "arguments": \\{"city": "x"\\}\\}',
}


@pytest.fixture(scope="module")
def lane(
    tiny_adapter: EngineAdapter, dev_secret: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineStack]:
    """A gateway whose tenant may use ``messages`` (the session lane's may not)."""
    directory = tmp_path_factory.mktemp("lane-messages")
    acme = default_policy(
        "acme",
        models={ALIAS: tiny_adapter.route},
        endpoints=["chat.completions", "messages", "models"],
        modalities=["text"],
    )
    config = write_config(
        directory,
        upstream_port=tiny_adapter.port,
        policies={"acme": acme},
        issuers=issuers(),
        upstream={"route": tiny_adapter.route, "readiness_timeout_s": 10},
    )
    with Gateway(config) as gateway:
        assert gateway.wait_ready(), "the gateway never saw the engine adapter ready"
        stack = EngineStack(directory, tiny_adapter, gateway)
        try:
            yield stack
        finally:
            stack.close_clients()


def _client(lane: EngineStack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=lane.url, api_key=lane.rs256(), max_retries=0, timeout=120)


def _stream(lane: EngineStack, **body: Any) -> tuple[httpx.Response, list[tuple[str, Any]]]:
    request = {"model": ALIAS, "max_tokens": 24, "temperature": 0, "messages": PROMPT, **body}
    response = httpx.post(
        lane.url + "/v1/messages",
        json={**request, "stream": True},
        headers={"x-api-key": lane.rs256(), "anthropic-version": "2023-06-01"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return response, frames(response.content)


def test_a_message_from_the_engine_is_an_sdk_message_with_reported_usage(
    lane: EngineStack,
) -> None:
    with _client(lane) as client:
        raw = client.messages.with_raw_response.create(
            model=ALIAS, max_tokens=24, messages=PROMPT, extra_body=GREEDY
        )
    message = MESSAGE.validate_python(raw.http_response.json())
    assert message.model == ALIAS and message.id.startswith("msg_")
    assert message.usage.input_tokens > 0 and 1 <= message.usage.output_tokens <= 24
    expected = "max_tokens" if message.usage.output_tokens == 24 else "end_turn"
    assert message.stop_reason == expected
    assert all(block.type == "text" for block in message.content)
    assert lane.adapter.route not in raw.http_response.text
    receipt = lane.receipt(raw.headers["x-request-id"])
    assert receipt["endpoint"] == "messages" and receipt["outcome"] in ("complete", "length")
    assert receipt["usage"]["source"] == "reported"
    assert receipt["usage"]["prompt_tokens"] == message.usage.input_tokens
    assert raw.headers["x-usage-source"] == "reported"


def test_the_engines_stream_follows_the_anthropic_grammar(lane: EngineStack) -> None:
    response, events = _stream(lane)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert b"[DONE]" not in response.content
    check_grammar(events)
    check_sdk_types(events)
    [(_, final)] = [e for e in events if e[0] == "message_delta"]
    assert final["usage"]["input_tokens"] > 0 and final["usage"]["output_tokens"] >= 1
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    # Greedy: the non-streamed answer is the same text, trimmed as the worker trims it.
    with _client(lane) as client:
        answer = client.messages.create(
            model=ALIAS, max_tokens=24, messages=PROMPT, extra_body=GREEDY
        )
    assert "".join(b.text for b in answer.content if b.type == "text") == text.lstrip(
        RUST_WHITESPACE
    )
    assert answer.usage.input_tokens == final["usage"]["input_tokens"]
    receipt = lane.receipt(response.headers["x-request-id"])
    assert (receipt["endpoint"], receipt["usage"]["source"]) == ("messages", "reported")


def test_the_sdks_stream_helper_assembles_the_engines_message(lane: EngineStack) -> None:
    with (
        _client(lane) as client,
        client.messages.stream(
            model=ALIAS, max_tokens=16, system="Be brief.", messages=PROMPT, extra_body=GREEDY
        ) as stream,
    ):
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.usage.input_tokens > 0 and final.usage.output_tokens >= 1
    assert "".join(b.text for b in final.content if b.type == "text") == text
    assert final.stop_reason in ("end_turn", "max_tokens")


def test_a_tool_call_forced_by_a_grammar_is_a_tool_use_block(lane: EngineStack) -> None:
    with _client(lane) as client:
        message = client.messages.create(
            model=ALIAS,
            max_tokens=64,
            tools=[WEATHER],
            messages=[{"role": "user", "content": "Weather?"}],
            extra_body={**GREEDY, "grammar": FORCED_CALL},
        )
    assert message.stop_reason == "tool_use"
    [use] = [b for b in message.content if b.type == "tool_use"]
    assert (use.name, use.input) == ("get_weather", {"city": "x"})
    assert message.usage.input_tokens > 0
    _, events = _stream(
        lane,
        max_tokens=64,
        tools=[WEATHER],
        messages=[{"role": "user", "content": "Weather?"}],
        grammar=FORCED_CALL,
    )
    check_grammar(events)
    check_sdk_types(events)
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert [b["type"] for b in starts][-1] == "tool_use" and starts[-1]["name"] == "get_weather"
    partial = [d["delta"]["partial_json"] for n, d in events if n == "content_block_delta"]
    assert partial[-1] == '{"city":"x"}'
    [(_, final)] = [e for e in events if e[0] == "message_delta"]
    assert final["delta"]["stop_reason"] == "tool_use"
