"""Tenants sharing one worker see nothing of each other (spec §21, issue 25):
gateway ids in every dialect, usage reduced to the counts, receipts keeping
everything."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.testing.harness import DEMO_SECRET_ENV
from tests.support.jwt import HS_SECRET
from tests.support.stack import Stack, chat_body, running_stack, sse_data, worker_posts

ENDPOINTS = ["chat.completions", "completions", "responses", "messages", "embeddings", "models"]
COUNTS = {"prompt_tokens", "completion_tokens", "total_tokens"}
TIMINGS = {"avg_tok_per_sec", "total_time_sec", "total_prompt_time_sec"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    mp = pytest.MonkeyPatch()
    mp.setenv(DEMO_SECRET_ENV, HS_SECRET)
    try:
        with running_stack(
            tmp_path_factory.mktemp("isolation"),
            acme={"endpoints": ENDPOINTS},
            globex={"endpoints": ENDPOINTS, "usage_details": "full"},
            sim_options={"extras": True},
        ) as running:
            yield running
    finally:
        mp.undo()


def _stream(stack: Stack, tenant: str, body: dict[str, Any]) -> tuple[list[Any], str]:
    with stack.client(stack.rs256(tenant)) as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    chunks = [json.loads(d) for d in sse_data(response.text) if d != "[DONE]"]
    return chunks, response.headers["x-request-id"]


def test_chat_ids_are_the_gateways_random_and_stable_within_a_stream(stack: Stack) -> None:
    body = chat_body("[[sim chunks=4]]", stream=True)
    first, rid = _stream(stack, "acme", body)
    second, _ = _stream(stack, "acme", body)
    ids = {c["id"] for c in first}
    assert len(ids) == 1
    [gateway_id] = ids
    assert gateway_id.startswith("chatcmpl-") and len(gateway_id) >= len("chatcmpl-") + 24
    assert {c["id"] for c in second} != ids
    receipt = stack.receipt(rid)
    worker_id = receipt["upstream_id"]
    assert worker_id and worker_id != gateway_id
    assert all(c["id"] != worker_id for c in first)


def test_non_streamed_and_completion_ids_are_the_gateways(stack: Stack) -> None:
    with stack.client(stack.rs256("acme")) as client:
        chat = client.post("/v1/chat/completions", json=chat_body("[[sim chunks=2]]")).json()
        completion = client.post(
            "/v1/completions",
            json={"model": "gemma-4-mm", "prompt": "[[sim chunks=2]] x", "max_tokens": 8},
        ).json()
    assert chat["id"].startswith("chatcmpl-") and len(chat["id"]) >= 33
    assert completion["id"].startswith("cmpl-") and len(completion["id"]) >= 29


def test_usage_is_the_counts_unless_the_policy_says_full(stack: Stack) -> None:
    body = chat_body("[[sim chunks=3]]", stream=True)
    body["stream_options"] = {"include_usage": True}
    acme, rid = _stream(stack, "acme", body)
    [usage] = [c["usage"] for c in acme if c.get("usage")]
    assert set(usage) == COUNTS
    receipt = stack.receipt(rid)
    assert set(receipt["usage"]["reported"]) >= TIMINGS or set(receipt["usage"]) >= TIMINGS
    globex, _ = _stream(stack, "globex", body)
    [full] = [c["usage"] for c in globex if c.get("usage")]
    assert set(full) >= TIMINGS and "prompt_tokens_details" in full
    with stack.client(stack.rs256("acme")) as client:
        answer = client.post("/v1/chat/completions", json=chat_body("[[sim chunks=2]]")).json()
    assert set(answer["usage"]) == COUNTS


def test_embeddings_usage_is_the_counts_unless_the_policy_says_full(stack: Stack) -> None:
    """The worker's cached-token count stays in the receipt (spec §21, §24)."""
    body = {"model": "gemma-4-mm", "input": "[[sim extras=true]] some text"}
    with stack.client(stack.rs256("acme")) as client:
        acme = client.post("/v1/embeddings", json=body)
    assert acme.status_code == 200
    assert acme.json()["usage"] == {
        "prompt_tokens": acme.json()["usage"]["prompt_tokens"],
        "total_tokens": acme.json()["usage"]["prompt_tokens"],
    }
    receipt = stack.receipt(acme.headers["x-request-id"])
    assert receipt["usage"]["prompt_tokens"] == acme.json()["usage"]["prompt_tokens"]
    with stack.client(stack.rs256("globex")) as client:
        globex = client.post("/v1/embeddings", json=body).json()
    assert globex["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_responses_ids_and_usage(stack: Stack) -> None:
    sdk = stack.sdk(stack.rs256("acme"))
    created = sdk.responses.create(model="gemma-4-mm", input="[[sim chunks=2]] hi")
    assert created.id.startswith("resp_") and len(created.id) == len("resp_") + 24
    assert created.usage is not None
    assert created.usage.input_tokens_details.cached_tokens == 0
    follow = sdk.responses.create(
        model="gemma-4-mm", input="again", previous_response_id=created.id
    )
    assert follow.id != created.id and follow.id.startswith("resp_")
    fetched = sdk.responses.retrieve(created.id)
    assert fetched.id == created.id
    sdk.responses.delete(created.id)


# -- inner ids (spec §24) ------------------------------------------------------------

TOOL: Any = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
}
CALL_ID = re.compile(r"call_[0-9a-f]{24}")


def _last_worker_body(stack: Stack, path: str) -> dict[str, Any]:
    [*_, seen] = [p for p in worker_posts(stack.sim) if p.path == path]
    assert isinstance(seen.json, dict)
    return seen.json


def test_chat_tool_call_ids_are_the_gateways_and_come_back_as_they_are(stack: Stack) -> None:
    sdk = stack.sdk(stack.rs256("acme"))
    messages: list[Any] = [{"role": "user", "content": "[[sim tool_call=true]] look it up"}]
    first = sdk.chat.completions.create(model="gemma-4-mm", messages=messages, tools=[TOOL])
    [call] = first.choices[0].message.tool_calls or []
    assert CALL_ID.fullmatch(call.id), call.id  # the simulator's are call-<counter uuid>
    streamed: Any = sdk.chat.completions.create(
        model="gemma-4-mm", messages=messages, tools=[TOOL], stream=True
    )
    ids = {c.id for chunk in streamed for c in (chunk.choices[0].delta.tool_calls or []) if c.id}
    assert len(ids) == 1 and CALL_ID.fullmatch(ids.pop() or "")
    # The caller's tool result names the gateway's id, and reaches the worker as it is.
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ]
    sdk.chat.completions.create(model="gemma-4-mm", messages=messages, tools=[TOOL])
    sent = _last_worker_body(stack, "/v1/chat/completions")["messages"]
    assert sent[1]["tool_calls"][0]["id"] == sent[2]["tool_call_id"] == call.id


def test_responses_inner_ids_are_the_gateways_through_a_follow_up(stack: Stack) -> None:
    sdk = stack.sdk(stack.rs256("acme"))
    tool: Any = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    first = sdk.responses.create(
        model="gemma-4-mm", input="[[sim tool_call=true]] look it up", tools=[tool]
    )
    [call] = [item for item in first.output if item.type == "function_call"]
    assert re.fullmatch(r"fc_[0-9a-f]{24}", call.id or "") and CALL_ID.fullmatch(call.call_id)
    kept = sdk.responses.retrieve(first.id)
    assert [item.id for item in kept.output] == [item.id for item in first.output]
    follow = sdk.responses.create(
        model="gemma-4-mm",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "42"}],
        tools=[tool],
    )
    assert follow.status == "completed"
    items = _last_worker_body(stack, "/v1/responses")["input"]
    calls = [
        i["call_id"] for i in items if i.get("type") in ("function_call", "function_call_output")
    ]
    assert calls == [call.call_id, call.call_id]  # the kept call and the caller's output


def test_anthropic_tool_use_ids_are_the_gateways_and_come_back_as_they_are(stack: Stack) -> None:
    import anthropic

    tools: Any = [{"name": "lookup", "input_schema": {"type": "object"}}]
    with anthropic.Anthropic(
        base_url=stack.url, api_key=stack.rs256("acme"), max_retries=0, timeout=10
    ) as client:
        question: Any = {"role": "user", "content": "[[sim tool_call=true]] look it up"}
        first = client.messages.create(
            model="gemma-4-mm", max_tokens=64, tools=tools, messages=[question]
        )
        [use] = [b for b in first.content if b.type == "tool_use"]
        assert re.fullmatch(r"toolu_[0-9a-f]{24}", use.id)
        result: Any = {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42"}],
        }
        client.messages.create(
            model="gemma-4-mm",
            max_tokens=64,
            tools=tools,
            messages=[question, {"role": "assistant", "content": first.content}, result],
        )
    sent = _last_worker_body(stack, "/v1/chat/completions")["messages"]
    assert sent[1]["tool_calls"][0]["id"] == sent[2]["tool_call_id"] == use.id
