"""The Responses API and embeddings through the real gateway (spec §14), with the
official ``openai`` SDK against the protocol simulator."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pydantic
import pytest
from openai.types.responses import ResponseCompletedEvent, ResponseItem, ResponseTextDeltaEvent

from gateway.core.errors import GatewayError
from gateway.testing.harness import DEMO_SECRET_ENV
from gateway.testing.simulator import EMBEDDINGS_FAULTS, RESPONSES_FAULTS
from tests.support.evidence import PNG, decoded, staged
from tests.support.jwt import HS_SECRET
from tests.support.stack import Stack, running_stack, worker_posts

ENDPOINTS = ["chat.completions", "completions", "responses", "embeddings", "models", "evidence"]
FAST = {"first_event_timeout_s": 0.6, "idle_timeout_s": 0.6, "total_timeout_s": 5}
ALIAS = "gemma-4-mm"
ResponseItemAdapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseItem)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    mp = pytest.MonkeyPatch()
    mp.setenv(DEMO_SECRET_ENV, HS_SECRET)
    policy = {"endpoints": ENDPOINTS}
    try:
        with running_stack(
            tmp_path_factory.mktemp("responses"), acme=policy, globex=policy, upstream=FAST
        ) as running:
            yield running
    finally:
        mp.undo()


def _sdk(stack: Stack, tenant: str = "acme") -> openai.OpenAI:
    return stack.sdk(stack.rs256(tenant=tenant))


def _last_post(stack: Stack) -> dict[str, Any]:
    body = worker_posts(stack.sim)[-1].json
    assert isinstance(body, dict)
    return body


# -- responses.create -------------------------------------------------------------


def test_responses_create_not_streamed(stack: Stack) -> None:
    response = _sdk(stack).responses.create(model=ALIAS, input="hi [[sim chunks=4]]")
    assert response.status == "completed" and response.model == ALIAS
    assert response.output_text.startswith("sim-token-0")
    assert response.usage is not None and response.usage.output_tokens == 4
    sent = _last_post(stack)
    assert sent["stream"] is True, "asked as a stream, so a disconnect frees the worker"
    assert sent["model"] != ALIAS and sent["max_output_tokens"] == 512
    receipt = stack.receipt(worker_posts(stack.sim)[-1].headers["x-request-id"])
    assert (receipt["endpoint"], receipt["outcome"]) == ("responses", "complete")
    assert receipt["usage"]["source"] == "reported" and receipt["usage"]["completion_tokens"] == 4


def test_responses_create_streamed(stack: Stack) -> None:
    events = list(
        _sdk(stack).responses.create(model=ALIAS, input="hi [[sim chunks=3]]", stream=True)
    )
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if isinstance(e, ResponseTextDeltaEvent))
    assert isinstance(events[-1], ResponseCompletedEvent)
    final = events[-1].response
    assert final.output_text == text and final.model == ALIAS
    with stack.client() as client:
        raw = client.post("/v1/responses", json={"model": ALIAS, "input": "x", "stream": True})
    assert raw.text.endswith("data: [DONE]\n\n")
    assert raw.headers["x-usage-source"] == "reported"


def test_function_tools_round_trip(stack: Stack) -> None:
    client = _sdk(stack)
    tools: Any = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    first = client.responses.create(model=ALIAS, input="weather? [[sim tool_call=1]]", tools=tools)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls, first.output
    follow_up: list[Any] = [
        {"role": "user", "content": "weather? [[sim chunks=2]]"},
        *(item.model_dump(exclude_none=True) for item in first.output),
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"},
    ]
    second = client.responses.create(model=ALIAS, input=follow_up, tools=tools)
    assert second.status == "completed"
    sent = _last_post(stack)
    outputs = [i for i in sent["input"] if i.get("type") == "function_call_output"]
    assert outputs == [
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}
    ]


def test_evidence_in_an_input_image(stack: Stack) -> None:
    record = staged(stack, PNG, "image/png")
    part = {"type": "input_image", "image_url": f"evidence:{record['id']}"}
    body: dict[str, Any] = {
        "model": ALIAS,
        "input": [{"role": "user", "content": [part, {"type": "input_text", "text": "what?"}]}],
    }
    with stack.client() as client:
        assert client.post("/v1/responses", json=body).status_code == 200
    sent_part = _last_post(stack)["input"][0]["content"][0]
    assert decoded(sent_part["image_url"]) == ("image/png", PNG)
    caller_url = {"type": "input_image", "image_url": "https://evil.test/x.png"}
    body["input"][0]["content"] = [caller_url]
    with stack.client() as client:
        refused = client.post("/v1/responses", json=body)
    assert refused.json()["error"]["code"] == "caller_url_forbidden"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools[0].type"),
        ({"background": True}, "background"),
        ({"include": ["file_search_call.results"]}, "include[0]"),
        ({"max_tool_calls": 2}, "max_tool_calls"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_refused_fields_name_their_path(stack: Stack, extra: dict[str, Any], param: str) -> None:
    before = len(worker_posts(stack.sim))
    with stack.client() as client:
        response = client.post("/v1/responses", json={"model": ALIAS, "input": "x", **extra})
    assert response.status_code == 400
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == (
        "unsupported_field",
        param,
    )
    assert len(worker_posts(stack.sim)) == before


# -- conversations are the gateway's (spec §17) -----------------------------------


def _texts(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(role, text) of each message item the worker got, its parts joined."""
    out = []
    for entry in items:
        content = entry["content"]
        parts = [content] if isinstance(content, str) else [p["text"] for p in content]
        out.append((entry["role"], "".join(parts)))
    return out


def test_previous_response_id_own_other_and_unknown(stack: Stack) -> None:
    acme = _sdk(stack)
    own = acme.responses.create(model=ALIAS, input="one [[sim chunks=2]]")
    acme.responses.create(model=ALIAS, input="two", previous_response_id=own.id)
    sent = _last_post(stack)
    # The worker gets the conversation itself, and is asked to keep nothing.
    assert "previous_response_id" not in sent and sent["store"] is False
    assert _texts(sent["input"]) == [
        ("user", "one [[sim chunks=2]]"),
        ("assistant", own.output_text),
        ("user", "two"),
    ]
    before = len(worker_posts(stack.sim))
    globex = _sdk(stack, "globex")
    for other in (own.id, "resp_00000000-0000-0000-0000-000000000000", "not-an-id"):
        with pytest.raises(openai.NotFoundError) as info:
            globex.responses.create(model=ALIAS, input="x", previous_response_id=other)
        assert info.value.code == "response_not_found"
        assert info.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert len(worker_posts(stack.sim)) == before, "no foreign id reached the worker"


def test_a_chain_carries_its_whole_history_whatever_the_worker_kept(stack: Stack) -> None:
    acme = _sdk(stack)
    first = acme.responses.create(
        model=ALIAS, input="first [[sim chunks=1]]", instructions="old rules"
    )
    events = list(
        acme.responses.create(
            model=ALIAS, input="second [[sim chunks=2]]", previous_response_id=first.id, stream=True
        )
    )
    assert isinstance(events[-1], ResponseCompletedEvent)
    second = events[-1].response
    third = acme.responses.create(
        model=ALIAS,
        input=[{"role": "user", "content": "third"}],
        previous_response_id=second.id,
        instructions="new rules",
    )
    sent = _last_post(stack)
    assert _texts(sent["input"]) == [
        ("user", "first [[sim chunks=1]]"),
        ("assistant", first.output_text),
        ("user", "second [[sim chunks=2]]"),
        ("assistant", second.output_text),
        ("user", "third"),
    ]
    assert sent["instructions"] == "new rules", "a chain's instructions are not carried over"
    # Every request asked the worker to keep nothing, and it kept nothing: a
    # worker restart (or another replica's worker) loses nothing of the conversation.
    assert all(r.json["store"] is False for r in worker_posts(stack.sim)[-3:])  # type: ignore[index]
    stack.receipt(third._request_id or "")
    receipts = [r for r in stack.receipts() if r["endpoint"] == "responses"][-3:]
    assert all(r["upstream_id"] and not stack.sim.has_history(r["upstream_id"]) for r in receipts)


def test_a_tool_call_is_carried_as_its_input_item(stack: Stack) -> None:
    client = _sdk(stack)
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    first = client.responses.create(model=ALIAS, input="weather? [[sim tool_call=1]]", tools=tools)
    [call] = [item for item in first.output if item.type == "function_call"]
    output: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    second = client.responses.create(
        model=ALIAS, input=[output], previous_response_id=first.id, tools=tools
    )
    assert second.status == "completed"
    sent = _last_post(stack)["input"]
    assert {
        "type": "function_call",
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments,
    } in sent
    assert sent[-1] == output


def test_store_false_keeps_nothing(stack: Stack) -> None:
    acme = _sdk(stack)
    unstored = acme.responses.create(model=ALIAS, input="u", store=False)
    before = _responses_calls(stack)
    with pytest.raises(openai.NotFoundError):
        acme.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as info:
        acme.responses.create(model=ALIAS, input="x", previous_response_id=unstored.id)
    assert info.value.code == "response_not_found"
    assert _responses_calls(stack) == before, "nothing reached the worker"


def test_retrieve_and_delete_own_ids_only(stack: Stack) -> None:
    acme, globex = _sdk(stack), _sdk(stack, "globex")
    created = acme.responses.create(model=ALIAS, input="keep me")
    before = _responses_calls(stack)
    fetched = acme.responses.retrieve(created.id)
    assert (fetched.id, fetched.model, fetched.output_text) == (
        created.id,
        ALIAS,
        created.output_text,
    )
    with pytest.raises(openai.NotFoundError):
        globex.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        globex.responses.delete(created.id)
    deleted = acme.responses.with_raw_response.delete(created.id)
    assert deleted.status_code == 200
    assert deleted.http_response.json() == {
        "id": created.id,
        "object": "response.deleted",
        "deleted": True,
    }
    with pytest.raises(openai.NotFoundError) as info:
        acme.responses.retrieve(created.id)
    assert info.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        acme.responses.create(model=ALIAS, input="x", previous_response_id=created.id)
    assert _responses_calls(stack) == before, "the worker keeps nothing to fetch or delete"


def test_input_items_list_through_the_sdk(stack: Stack) -> None:
    acme = _sdk(stack)
    given: list[Any] = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "function_call", "call_id": "call-1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call-1", "output": "sunny"},
        {"role": "user", "content": "and tomorrow?"},
    ]
    created = acme.responses.create(model=ALIAS, input=given)
    listed = list(acme.responses.input_items.list(created.id, limit=2, order="asc"))
    assert [type(i).__name__ for i in listed] == [
        "ResponseInputMessageItem",
        "ResponseInputMessageItem",
        "ResponseFunctionToolCallItem",
        "ResponseFunctionToolCallOutputItem",
        "ResponseInputMessageItem",
    ]
    assert all(i.id for i in listed) and len({i.id for i in listed}) == 5
    newest = acme.responses.input_items.list(created.id)
    assert [i.id for i in newest.data] == [i.id for i in reversed(listed)]
    for item in listed:
        ResponseItemAdapter.validate_python(item.model_dump(exclude_unset=True), strict=True)
    with stack.client() as client:
        bad = client.get(f"/v1/responses/{created.id}/input_items", params={"limit": "0"})
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "limit")
    with pytest.raises(openai.NotFoundError):
        _sdk(stack, "globex").responses.input_items.list(created.id)


# -- faults ------------------------------------------------------------------------

# fault -> (code, receipt outcome, column for a streaming caller: "head" or "event")
RESPONSE_FAULTS: dict[str, tuple[str, str, str]] = {
    "missing_done": ("upstream_unavailable", "incomplete", "event"),
    "close_mid": ("upstream_unavailable", "incomplete", "event"),
    "hang_mid": ("upstream_timeout", "incomplete", "event"),
    "error_json": ("upstream_error", "upstream_error", "event"),
    "error_first": ("upstream_error", "upstream_error", "event"),
    "id_change": ("upstream_protocol_error", "protocol_error", "event"),
    "named_event": ("upstream_protocol_error", "protocol_error", "event"),
    "after_done": ("upstream_protocol_error", "protocol_error", "event"),
    "bad_usage": ("upstream_protocol_error", "protocol_error", "event"),
    "too_many_tokens": ("upstream_protocol_error", "protocol_error", "event"),
    "invalid_utf8": ("upstream_protocol_error", "protocol_error", "event"),
    "seq_gap": ("upstream_protocol_error", "protocol_error", "event"),
    "hang": ("upstream_timeout", "incomplete", "head"),
    "hang_headers": ("upstream_timeout", "incomplete", "head"),
    "json_body": ("upstream_protocol_error", "protocol_error", "head"),
    "wrong_content_type": ("upstream_protocol_error", "protocol_error", "head"),
    "gzip": ("upstream_protocol_error", "protocol_error", "head"),
    "redirect": ("upstream_protocol_error", "protocol_error", "head"),
    "wrong_request_id": ("upstream_protocol_error", "protocol_error", "head"),
    "huge_headers": ("upstream_protocol_error", "protocol_error", "head"),
    "endless_line": ("upstream_protocol_error", "protocol_error", "head"),
}
STATUS = {
    "upstream_error": 502,
    "upstream_protocol_error": 502,
    "upstream_unavailable": 502,
    "upstream_timeout": 504,
}


def test_every_simulator_fault_is_covered() -> None:
    assert set(RESPONSE_FAULTS) | {"nul_text", "no_request_id"} == set(RESPONSES_FAULTS)


@pytest.mark.parametrize("fault", sorted(RESPONSE_FAULTS))
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_every_responses_fault(stack: Stack, fault: str, stream: bool) -> None:
    code, outcome, column = RESPONSE_FAULTS[fault]
    body = {"model": ALIAS, "input": f"go [[sim fault={fault} chunks=6]]", "stream": stream}
    with stack.client(timeout=10) as client:
        response = client.post("/v1/responses", json=body)
    if stream and column == "event":
        assert response.status_code == 200
        frames = response.text.strip("\n").split("\n\n")
        assert "data: [DONE]" not in frames, "a failed stream never ends with [DONE]"
        name, _, data = frames[-1].partition("\ndata: ")
        last = json.loads(data)
        assert name == "event: error" and last["type"] == "error" and last["code"] == code
        assert sum(f.startswith("event: error") for f in frames) == 1
        numbers = [
            json.loads(f.partition("data: ")[2])["sequence_number"]
            for f in frames
            if "data: {" in f
        ]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    else:
        assert response.status_code == STATUS[code]
        assert response.json()["error"]["code"] == code
    receipt = stack.receipt(response.headers["x-request-id"])
    assert (receipt["outcome"], receipt["error_code"]) == (outcome, code)


@pytest.mark.parametrize(
    ("terminal", "outcome"), [("incomplete", "length"), ("failed", "upstream_error")]
)
def test_incomplete_and_failed_are_valid_protocol(
    stack: Stack, terminal: str, outcome: str
) -> None:
    body = {"model": ALIAS, "input": f"go [[sim terminal={terminal} chunks=3]]", "stream": True}
    with stack.client() as client:
        response = client.post("/v1/responses", json=body)
    assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
    assert f"event: response.{terminal}" in response.text
    receipt = stack.receipt(response.headers["x-request-id"])
    assert (receipt["outcome"], receipt["error_code"]) == (outcome, None)


# -- embeddings ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "given",
    ["one sentence", ["a", "b", "c"], [1, 2, 3], [[1, 2], [3, 4, 5]]],
    ids=["string", "strings", "tokens", "token_lists"],
)
def test_embeddings_create_float_and_base64(stack: Stack, given: Any) -> None:
    client = _sdk(stack)
    raw_floats = client.embeddings.with_raw_response.create(
        model=ALIAS, input=given, encoding_format="float"
    )
    floats = raw_floats.parse()
    count = 1 if isinstance(given, str) or isinstance(given[0], int) else len(given)
    assert [d.index for d in floats.data] == list(range(count))
    assert floats.model == ALIAS and floats.usage.prompt_tokens > 0
    with stack.client() as raw:
        b64 = raw.post(
            "/v1/embeddings", json={"model": ALIAS, "input": given, "encoding_format": "base64"}
        ).json()
    for entry, vector in zip(b64["data"], floats.data, strict=True):
        raw_bytes = base64.b64decode(entry["embedding"])
        unpacked = struct.unpack(f"<{len(raw_bytes) // 4}f", raw_bytes)
        assert unpacked == pytest.approx(vector.embedding)
    receipt = stack.receipt(raw_floats.headers["x-request-id"])
    assert (receipt["endpoint"], receipt["outcome"]) == ("embeddings", "complete")
    assert receipt["usage"]["source"] == "reported"


def test_embeddings_bounds(stack: Stack) -> None:
    with stack.client() as client:
        many = client.post("/v1/embeddings", json={"model": ALIAS, "input": ["x"] * 257})
        dims = client.post("/v1/embeddings", json={"model": ALIAS, "input": "x", "dimensions": 8})
    assert (many.status_code, many.json()["error"]["param"]) == (400, "input")
    assert dims.json()["error"] == {
        **dims.json()["error"],
        "code": "unsupported_field",
        "param": "dimensions",
    }


@pytest.mark.parametrize(
    "fault", sorted(EMBEDDINGS_FAULTS - {"no_request_id", "hang", "hang_headers"})
)
def test_every_embeddings_fault_is_refused(stack: Stack, fault: str) -> None:
    with stack.client(timeout=10) as client:
        response = client.post(
            "/v1/embeddings", json={"model": ALIAS, "input": [f"x [[sim fault={fault}]]", "y"]}
        )
    assert response.status_code == 502
    assert response.json()["error"]["code"] in ("upstream_protocol_error", "upstream_unavailable")
    receipt = stack.receipt(response.headers["x-request-id"])
    assert receipt["outcome"] in ("protocol_error", "incomplete")


def test_a_hanging_embeddings_worker_times_out(stack: Stack) -> None:
    with stack.client(timeout=10) as client:
        response = client.post(
            "/v1/embeddings", json={"model": ALIAS, "input": "x [[sim fault=hang]]"}
        )
    assert (response.status_code, response.json()["error"]["code"]) == (504, "upstream_timeout")


def test_usage_source_is_marked_for_estimated_completions(stack: Stack) -> None:
    with stack.client() as client:
        completion = client.post(
            "/v1/completions", json={"model": ALIAS, "prompt": "p [[sim chunks=3]]"}
        )
        chat = client.post(
            "/v1/chat/completions",
            json={"model": ALIAS, "messages": [{"role": "user", "content": "c"}]},
        )
    assert completion.headers["x-usage-source"] == "estimated"
    assert chat.headers["x-usage-source"] == "reported"


def _responses_calls(stack: Stack) -> int:
    # The readiness poller's GET /v1/models may land at any moment; only
    # requests for a response count here.
    return sum(1 for r in stack.sim.requests() if r.path.startswith("/v1/responses"))


def test_a_streamed_response_can_be_retrieved_from_the_gateways_copy(stack: Stack) -> None:
    acme = _sdk(stack)
    events = list(acme.responses.create(model=ALIAS, input="s [[sim chunks=2]]", stream=True))
    assert isinstance(events[-1], ResponseCompletedEvent)
    final = events[-1].response
    before = _responses_calls(stack)
    fetched = acme.responses.retrieve(final.id)
    assert fetched.model_dump() == final.model_dump()
    assert _responses_calls(stack) == before, "answered from the kept copy"


# -- a conversation is bounded like any prompt (spec §17) ----------------------------

TOKENS_PER_DAY = 12_000
LIMITS = {"max_output_tokens": 512, "requests_per_minute": 6000}


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    mp = pytest.MonkeyPatch()
    mp.setenv(DEMO_SECRET_ENV, HS_SECRET)
    acme = {"endpoints": ENDPOINTS, "limits": {**LIMITS, "tokens_per_day": TOKENS_PER_DAY}}
    globex = {"endpoints": ENDPOINTS, "limits": {**LIMITS, "max_prompt_bytes": 1000}}
    try:
        with running_stack(
            # The default upstream bounds: forty follow-ups at once on a loaded 2-core
            # machine may take past FAST's 0.6 s to a first event, and these tests
            # are about the tenant's budgets, not the worker's timeouts.
            tmp_path_factory.mktemp("bounded"),
            acme=acme,
            globex=globex,
        ) as running:
            yield running
    finally:
        mp.undo()


def _chain(stack: Stack, client: openai.OpenAI, texts: list[str], **extra: Any) -> str:
    """The id of the last of a chain of responses to ``texts``, its receipts written."""
    previous: str | None = None
    for text in texts:
        created = client.responses.create(
            model=ALIAS, input=text, previous_response_id=previous, **extra
        )
        stack.receipt(created._request_id or "")
        previous = created.id
    assert previous is not None
    return previous


def test_a_chain_past_max_prompt_bytes_is_too_large(bounded: Stack) -> None:
    globex = _sdk(bounded, "globex")
    text = "a" * 284 + "[[sim chunks=1]]"
    last = _chain(bounded, globex, [text] * 3)
    before = len(worker_posts(bounded.sim))
    with pytest.raises(openai.BadRequestError) as info:
        globex.responses.create(model=ALIAS, input=text, previous_response_id=last)
    assert info.value.code == "prompt_too_large"
    assert info.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert len(worker_posts(bounded.sim)) == before
    # The same input alone is within the limit.
    assert globex.responses.create(model=ALIAS, input=text).status == "completed"


async def test_concurrent_follow_ups_stay_within_tokens_per_day(bounded: Stack) -> None:
    acme = _sdk(bounded)
    # Texts of whole tokens (four bytes each): the §7 estimate is the simulator's count.
    last = _chain(bounded, acme, ["x" * 384 + "[[sim chunks=2]]"] * 5, max_output_tokens=8)
    chain_billed = _billed(bounded)
    body = {
        "model": ALIAS,
        "input": "[[sim chunks=2]] go",
        "previous_response_id": last,
        "max_output_tokens": 8,
    }
    async with httpx.AsyncClient(base_url=bounded.url, headers=bounded.headers()) as client:
        answers = await asyncio.gather(
            *(client.post("/v1/responses", json=body, timeout=30) for _ in range(40))
        )
    codes = [a.json()["error"]["code"] if a.status_code != 200 else "ok" for a in answers]
    assert set(codes) == {"ok", "budget_exhausted"}, codes
    for answer in answers:
        bounded.receipt(answer.headers["x-request-id"])
    # Each follow-up forwards the five links' 2,000 bytes of history at least: 500
    # tokens reserved each (reserving only its own input, all 40 would have passed).
    admitted = codes.count("ok")
    assert admitted <= (TOKENS_PER_DAY - chain_billed) // 500
    sent = worker_posts(bounded.sim)[-1].json
    assert isinstance(sent, dict) and len(sent["input"]) == 11
    # What the worker bills past the estimate is its template's few tokens a turn
    # (the simulator's 4, spec §21), never the history.
    assert _billed(bounded) <= TOKENS_PER_DAY + admitted * 4 * len(sent["input"])


def _billed(stack: Stack) -> int:
    return sum(
        r["usage"]["total_tokens"]
        for r in stack.receipts()
        if r["tenant"] == "acme" and r.get("usage")
    )


class _RefusingStore:
    """A response store that refuses every write, as a full state volume does."""

    def __init__(self, real: Any) -> None:
        self.real = real

    async def keep(self, rows: Any, max_bytes: Any) -> None:
        raise GatewayError("state_unavailable")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.fixture
def refusing(stack: Stack) -> Iterator[Stack]:
    book = stack.runtime.responses
    real = book.store
    book.store = _RefusingStore(real)
    try:
        yield stack
    finally:
        book.store = real


def test_an_answer_that_cannot_be_kept_is_state_unavailable(refusing: Stack) -> None:
    with refusing.client() as client:
        answer = client.post("/v1/responses", json={"model": ALIAS, "input": "x"})
        streamed = client.post(
            "/v1/responses", json={"model": ALIAS, "input": "x [[sim chunks=2]]", "stream": True}
        )
        unstored = client.post("/v1/responses", json={"model": ALIAS, "input": "x", "store": False})
    assert (answer.status_code, answer.json()["error"]["code"]) == (503, "state_unavailable")
    # After the head: the stream ends with one error event, never [DONE].
    assert streamed.status_code == 200
    frames = streamed.text.strip("\n").split("\n\n")
    assert "event: response.completed" in streamed.text and "data: [DONE]" not in frames
    name, _, data = frames[-1].partition("\ndata: ")
    assert name == "event: error" and json.loads(data)["code"] == "state_unavailable"
    for response in (answer, streamed):
        receipt = refusing.receipt(response.headers["x-request-id"])
        assert (receipt["outcome"], receipt["error_code"]) == ("incomplete", "state_unavailable")
        assert receipt["usage"]["source"] == "reported", "what the worker made is billed"
    assert unstored.status_code == 200, "a request that keeps nothing needs no store"
