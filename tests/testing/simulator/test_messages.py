"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: the worker's own
Anthropic stream and answer (reference §12) byte for byte, pings, refusals,
the token count, and every fault (``MESSAGES_FAULTS``, ``COUNT_TOKENS_FAULTS``)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.apis.chat.dialect import SSEValidator, StreamRules
from gateway.core.errors import GatewayError
from gateway.testing.simulator import COUNT_TOKENS_FAULTS, MESSAGES_FAULTS, Simulator
from gateway.testing.simulator.messages import PING_EVENT
from gateway.testing.simulator.plans import rough_tokens
from tests.support.anthropic import (
    MESSAGE,
    SIM_CAPTURES,
    WEATHER_TOOL,
    capture,
    check_grammar,
    check_sdk_types,
    sim_request,
)
from tests.support.sse import drain
from tests.testing.simulator.conftest import ROUTE_A, ROUTE_B
from tests.testing.simulator.wire import Event, Raw, exchange, http_request, parse, read_raw
from tests.testing.simulator.wire import sse_events as _sse_events

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "sse" / "messages"
ZERO = {"input_tokens": 0, "output_tokens": 0}
ERROR_EVENT = (
    b'event: error\ndata: {"type":"error","error":{"type":"api_error",'
    b'"message":"simulated engine error"}}'
)


def body(directive: str, **extra: Any) -> dict[str, Any]:
    return {**sim_request(directive), "model": ROUTE_B, "stream": True, **extra}


def stream(sim: Simulator, directive: str, timeout: float = 5.0, **extra: Any) -> Raw:
    return read_raw(sim.port, http_request(MESSAGES, body(directive, **extra)), timeout)


def sse_events(raw: Raw) -> list[Event]:
    return _sse_events(raw.body)


def events(raw: Raw) -> list[tuple[str, Any]]:
    out = []
    for e in sse_events(raw):
        assert e.name is not None, e
        out.append((e.name, e.json()))
    return out


def names(raw: Raw) -> list[str | None]:
    return [e.name for e in sse_events(raw)]


def deltas(raw: Raw, kind: str = "text_delta") -> list[str]:
    key = kind.removesuffix("_delta")
    return [
        d["delta"][key]
        for n, d in events(raw)
        if n == "content_block_delta" and d["delta"]["type"] == kind
    ]


def final_delta(raw: Raw) -> dict[str, Any]:
    [delta] = [d for n, d in events(raw) if n == "message_delta"]
    assert isinstance(delta, dict)
    return delta


# ------------------------------------------------------------- the stream


def test_a_text_stream_is_the_workers_event_sequence_byte_for_byte(sim: Simulator) -> None:
    sim.reset()
    raw = stream(sim, "[[sim chunks=2]]")
    assert raw.status == 200 and raw.terminated and raw.ending == "eof"
    assert raw.header("content-type") == "text/event-stream"
    assert raw.header("cache-control") == "no-cache"
    assert raw.header("x-simulator") == "mistralrs-protocol-simulator"
    [request] = [r for r in sim.requests() if r.path == MESSAGES]
    number = events(raw)[0][1]["message"]["id"]  # the engine's sequence counter
    assert number.isdigit()
    message = {
        "id": number,
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": ROUTE_B,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": ZERO,
    }

    def line(name: str, **data: Any) -> bytes:
        return b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **data})

    def text(i: int) -> dict[str, Any]:
        return {"type": "text_delta", "text": f"sim-token-{i} "}

    assert raw.events() == [
        line("message_start", message=message),
        line("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        line("content_block_delta", index=0, delta=text(0)),
        line("content_block_delta", index=0, delta=text(1)),
        line("content_block_stop", index=0),
        line(
            "message_delta",
            delta={"stop_reason": "end_turn", "stop_sequence": None},
            usage={"output_tokens": 2},
        ),
        line("message_stop"),
    ]
    assert raw.body.endswith(b"\n\n") and b"[DONE]" not in raw.body
    assert request.model == ROUTE_B


@pytest.mark.parametrize(
    ("directive", "extra", "stop_reason", "output"),
    [
        ("[[sim chunks=3]]", {}, "end_turn", 3),
        ("[[sim chunks=3 finish=length]]", {}, "max_tokens", 3),
        ("[[sim chunks=9]]", {"max_tokens": 4}, "max_tokens", 4),
        ("[[sim chunks=1 tool_call=1]]", {}, "tool_use", 1),
        ("[[sim chunks=2 finish=canceled]]", {}, "end_turn", 2),
        ("[[sim chunks=0]]", {}, "end_turn", 0),
        ("[[sim chunks=2 reasoning=3]]", {}, "end_turn", 5),
        ("[[sim chunks=5 reasoning=3]]", {"max_tokens": 4}, "max_tokens", 4),
    ],
)
def test_every_stream_passes_the_grammar_and_maps_the_finish(
    sim: Simulator, directive: str, extra: dict[str, Any], stop_reason: str, output: int
) -> None:
    raw = stream(sim, directive, **extra)
    found = events(raw)
    check_grammar(found)
    delta = final_delta(raw)
    assert delta["delta"] == {"stop_reason": stop_reason, "stop_sequence": None}
    assert delta["usage"] == {"output_tokens": output}  # output_tokens only
    assert found[-1] == ("message_stop", {"type": "message_stop"})
    assert b"[DONE]" not in raw.body
    # The SDK's types, but for the worker's thinking block (it has no signature).
    thinking = [d for _, d in found if d.get("content_block", {}).get("type") == "thinking"]
    assert all("signature" not in d["content_block"] for d in thinking)
    check_sdk_types([(n, d) for n, d in found if d not in thinking])


def _start_usage(sim: Simulator, directive: str, **extra: Any) -> dict[str, int]:
    name, start = events(stream(sim, directive, **extra))[0]
    assert name == "message_start"
    usage: dict[str, int] = start["message"]["usage"]
    return usage


def test_message_start_carries_usage_only_when_its_chunk_was_the_last(sim: Simulator) -> None:
    """The worker builds it from the first chunk, which has usage only if it is the last."""

    def prompt(directive: str) -> int:
        return rough_tokens([f"{directive} hi"], 4)

    assert _start_usage(sim, "[[sim chunks=3]]") == ZERO
    assert _start_usage(sim, "[[sim chunks=0]]") == {
        "input_tokens": prompt("[[sim chunks=0]]"),
        "output_tokens": 0,
    }
    assert _start_usage(sim, "[[sim chunks=5]]", max_tokens=1) == {
        "input_tokens": prompt("[[sim chunks=5]]"),
        "output_tokens": 1,
    }


def test_thinking_then_text_then_a_tool_call_each_in_its_own_block(sim: Simulator) -> None:
    raw = stream(sim, "[[sim chunks=2 reasoning=2 tool_call=1]]", tools=[WEATHER_TOOL])
    found = events(raw)
    starts = [d for n, d in found if n == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [
        (0, "thinking"),
        (1, "text"),
        (2, "tool_use"),
    ]
    assert starts[0]["content_block"] == {"type": "thinking", "thinking": ""}
    assert deltas(raw, "thinking_delta") == ["sim-thinking-0 ", "sim-thinking-1 "]
    assert deltas(raw) == ["sim-token-0 ", "sim-token-1 "]
    tool = starts[2]["content_block"]
    assert tool["name"] == "get_weather" and tool["input"] == {}
    assert tool["id"].startswith("call-")
    # The call: start, one input_json_delta with the whole arguments, stop.
    at = next(i for i, (n, d) in enumerate(found) if d is starts[2])
    assert found[at + 1] == (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": '{"q":1}'},
        },
    )
    assert found[at + 2] == ("content_block_stop", {"type": "content_block_stop", "index": 2})
    assert final_delta(raw)["delta"]["stop_reason"] == "tool_use"
    check_grammar(found)


def test_pings_fill_idle_time_each_in_its_own_frame(sim: Simulator) -> None:
    raw = stream(sim, "[[sim chunks=1 keepalive_ms=20 first_delay_ms=90]]")
    found = names(raw)
    first = found.index("message_start")
    assert first >= 2 and set(found[:first]) == {"ping"}
    assert PING_EVENT == b'event: ping\ndata: {"type":"ping"}\n\n'
    assert PING_EVENT in raw.frames
    assert b":\n\n" not in raw.frames  # pings, not comments
    check_grammar(events(raw))


def test_no_pings_with_keepalive_off(sim: Simulator) -> None:
    raw = stream(sim, "[[sim chunks=2 keepalive_ms=0 delay_ms=30]]")
    assert "ping" not in names(raw)


def test_split_writes_give_the_same_events(sim: Simulator) -> None:
    whole = stream(sim, "[[sim chunks=3 unicode=1]]")
    pieces = stream(sim, "[[sim chunks=3 unicode=1 split=7]]")
    assert _without_ids(events(pieces)) == _without_ids(events(whole))


# ------------------------------------------------------------- the answer


def test_the_non_streamed_answer_is_the_workers_message(
    sim: Simulator, client: httpx.Client
) -> None:
    request = body("[[sim chunks=2 tool_call=1]]", stream=False, tools=[WEATHER_TOOL])
    answer = client.post(MESSAGES, json=request)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    data = answer.json()
    assert list(data) == [
        "id",
        "type",
        "role",
        "content",
        "model",
        "stop_reason",
        "stop_sequence",
        "usage",
    ]
    assert data["id"].isdigit() and data["model"] == ROUTE_B
    assert data["content"] == [
        {"type": "text", "text": "sim-token-0 sim-token-1 "},
        {
            "type": "tool_use",
            "id": data["content"][1]["id"],
            "name": "get_weather",
            "input": {"q": 1},
        },
    ]
    assert (data["stop_reason"], data["stop_sequence"]) == ("tool_use", None)
    tokens = client.post(COUNT, json={k: v for k, v in request.items() if k != "max_tokens"})
    assert data["usage"] == {"input_tokens": tokens.json()["input_tokens"], "output_tokens": 2}
    MESSAGE.validate_python(data)


def test_a_thinking_answer_puts_the_thinking_block_first(client: httpx.Client) -> None:
    data = client.post(MESSAGES, json=body("[[sim chunks=1 reasoning=2]]", stream=False)).json()
    assert data["content"] == [
        {"type": "thinking", "thinking": "sim-thinking-0 sim-thinking-1 "},
        {"type": "text", "text": "sim-token-0 "},
    ]
    assert data["usage"]["output_tokens"] == 3


@pytest.mark.parametrize(
    ("directive", "extra", "stop_reason"),
    [
        ("[[sim chunks=2]]", {}, "end_turn"),
        ("[[sim chunks=9]]", {"max_tokens": 3}, "max_tokens"),
        ("[[sim tool_call=1]]", {}, "tool_use"),
    ],
)
def test_the_answer_maps_the_finish(
    client: httpx.Client, directive: str, extra: dict[str, Any], stop_reason: str
) -> None:
    data = client.post(MESSAGES, json=body(directive, stream=False, **extra)).json()
    assert data["stop_reason"] == stop_reason
    if stop_reason == "max_tokens":
        assert data["usage"]["output_tokens"] == 3


# ------------------------------------------------------------- count_tokens


def test_count_tokens_is_the_prompt_estimate_of_the_same_message(client: httpx.Client) -> None:
    turns: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is"},
                {"type": "text", "text": "the weather?"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Z"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}],
        },
    ]
    request = {"model": ROUTE_A, "system": "Be brief.", "messages": turns}
    counted = client.post(COUNT, json=request)
    assert counted.status_code == 200
    assert counted.headers["content-type"] == "application/json"
    texts = ["Be brief.", "What is the weather?", "Let me look.", "sunny"]
    assert counted.json() == {"input_tokens": rough_tokens(texts, 4)}
    answered = client.post(MESSAGES, json={**request, "max_tokens": 4}).json()
    assert answered["usage"]["input_tokens"] == counted.json()["input_tokens"]
    # count_tokens takes no max_tokens but, like the worker, does not refuse one.
    assert client.post(COUNT, json={**request, "max_tokens": 4}).json() == counted.json()


def test_count_tokens_reads_directives_and_refuses_a_stream_fault(client: httpx.Client) -> None:
    bad = client.post(
        COUNT,
        json={
            "model": "default",
            "messages": [{"role": "user", "content": "[[sim fault=error_event]]"}],
        },
    )
    assert bad.status_code == 400
    assert bad.json()["error"]["message"].startswith("simulator: fault 'error_event'")


# ------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        ({"model": "default", "messages": []}, "`messages` must contain at least one message."),
        ({"model": "default", "max_tokens": 4}, "`messages` is required and must be an array."),
        ({"messages": [{"role": "user", "content": "x"}]}, "`max_tokens` is required."),
        (
            {"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]},
            "`max_tokens` must be greater than 0.",
        ),
        (
            {"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]},
            "`messages.0.role` must be either `user` or `assistant`.",
        ),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": [{"text": "x"}]}]},
            "`messages.0.content` holds a block without a `type`.",
        ),
        (
            {
                "max_tokens": 4,
                "system": [{"type": "image"}],
                "messages": [{"role": "user", "content": "x"}],
            },
            "Anthropic system blocks only support `text` content.",
        ),
        ([1, 2], "The request body must be a JSON object."),
    ],
)
def test_refusals_are_anthropic_400s(client: httpx.Client, request_body: Any, message: str) -> None:
    refused = client.post(MESSAGES, json=request_body)
    assert refused.status_code == 400
    assert refused.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
    }


def test_an_unknown_model_bad_json_and_a_wrong_method(client: httpx.Client) -> None:
    for path in (MESSAGES, COUNT):
        unknown = client.post(
            path,
            json={"model": "nope", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]},
        )
        assert unknown.status_code == 400
        assert unknown.json()["error"]["message"].startswith("Requested model 'nope' is not")
        not_json = client.post(path, content=b"{oops", headers={"content-type": "application/json"})
        assert not_json.status_code == 400 and not_json.json()["type"] == "error"
        plain = client.post(path, content=b"{}", headers={"content-type": "text/plain"})
        assert plain.status_code == 400  # the worker's 415 becomes its invalid request
        assert plain.json()["error"]["type"] == "invalid_request_error"
        assert client.get(path).status_code == 405


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (404, "not_found_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "api_error"),
        (529, "overloaded_error"),
    ],
)
def test_the_status_knob_answers_an_anthropic_error(
    client: httpx.Client, status: int, kind: str
) -> None:
    for path in (MESSAGES, COUNT):
        failed = client.post(path, json=body(f"[[sim status={status}]]"))
        assert failed.status_code == status
        assert failed.json() == {
            "type": "error",
            "error": {"type": kind, "message": "simulated failure"},
        }


def test_directives_come_from_the_last_user_turn_with_text(client: httpx.Client) -> None:
    turns = [
        {"role": "user", "content": "[[sim chunks=1]] first"},
        {"role": "assistant", "content": "[[sim chunks=7]] ignored"},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t", "content": "[[sim chunks=5]]"}],
        },
    ]
    data = client.post(
        MESSAGES, json={"model": "default", "max_tokens": 16, "messages": turns}
    ).json()
    assert data["usage"]["output_tokens"] == 1
    typo = client.post(MESSAGES, json=body("[[sim chunkz=2]]"))
    assert typo.status_code == 400 and "unknown directive" in typo.json()["error"]["message"]
    foreign = client.post(MESSAGES, json=body("[[sim fault=error_json]]"))
    assert foreign.status_code == 400


# ------------------------------------------------------------- faults


def _complete(raw: Raw) -> bool:
    return names(raw)[-2:] == ["message_delta", "message_stop"] and raw.terminated


def _grammar_fails(raw: Raw) -> bool:
    try:
        check_grammar(events(raw))
    except GatewayError as exc:
        return exc.code == "upstream_protocol_error"
    return False


def _gzip_sse(raw: Raw) -> bool:
    encoded = raw.header("content-encoding") == "gzip"
    return encoded and gzip.decompress(raw.body).endswith(b'data: {"type":"message_stop"}\n\n')


FAULT_CHECKS: dict[str, Callable[[Raw], bool]] = {
    "missing_stop": lambda r: r.terminated and names(r)[-1] == "message_delta",
    "close_mid": lambda r: not r.terminated and len(deltas(r)) == 2,
    "error_event": lambda r: r.terminated and r.events()[-1] == ERROR_EVENT and len(deltas(r)) == 2,
    "error_first": lambda r: r.terminated and r.events() == [ERROR_EVENT],
    "block_order": lambda r: (
        names(r)[1:3] == ["content_block_delta", "content_block_start"] and _grammar_fails(r)
    ),
    "index_gap": lambda r: events(r)[1][1]["index"] == 1 and _grammar_fails(r),
    "unknown_event": lambda r: "agentic_tool_call_progress" in names(r) and _complete(r),
    "after_stop": lambda r: names(r)[-2:] == ["message_stop", "content_block_delta"],
    "too_many_tokens": lambda r: final_delta(r)["usage"] == {"output_tokens": 11},
    "nul_text": lambda r: deltas(r)[2] == "sim-\x00-nul " and _complete(r),
    "invalid_utf8": lambda r: b'"text":"sim-\xff\xfe-bad "' in r.body,
    "hang": lambda r: r.status == 200 and r.body == b"" and r.ending == "timeout",
    "hang_headers": lambda r: r.head_bytes == 0 and r.ending == "timeout",
    "hang_mid": lambda r: len(deltas(r)) == 2 and r.ending == "timeout" and not r.terminated,
    "json_body": lambda r: (
        r.header("content-type") == "application/json" and json.loads(r.body)["type"] == "message"
    ),
    "wrong_content_type": lambda r: (
        r.header("content-type") == "text/plain; charset=utf-8" and _complete(r)
    ),
    "gzip": _gzip_sse,
    "redirect": lambda r: r.status == 307 and r.header("location") == "/sim/redirected",
    "wrong_request_id": lambda r: r.header("x-request-id") not in (None, "mine-1"),
    "no_request_id": lambda r: r.header("x-request-id") is None,
    "huge_headers": lambda r: r.head_bytes > 200 * 1024 and _complete(r),
    "endless_line": lambda r: r.body.startswith(b"data: xxx") and b"\n" not in r.body,
}
_SLOW = {"hang", "hang_headers", "hang_mid"}


def test_every_fault_has_a_check() -> None:
    assert set(FAULT_CHECKS) == MESSAGES_FAULTS


@pytest.mark.parametrize("fault", sorted(FAULT_CHECKS))
def test_fault_produces_its_bytes(sim: Simulator, fault: str) -> None:
    sim.reset()
    request = http_request(
        MESSAGES,
        body(f"[[sim chunks=4 fault={fault}]]", max_tokens=10),
        headers={"x-request-id": "mine-1"},
    )
    timeout = 0.3 if fault in _SLOW else 5.0
    if fault == "endless_line":
        raw = parse(exchange(sim.port, request, timeout, limit=1 << 20))
    else:
        raw = read_raw(sim.port, request, timeout)
    assert FAULT_CHECKS[fault](raw), raw
    if fault == "endless_line":
        assert sim.wait_for(lambda: sim.active_streams == 0, 2)


@pytest.mark.parametrize("fault", ["too_many_tokens", "nul_text", "invalid_utf8", "close_mid"])
def test_body_faults_apply_to_the_answer_too(sim: Simulator, fault: str) -> None:
    request = http_request(
        MESSAGES, body(f"[[sim chunks=4 fault={fault}]]", stream=False, max_tokens=10)
    )
    raw = read_raw(sim.port, request)
    if fault == "close_mid":
        assert raw.status == 0 and raw.ending in ("eof", "reset")
        return
    if fault == "invalid_utf8":
        assert b"sim-\xff\xfe-bad " in raw.body
        return
    data = json.loads(raw.body)
    if fault == "too_many_tokens":
        assert data["usage"]["output_tokens"] == 11
    else:
        assert "\x00" in data["content"][0]["text"]


def _count(raw: Raw) -> Any:
    body = gzip.decompress(raw.body) if raw.header("content-encoding") == "gzip" else raw.body
    return json.loads(body)


#: fault -> check of (the reply, the count the same body gets without the fault)
COUNT_CHECKS: dict[str, Callable[[Raw, int], bool]] = {
    "bad_body": lambda r, n: r.status == 200 and r.body == b'{"input_tokens":',
    "bad_count": lambda r, n: _count(r) == {"input_tokens": -1},
    "extra_field": lambda r, n: _count(r) == {"input_tokens": n, "output_tokens": 0},
    "close_mid": lambda r, n: r.status == 0,
    "hang": lambda r, n: r.head_bytes == 0 and r.ending == "timeout",
    "hang_headers": lambda r, n: r.head_bytes == 0 and r.ending == "timeout",
    "wrong_content_type": lambda r, n: (
        r.header("content-type") == "text/plain; charset=utf-8" and _count(r) == {"input_tokens": n}
    ),
    "gzip": lambda r, n: (
        r.header("content-encoding") == "gzip" and _count(r) == {"input_tokens": n}
    ),
    "redirect": lambda r, n: r.status == 307 and r.header("location") == "/sim/redirected",
    "wrong_request_id": lambda r, n: r.header("x-request-id") not in (None, "mine-1"),
    "no_request_id": lambda r, n: r.header("x-request-id") is None,
    "huge_headers": lambda r, n: r.head_bytes > 200 * 1024 and _count(r) == {"input_tokens": n},
}


def test_every_count_fault_has_a_check() -> None:
    assert set(COUNT_CHECKS) == COUNT_TOKENS_FAULTS


@pytest.mark.parametrize("fault", sorted(COUNT_CHECKS))
def test_count_fault_produces_its_bytes(sim: Simulator, fault: str) -> None:
    text = f"[[sim fault={fault}]]"
    request = {"model": "default", "messages": [{"role": "user", "content": text}]}
    wire = http_request(COUNT, request, headers={"x-request-id": "mine-1"})
    raw = read_raw(sim.port, wire, 0.3 if fault.startswith("hang") else 5.0)
    assert COUNT_CHECKS[fault](raw, rough_tokens([text], 4)), raw


# ------------------------------------------------------------- the fixtures


def _without_ids(found: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The events with message_start's id (a per-simulator counter) blanked."""
    return [
        (n, {**d, "message": {**d["message"], "id": "-"}}) if n == "message_start" else (n, d)
        for n, d in found
    ]


def _without_pings(data: bytes) -> list[tuple[str, Any]]:
    return _without_ids([(str(e.name), e.json()) for e in _sse_events(data) if e.name != "ping"])


def test_the_fixtures_are_still_what_the_simulator_sends() -> None:
    """fixtures/sse/messages are captures (capture.py): a fresh simulator, asked the
    same requests, still sends the same events (ids and pings aside)."""
    sim = Simulator()
    sim.start()
    try:
        for name, (request, _) in SIM_CAPTURES.items():
            captured = (FIXTURES / name).read_bytes()
            assert _without_pings(capture(sim.port, request)) == _without_pings(captured), name
    finally:
        sim.stop()


# ------------------------------------------------------------- chat's reasoning knob


def test_chat_streams_reasoning_content_first_and_counts_it(client: httpx.Client) -> None:
    chat = {
        "model": "default",
        "stream": True,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "[[sim chunks=2 reasoning=2]]"}],
    }
    raw = client.post("/v1/chat/completions", json=chat).content
    validator = SSEValidator(StreamRules("chat", max_tokens=16, loads=orjson.loads))
    replayed, error = drain(validator, [raw])
    assert error is None and len(replayed) == 6  # five chunks, then Done
    chunks = [json.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
    delta = [c["choices"][0]["delta"] for c in chunks]
    assert [d.get("reasoning_content") for d in delta[:2]] == ["sim-thinking-0 ", "sim-thinking-1 "]
    assert [d["content"] for d in delta[:2]] == [None, None]
    assert [d["content"] for d in delta[2:]] == ["sim-token-0 ", "sim-token-1 ", ""]
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    answer = client.post("/v1/chat/completions", json={**chat, "stream": False}).json()
    message = answer["choices"][0]["message"]
    assert message["reasoning_content"] == "sim-thinking-0 sim-thinking-1 "
    assert message["content"] == "sim-token-0 sim-token-1 "
    # completions stream no reasoning
    completion = client.post(
        "/v1/completions", json={"model": "default", "prompt": "[[sim chunks=2 reasoning=2]]"}
    ).json()
    assert completion["usage"]["completion_tokens"] == 2
