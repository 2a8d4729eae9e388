"""``POST /v1/responses``: the named-event stream byte for byte, the resource,
tool calls, terminals, request parsing (findings §5a-§5c)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from gateway.testing.simulator import Simulator
from gateway.testing.simulator.plans import sim_uuid
from tests.testing.simulator.conftest import ROUTE_A, ROUTE_B, SEED
from tests.testing.simulator.wire import Event, Raw, http_request, read_raw, sse_events

RESPONSES = "/v1/responses"
DONE = Event(None, b"[DONE]")


def create(text: str, *, stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {"model": ROUTE_B, "input": text, "stream": stream, **extra}


def stream(sim: Simulator, text: str, timeout: float = 5.0, **extra: Any) -> Raw:
    return read_raw(sim.port, http_request(RESPONSES, create(text, **extra)), timeout)


def names(raw: Raw) -> list[str | None]:
    return [e.name for e in sse_events(raw.body)]


def number_of(response_id: str) -> int:
    return uuid.UUID(response_id.removeprefix("resp_")).int & ((1 << 48) - 1)


# Findings §5b, with this simulator's values: "hi [[sim chunks=2]]" is 9 prompt
# tokens (19 characters, about four a token, plus 4 for the message).
EXPECTED_STREAM = """\
event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"RID","object":"response","created_at":CREATED,"model":"MODEL","status":"queued","output":[]}}

event: response.in_progress
data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"RID","object":"response","created_at":CREATED,"model":"MODEL","status":"in_progress","output":[]}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"type":"message","id":"MID","role":"assistant","content":[],"status":"in_progress"}}

event: response.content_part.added
data: {"type":"response.content_part.added","sequence_number":3,"output_index":0,"content_index":0,"part":{"type":"output_text","text":""}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":4,"output_index":0,"content_index":0,"delta":"sim-token-0 "}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":5,"output_index":0,"content_index":0,"delta":"sim-token-1 "}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":6,"output_index":0,"content_index":0,"delta":""}

event: response.content_part.done
data: {"type":"response.content_part.done","sequence_number":7,"output_index":0,"content_index":0,"part":{"type":"output_text","text":"sim-token-0 sim-token-1 "}}

event: response.output_item.done
data: {"type":"response.output_item.done","sequence_number":8,"output_index":0,"item":{"type":"message","id":"MID","role":"assistant","content":[{"type":"output_text","text":"sim-token-0 sim-token-1 "}],"status":"completed"}}

event: response.completed
data: {"type":"response.completed","sequence_number":9,"response":{"id":"RID","object":"response","created_at":CREATED,"completed_at":CREATED,"model":"MODEL","status":"completed","output":[{"type":"message","id":"MID","role":"assistant","content":[{"type":"output_text","text":"sim-token-0 sim-token-1 "}],"status":"completed"}],"output_text":"sim-token-0 sim-token-1 ","usage":{"input_tokens":9,"output_tokens":2,"total_tokens":11}}}

data: [DONE]

"""  # noqa: E501


def test_stream_bytes_match_the_findings(sim: Simulator) -> None:
    sim.reset()
    raw = stream(sim, "hi [[sim chunks=2]]")
    assert raw.status == 200 and raw.terminated and raw.ending == "eof"
    assert raw.header("content-type") == "text/event-stream"
    assert raw.header("cache-control") == "no-cache"
    assert raw.header("content-length") is None
    first = sse_events(raw.body)[0].json()["response"]
    rid, created = first["id"], first["created_at"]
    number = number_of(rid)
    assert rid == f"resp_{sim_uuid(SEED, number, 0)}"
    expected = (
        EXPECTED_STREAM.replace("RID", rid)
        .replace("MID", f"msg_{sim_uuid(SEED, number, 1)}")
        .replace("CREATED", str(created))
        .replace("MODEL", ROUTE_B)
    ).encode()
    # One event per chunk frame, as hyper writes them.
    assert raw.frames == [e + b"\n\n" for e in expected.split(b"\n\n") if e]
    (request,) = sim.requests()
    assert request.model == ROUTE_B and request.completed


def test_ids_are_reproducible_per_seed_and_differ_between_simulators(sim: Simulator) -> None:
    sim.reset()
    one = stream(sim, "[[sim chunks=1]]")
    ids = {e.json()["response"]["id"] for e in sse_events(one.body) if e.name in _RESOURCE_EVENTS}
    assert len(ids) == 1
    other = Simulator()  # its own random seed
    other.start()
    try:
        raw = read_raw(other.port, http_request(RESPONSES, create("x", model="default")))
    finally:
        other.stop()
    assert sse_events(raw.body)[0].json()["response"]["id"] not in ids
    assert other.id_seed != SEED


_RESOURCE_EVENTS = {"response.created", "response.in_progress", "response.completed"}


def test_max_output_tokens_finishes_on_the_last_text_chunk(sim: Simulator) -> None:
    sim.reset()
    raw = stream(sim, "[[sim chunks=8]]", max_tokens=3, temperature=0.5)
    events = sse_events(raw.body)
    deltas = [e.json()["delta"] for e in events if e.name == "response.output_text.delta"]
    assert deltas == ["sim-token-0 ", "sim-token-1 ", "sim-token-2 "]  # no "" delta
    final = events[-2].json()["response"]
    assert events[-2].name == "response.completed" and final["status"] == "completed"
    assert final["usage"] == {"input_tokens": 8, "output_tokens": 3, "total_tokens": 11}
    # echoed as sent, in ResponseResource order, the alias under its real name
    assert list(final)[-2:] == ["temperature", "max_output_tokens"]
    assert final["max_output_tokens"] == 3 and events[0].json()["response"]["temperature"] == 0.5
    assert events[-1] == DONE


def test_tool_call_alone_is_output_index_1_and_leaves_no_message(sim: Simulator) -> None:
    sim.reset()
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    raw = stream(sim, "[[sim chunks=0 tool_call=1]]", tools=tools)
    events = sse_events(raw.body)
    assert names(raw) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
        None,
    ]
    added = events[2].json()
    assert list(added) == ["type", "sequence_number", "output_index", "item"]
    item = added["item"]
    assert added["output_index"] == 1 and list(item) == [
        "type",
        "id",
        "call_id",
        "name",
        "arguments",
        "status",
    ]
    assert item["name"] == "get_weather" and item["status"] == "completed"
    assert item["id"].startswith("fc_") and item["call_id"].startswith("call-")
    delta, done = events[3].json(), events[4].json()
    assert list(delta) == ["type", "sequence_number", "output_index", "call_id", "delta"]
    assert delta["delta"] == done["arguments"] == item["arguments"] == '{"q":1}'
    assert done["call_id"] == item["call_id"]
    final = events[6].json()["response"]
    assert final["output"] == [item] and "output_text" not in final
    assert final["tools"] == tools


def test_tool_call_after_text_comes_first_in_the_output(sim: Simulator) -> None:
    sim.reset()
    raw = stream(sim, "[[sim chunks=2 tool_call=1]]", tools=[{"type": "function", "name": "f"}])
    got = [(e.name, e.json().get("output_index")) for e in sse_events(raw.body)[:-1]]
    assert got == [
        ("response.created", None),
        ("response.in_progress", None),
        ("response.output_item.added", 0),
        ("response.content_part.added", 0),
        ("response.output_text.delta", 0),
        ("response.output_text.delta", 0),
        ("response.output_item.added", 1),
        ("response.function_call_arguments.delta", 1),
        ("response.function_call_arguments.done", 1),
        ("response.output_item.done", 1),
        ("response.content_part.done", 0),
        ("response.output_item.done", 0),
        ("response.completed", None),
    ]
    output = sse_events(raw.body)[-2].json()["response"]["output"]
    assert [o["type"] for o in output] == ["function_call", "message"]


def test_tool_choice_none_and_forced_names(sim: Simulator) -> None:
    sim.reset()
    tools = [{"type": "function", "name": "a"}, {"type": "function", "function": {"name": "b"}}]
    off = stream(sim, "[[sim chunks=1 tool_call=1]]", tools=tools, tool_choice="none")
    assert "response.function_call_arguments.done" not in names(off)
    forced = {"type": "function", "name": "b"}
    raw = stream(sim, "[[sim chunks=0 tool_call=1]]", tools=tools, tool_choice=forced)
    assert sse_events(raw.body)[2].json()["item"]["name"] == "b"
    final = sse_events(raw.body)[-2].json()["response"]
    assert final["tool_choice"] == forced and final["tools"] == tools


def test_terminal_incomplete(sim: Simulator) -> None:
    sim.reset()
    raw = stream(sim, "[[sim chunks=2 terminal=incomplete]]")
    events = sse_events(raw.body)
    assert [e.name for e in events[-4:]] == [
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
        None,
    ]
    assert events[-3].json()["item"]["status"] == "incomplete"
    final = events[-2].json()["response"]
    assert final["status"] == "incomplete" and "completed_at" not in final
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert list(final)[-2:] == ["usage", "incomplete_details"]
    assert final["usage"]["output_tokens"] == 2


def test_terminal_failed(sim: Simulator) -> None:
    sim.reset()
    raw = stream(sim, "[[sim chunks=2 terminal=failed]]")
    assert names(raw) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.failed",
        None,
    ]
    failed = sse_events(raw.body)[-2].json()
    assert failed["sequence_number"] == 6
    response = failed["response"]
    assert response["status"] == "failed" and "usage" not in response
    assert response["error"] == {"type": "model_error", "message": "simulated model error"}
    assert response["output"][0]["status"] == "in_progress"
    early = stream(sim, "[[sim chunks=0 terminal=failed]]")
    assert names(early) == ["response.created", "response.failed", None]


def test_finish_length_knob_is_still_completed(sim: Simulator) -> None:
    sim.reset()
    raw = stream(sim, "[[sim chunks=2 finish=length]]")
    assert names(raw)[-2] == "response.completed"


def test_keepalive_comments_between_events(sim: Simulator) -> None:
    sim.reset()
    raw = stream(sim, "[[sim chunks=1 keepalive_ms=20 first_delay_ms=90]]")
    assert raw.frames[0].startswith(b"event: response.created\n")
    assert raw.frames[1] == b":\n\n"
    first_in_progress = next(i for i, f in enumerate(raw.frames) if b"in_progress" in f)
    assert set(raw.frames[1:first_in_progress]) == {b":\n\n"}


def test_split_writes_give_identical_bytes(sim: Simulator) -> None:
    sim.reset()

    def normalised(raw: Raw) -> bytes:
        number = number_of(sse_events(raw.body)[0].json()["response"]["id"])
        body = raw.body
        for kind in (0, 1):  # the response and message ids come from the request number
            body = body.replace(sim_uuid(SEED, number, kind).encode(), b"ID%d" % kind)
        return body

    whole = stream(sim, "[[sim chunks=3 unicode=1 split=0]]")  # same prompt length
    split = stream(sim, "[[sim chunks=3 unicode=1 split=1]]")
    assert split.terminated and split.frames[-1] == b"data: [DONE]\n\n"
    assert normalised(split) == normalised(whole)
    assert normalised(whole).count(b"resp_ID0") == 3


# ---------------------------------------------------------------- non-stream


def test_non_stream_resource_shape(client: httpx.Client) -> None:
    body = {"input": "x [[sim chunks=2]]", "metadata": {"k": "v"}, "store": True}
    response = client.post(RESPONSES, json={"model": "default", **body})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    resource = response.json()
    assert list(resource) == [
        "id",
        "object",
        "created_at",
        "completed_at",
        "model",
        "status",
        "output",
        "output_text",
        "usage",
        "metadata",
        "store",
    ]
    assert resource["model"] == "default"  # the request's string, not the route
    assert resource["object"] == "response" and resource["status"] == "completed"
    (message,) = resource["output"]
    assert message == {
        "type": "message",
        "id": message["id"],
        "role": "assistant",
        "content": [{"type": "output_text", "text": "sim-token-0 sim-token-1 "}],
        "status": "completed",
    }
    assert resource["output_text"] == "sim-token-0 sim-token-1 "
    assert resource["usage"]["output_tokens"] == 2 and resource["metadata"] == {"k": "v"}


def test_non_stream_empty_text_still_has_a_message(client: httpx.Client) -> None:
    resource = client.post(RESPONSES, json=create("[[sim chunks=0]]", stream=False)).json()
    assert resource["output"][0]["content"] == [{"type": "output_text", "text": ""}]
    assert resource["output_text"] == ""
    call = client.post(RESPONSES, json=create("[[sim chunks=0 tool_call=1]]", stream=False))
    assert [o["type"] for o in call.json()["output"]] == ["function_call"]
    assert "output_text" not in call.json()


def test_non_stream_terminals(client: httpx.Client) -> None:
    failed = client.post(RESPONSES, json=create("[[sim chunks=1 terminal=failed]]", stream=False))
    assert failed.status_code == 500
    body = failed.json()
    assert list(body) == ["message", "partial_response"]
    partial = body["partial_response"]
    assert partial["status"] == "failed" and partial["error"]["type"] == "model_error"
    # A failed non-streamed run is stored (the real server stores the partial response).
    assert client.get(f"{RESPONSES}/{partial['id']}").json() == partial
    done = create("[[sim chunks=1 terminal=incomplete]]", stream=False)
    incomplete = client.post(RESPONSES, json=done).json()
    assert incomplete["status"] == "incomplete" and "completed_at" not in incomplete
    assert incomplete["incomplete_details"] == {"reason": "max_output_tokens"}


def test_items_input_instructions_and_directives(client: httpx.Client) -> None:
    last = [
        {"type": "input_text", "text": "look"},
        {"type": "input_text", "text": "[[sim chunks=3]]"},
    ]
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "[[sim chunks=1]]"},
        {"type": "message", "role": "assistant", "content": "[[sim chunks=4]]"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "item_reference", "id": "msg_1"},
        {"type": "message", "role": "user", "content": last},
    ]
    resource = client.post(RESPONSES, json={"input": items}).json()
    assert resource["usage"]["output_tokens"] == 3  # the last user item's directive
    plain = client.post(RESPONSES, json={"input": items[-1:]}).json()["usage"]["input_tokens"]
    assert resource["usage"]["input_tokens"] > plain
    told = client.post(RESPONSES, json={"input": items[-1:], "instructions": "be brief"}).json()
    assert told["usage"]["input_tokens"] == plain + 2 + 4  # "be brief": 2 tokens + 4
    assert "instructions" not in told  # not echoed


@pytest.mark.parametrize(
    ("body", "status", "starts"),
    [
        ({"model": "default"}, 422, "Failed to deserialize the JSON body"),
        ({"input": 3}, 422, "Failed to deserialize the JSON body"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": []}]}, 422, "F"),
        ({"input": [{"type": "nonsense"}]}, 422, "Failed to deserialize"),
        ({"input": "x", "max_tokens": 1, "max_output_tokens": 1}, 422, "Failed to deserialize"),
        ({"input": "x", "tool_choice": "sometimes"}, 422, "Failed to deserialize"),
        ({"input": "x", "include": ["message.output_text.logprobs"]}, 422, "Failed"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "simulator: tool type"),
        ({"input": "x [[sim fault=wrong_count]]"}, 400, "simulator: fault 'wrong_count'"),
        ({"input": "x [[sim terminal=maybe]]"}, 400, "simulator: terminal must be"),
    ],
)
def test_refusals_as_text(client: httpx.Client, body: Any, status: int, starts: str) -> None:
    response = client.post(RESPONSES, json=body)
    assert response.status_code == status
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text.startswith(starts)


def test_refusals_as_json(client: httpx.Client) -> None:
    unknown = client.post(RESPONSES, json={"model": "other", "input": "x"})
    assert unknown.status_code == 500
    assert unknown.json() == {
        "message": f"Requested model 'other' is not available. Available models: "
        f"{ROUTE_A}, {ROUTE_B}. Use 'default' to use the default model."
    }
    zero = client.post(RESPONSES, json={"input": "x", "max_output_tokens": 0})
    assert (zero.status_code, zero.json()) == (
        500,
        {"message": "max_output_tokens must be at least 1."},
    )
    capped = client.post(RESPONSES, json={"input": "x", "max_tool_calls": 2})
    assert capped.status_code == 500
    assert capped.json()["message"].startswith("max_tool_calls is not supported.")
    broken = client.post(RESPONSES, content=b"{", headers={"content-type": "application/json"})
    assert broken.status_code == 400
    assert client.post(RESPONSES, content=b"{}").status_code == 415
    assert client.get(RESPONSES).status_code == 405
    failing = client.post(RESPONSES, json={"input": "[[sim status=503]]"})
    assert (failing.status_code, failing.json()) == (503, {"message": "simulated failure"})


def test_stream_null_is_not_streamed(client: httpx.Client) -> None:
    response = client.post(RESPONSES, json={"input": "[[sim chunks=1]]", "stream": None})
    assert response.headers["content-type"] == "application/json"
    assert json.loads(response.content)["status"] == "completed"
