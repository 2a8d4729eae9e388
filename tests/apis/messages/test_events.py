"""The Anthropic Messages dialect (spec §19, ``gateway/apis/messages/events.py``).

- ``EventGrammar`` under the gateway's SSE framing (``tests/support/anthropic.py``)
  on the simulator's captured ``/v1/messages`` streams (``fixtures/sse/messages``),
  fed whole, byte by byte and at seeded random splits: one decision whatever
  the split; and every rule of its docstring broken once;
- ``MessagesDialect`` fed the worker's chat streams (the chat captures in
  ``fixtures/sse`` and synthetic chunks with reasoning and tool calls): what it
  sends (``on_item`` frames, then ``terminal_frame``) passes ``EventGrammar``
  and the official SDK's ``RawMessageStreamEvent``; the non-streamed
  ``answer`` is an SDK ``Message``; stop reasons, tool inputs and ids.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.apis.base import Plan, StreamBounds
from gateway.apis.chat.grammar import Chunk
from gateway.apis.messages.events import EventGrammar, MessagesDialect, stop_reason, tool_input
from gateway.core.errors import GatewayError
from gateway.core.sse import NEED_DATA, Done, Framing
from tests.support.anthropic import (
    MESSAGE,
    check_grammar,
    check_sdk_types,
    frames,
    replay,
)
from tests.support.sse import MODEL, chunk, event, usage

SSE = Path(__file__).resolve().parents[3] / "fixtures" / "sse"
FIXTURES = SSE / "messages"
EXPECTED: dict[str, dict[str, Any]] = json.loads((FIXTURES / "expected.json").read_text())
NAMES = sorted(EXPECTED)
CHAT_EXPECTED: dict[str, dict[str, Any]] = json.loads((SSE / "expected.json").read_text())
CHAT_VALID = sorted(n for n, e in CHAT_EXPECTED.items() if e["result"] == "ok" and n[:5] == "chat_")
ALIAS = "alias-x"
PROTOCOL = ("upstream_protocol_error", "protocol_error")


def splits(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, max(2, len(data))), min(8, max(0, len(data) - 1))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def outcome(data: bytes, pieces: list[bytes] | None = None) -> tuple[list[Any], Any]:
    events, error = replay(data, pieces)
    described = [repr(e) for e in events]
    if error is None:
        return described, None
    return described, (error.code, error.outcome, error.message)


# ------------------------------------------------------------------ fixtures


def test_every_fixture_has_an_expectation_and_a_row() -> None:
    assert {p.name for p in FIXTURES.glob("*.sse")} == set(EXPECTED)
    assert all(name.startswith("messages_") for name in EXPECTED)
    readme = (FIXTURES / "README.md").read_text()
    assert all(f"| `{name}` |" in readme for name in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_fixture_replayed_whole_byte_by_byte_and_split(name: str) -> None:
    expected = EXPECTED[name]
    data = (FIXTURES / name).read_bytes()
    whole = outcome(data)
    assert outcome(data, [data[i : i + 1] for i in range(len(data))]) == whole
    for seed in range(5):
        assert outcome(data, splits(data, seed)) == whole
    events, error = replay(data)
    if expected["result"] == "error":
        assert error is not None
        assert (error.code, error.outcome) == (expected["code"], expected["outcome"])
        assert len(events) == expected["before"]
        assert "sim-token" not in error.message  # fixed texts, never stream content
        return
    assert error is None, error
    assert isinstance(events[-1], Done)
    items: list[tuple[str, Any]] = [e for e in events if isinstance(e, tuple)]
    pings = [i for i in items if i[0] == "ping"]
    found = [i for i in items if i[0] != "ping"]
    assert (len(found), len(pings)) == (expected["events"], expected["pings"])
    block_deltas = [d["delta"] for n, d in found if n == "content_block_delta"]
    assert "".join(d.get("text", "") for d in block_deltas) == expected["text"]
    assert "".join(d.get("thinking", "") for d in block_deltas) == expected["thinking"]
    [(_, final)] = [i for i in found if i[0] == "message_delta"]
    assert final["delta"]["stop_reason"] == expected["stop_reason"]
    assert final["usage"] == {"output_tokens": expected["output_tokens"]}
    tools = [d["content_block"] for n, d in found if n == "content_block_start"]
    tools = [b for b in tools if b["type"] == "tool_use"]
    if expected["tool_use"] is None:
        assert tools == []
    else:
        [tool] = tools
        arguments = [d["partial_json"] for d in block_deltas if d["type"] == "input_json_delta"]
        assert {"name": tool["name"], "partial_json": "".join(arguments)} == expected["tool_use"]
    # The worker's thinking block has no signature; all else is the SDK's types.
    check_sdk_types([i for i in found if i[1].get("content_block", {}).get("type") != "thinking"])


def test_pings_anywhere_but_after_message_stop() -> None:
    data = (FIXTURES / "messages_text.sse").read_bytes()
    ping = b'event: ping\ndata: {"type":"ping"}\n\n'
    parts = data.split(b"\n\n")
    mixed = b"".join(p + b"\n\n" + ping for p in parts[:-2]) + parts[-2] + b"\n\n"
    assert replay(ping + mixed)[1] is None
    assert replay(data + ping)[1] is not None


def test_an_unnamed_event_or_broken_json_is_a_violation() -> None:
    data = (FIXTURES / "messages_text.sse").read_bytes()
    for bad in (b"data: [DONE]\n\n", b'event: ping\ndata: {"type":\n\n'):
        events, error = replay(bad + data)
        assert error is not None and (error.code, error.outcome) == PROTOCOL
        assert events == []


# ------------------------------------------------------------------ the grammar's rules

Fed = dict[str, Any] | tuple[str, Any]  # an event (its type is its name), or (name, data)

START: dict[str, Any] = {
    "type": "message_start",
    "message": {"type": "message", "role": "assistant"},
}
TEXT: dict[str, Any] = {
    "type": "content_block_start",
    "index": 0,
    "content_block": {"type": "text", "text": ""},
}
DELTA: dict[str, Any] = {
    "type": "content_block_delta",
    "index": 0,
    "delta": {"type": "text_delta", "text": "x"},
}
STOP: dict[str, Any] = {"type": "content_block_stop", "index": 0}
MDELTA: dict[str, Any] = {
    "type": "message_delta",
    "delta": {"stop_reason": "end_turn"},
    "usage": {"output_tokens": 1},
}
MSTOP: dict[str, Any] = {"type": "message_stop"}
VALID: list[Fed] = [START, TEXT, DELTA, STOP, MDELTA, MSTOP]


def _feed(events: list[Fed], *, end: bool = True) -> None:
    grammar = EventGrammar()
    for e in events:
        name, data = e if isinstance(e, tuple) else (e["type"], e)
        grammar.feed(name, data)
    if end:
        grammar.end()


def _block(kind: str, index: int = 0) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": {"type": kind}}


def _delta(kind: str, index: int = 0) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": {"type": kind}}


def test_the_valid_orders() -> None:
    _feed(VALID)
    _feed([START, MDELTA, MSTOP])  # no block at all
    ping = {"type": "ping"}
    _feed([ping, START, ping, TEXT, ping, DELTA, ping, STOP, ping, MDELTA, ping, MSTOP])
    _feed(
        [
            START,
            _block("thinking"),
            _delta("thinking_delta"),
            _delta("signature_delta"),
            {**STOP, "index": 0},
            _block("text", 1),
            _delta("text_delta", 1),
            {**STOP, "index": 1},
            _block("tool_use", 2),
            _delta("input_json_delta", 2),
            _delta("input_json_delta", 2),
            {**STOP, "index": 2},
            MDELTA,
            MSTOP,
        ]
    )


BROKEN: dict[str, list[Fed]] = {
    # feed(name, data): the data carries its own type
    "data is not an object": [("message_start", [START])],
    "type is not the name": [("message_start", {**START, "type": "message_stop"})],
    "no type": [("ping", {})],
    # unknown and agentic events fail closed
    "agentic_tool_call_progress": [
        START,
        ("agentic_tool_call_progress", {"type": "agentic_tool_call_progress", "round": 1}),
    ],
    "agentic_tool_approval_required": [
        START,
        ("agentic_tool_approval_required", {"type": "agentic_tool_approval_required"}),
    ],
    "file_produced": [START, ("file_produced", {"type": "file_produced"})],
    "error event": [START, ("error", {"type": "error", "error": {"type": "api_error"}})],
    "unnamed": [START, ("", {"type": ""})],
    # message_start first, once, an assistant message
    "block before message_start": [TEXT],
    "message_delta first": [MDELTA],
    "message_start twice": [START, START],
    "message_start message not an object": [{"type": "message_start", "message": "m"}],
    "message_start without message": [{"type": "message_start"}],
    "message_start not a message": [
        {"type": "message_start", "message": {"type": "completion", "role": "assistant"}}
    ],
    "message_start of a user": [
        {"type": "message_start", "message": {"type": "message", "role": "user"}}
    ],
    # content blocks in index order from 0, one open at a time, known types
    "first index 1": [START, _block("text", 1)],
    "index repeated": [START, TEXT, DELTA, STOP, TEXT],
    "index skipped": [START, TEXT, STOP, _block("text", 2)],
    "index a string": [START, {**TEXT, "index": "0"}],
    "block inside a block": [START, TEXT, _block("text", 1)],
    "block not an object": [START, {**TEXT, "content_block": "text"}],
    "unknown block type": [START, _block("server_tool_use")],
    "redacted_thinking block": [START, _block("redacted_thinking")],
    "block after message_delta": [START, MDELTA, TEXT],
    # deltas only on the open block, of its kind
    "delta before any block": [START, DELTA],
    "delta before its start": [START, DELTA, TEXT],
    "delta after its stop": [START, TEXT, STOP, DELTA],
    "delta of another index": [START, TEXT, {**DELTA, "index": 1}],
    "delta not an object": [START, TEXT, {**DELTA, "delta": "x"}],
    "thinking_delta on text": [START, TEXT, _delta("thinking_delta")],
    "input_json_delta on text": [START, TEXT, _delta("input_json_delta")],
    "signature_delta on text": [START, TEXT, _delta("signature_delta")],
    "text_delta on thinking": [START, _block("thinking"), _delta("text_delta")],
    "text_delta on tool_use": [START, _block("tool_use"), _delta("text_delta")],
    "delta without a type": [START, TEXT, {**DELTA, "delta": {}}],
    # content_block_stop closes the open block
    "stop without a block": [START, STOP],
    "stop of another index": [START, TEXT, {**STOP, "index": 1}],
    "stop twice": [START, TEXT, STOP, STOP],
    # message_delta once, outside blocks, with delta and integer usage.output_tokens
    "message_delta inside a block": [START, TEXT, MDELTA],
    "message_delta twice": [START, MDELTA, MDELTA],
    "message_delta without delta": [START, {**MDELTA, "delta": None}],
    "message_delta without usage": [START, {k: v for k, v in MDELTA.items() if k != "usage"}],
    "usage not an object": [START, {**MDELTA, "usage": 3}],
    "output_tokens missing": [START, {**MDELTA, "usage": {"input_tokens": 1}}],
    "output_tokens a string": [START, {**MDELTA, "usage": {"output_tokens": "1"}}],
    "output_tokens a float": [START, {**MDELTA, "usage": {"output_tokens": 1.0}}],
    "output_tokens a bool": [START, {**MDELTA, "usage": {"output_tokens": True}}],
    # message_stop after message_delta, last
    "message_stop without message_delta": [START, MSTOP],
    "message_stop inside a block": [START, TEXT, MSTOP],
    "event after message_stop": [*VALID, TEXT],
    "ping after message_stop": [*VALID, {"type": "ping"}],
    "message_start after message_stop": [*VALID, START],
    "message_stop twice": [*VALID, MSTOP],
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_rule_broken_once_is_a_protocol_error(case: str) -> None:
    with pytest.raises(GatewayError) as raised:
        _feed(BROKEN[case], end=False)
    assert (raised.value.code, raised.value.outcome) == PROTOCOL
    assert raised.value.status == 502


@pytest.mark.parametrize("kind", [[], {}, ["text"]], ids=["list", "object", "list_of_text"])
def test_an_unhashable_block_type_is_a_protocol_error(kind: Any) -> None:
    with pytest.raises(GatewayError) as raised:
        _feed([START, {**TEXT, "content_block": {"type": kind}}], end=False)
    assert (raised.value.code, raised.value.outcome) == PROTOCOL


@pytest.mark.parametrize("cut", range(len(VALID)))
def test_a_stream_that_ends_before_message_stop_fails_at_its_end(cut: int) -> None:
    _feed(VALID[:cut], end=False)
    with pytest.raises(GatewayError) as raised:
        _feed(VALID[:cut])
    assert (raised.value.code, raised.value.outcome) == PROTOCOL


# ------------------------------------------------------------------ the dialect


def _plan(
    *, stream: bool = True, max_tokens: int | None = 64, tools: bool = False, **body: Any
) -> Plan:
    return Plan("messages", ALIAS, body, stream, True, max_tokens, 10, "n", tools_requested=tools)


def run(
    dialect: MessagesDialect, data: bytes, pieces: list[bytes] | None = None
) -> tuple[list[bytes], bool]:
    """Drive the dialect as the relay does: its frames, and whether the stream ended
    with ``Done`` (then the terminal frame is the last one)."""
    out: list[bytes] = []
    source = dialect.source
    try:
        for piece in [*(pieces if pieces is not None else [data]), b""]:
            source.receive_data(piece)
            while (item := source.next_event()) is not NEED_DATA:
                if isinstance(item, Done):
                    if not dialect.collect:
                        out.append(dialect.terminal_frame)
                    return out, True
                if isinstance(item, Chunk):
                    frame = dialect.on_item(item)
                    assert (frame is None) or not dialect.collect
                    if frame is not None:
                        out.append(frame)
    except GatewayError as exc:
        if not dialect.collect:
            out.append(dialect.error_frame(exc))
        return out, False
    raise AssertionError("no decision at EOF")


def streamed(
    data: bytes, plan: Plan | None = None
) -> tuple[MessagesDialect, list[tuple[str, Any]]]:
    dialect = MessagesDialect(plan or _plan(), StreamBounds(), collect=False)
    out, done = run(dialect, data)
    assert done
    return dialect, frames(b"".join(out))


def answered(data: bytes, plan: Plan | None = None, **usage_counts: int) -> dict[str, Any]:
    dialect = MessagesDialect(plan or _plan(stream=False), StreamBounds(), collect=True)
    out, done = run(dialect, data)
    assert done and out == []
    counts = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12, **usage_counts}
    return dialect.answer(counts)


def _chat_plan(name: str, *, stream: bool = True) -> Plan:
    rules = CHAT_EXPECTED[name]["rules"]
    return _plan(
        stream=stream,
        max_tokens=rules.get("max_tokens"),
        tools=rules.get("tools_requested", False),
    )


def _texts(found: list[tuple[str, Any]], key: str = "text") -> str:
    return "".join(d["delta"].get(key, "") for n, d in found if n == "content_block_delta")


@pytest.mark.parametrize("name", CHAT_VALID)
def test_chat_captures_become_a_valid_anthropic_stream(name: str) -> None:
    expected = CHAT_EXPECTED[name]
    data = (SSE / name).read_bytes()
    dialect, found = streamed(data, _chat_plan(name))
    check_grammar(found)
    check_sdk_types(found)
    assert _texts(found) == expected["text"]
    start = found[0][1]["message"]
    assert found[0][0] == "message_start" and start["model"] == ALIAS
    assert start["id"] == dialect.id and start["usage"] == {"input_tokens": 0, "output_tokens": 0}
    [(_, final)] = [f for f in found if f[0] == "message_delta"]
    reported = expected["usage"]
    assert final["usage"] == {
        "input_tokens": reported["prompt_tokens"],
        "output_tokens": reported["completion_tokens"],
    }
    assert final["delta"]["stop_reason"] == stop_reason(expected["finish_reason"], None)
    everything = orjson.dumps(found)
    assert MODEL.encode() not in everything, "the route never reaches the caller"
    assert b'"id":"7"' not in everything and b"chatcmpl" not in everything
    # split anywhere, the same frames (the ids aside: they are the dialect's own)
    for seed in range(3):
        again = MessagesDialect(_chat_plan(name), StreamBounds(), collect=False)
        out, done = run(again, data, splits(data, seed))
        assert done
        assert _same_ids(frames(b"".join(out))) == _same_ids(found)


@pytest.mark.parametrize("name", CHAT_VALID)
def test_chat_captures_collected_are_an_sdk_message(name: str) -> None:
    answer = answered((SSE / name).read_bytes(), _chat_plan(name, stream=False))
    message = MESSAGE.validate_python(answer)
    assert message.model == ALIAS and message.id.startswith("msg_")
    assert message.usage.input_tokens == 9 and message.usage.output_tokens == 3
    expected = CHAT_EXPECTED[name]
    assert message.stop_reason == stop_reason(expected["finish_reason"], None)
    texts = [b.text for b in message.content if b.type == "text"]
    assert "".join(texts) == expected["text"].lstrip()  # the worker's non-stream trim


#: the gateway's id of a message or a tool use (spec §21, §24)
GATEWAY_ID = re.compile(r"(msg|toolu)_[0-9a-f]{24}")


def _same_ids(found: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The frames with the gateway's random ids written as their prefix."""
    text = orjson.dumps(found).decode()
    return list(orjson.loads(GATEWAY_ID.sub(lambda m: m.group(1) + "_", text)))


def test_the_tool_call_capture_becomes_a_tool_use_block_with_parsed_input() -> None:
    data = (SSE / "chat_tool_calls.sse").read_bytes()
    _, found = streamed(data, _chat_plan("chat_tool_calls.sse"))
    [(_, start)] = [f for f in found if f[0] == "content_block_start"]
    block = start["content_block"]
    # The gateway's id, never the worker's call-3f1c (spec §24).
    assert GATEWAY_ID.fullmatch(block.pop("id")) and "call-3f1c" not in str(found)
    assert block == {"type": "tool_use", "name": "get_weather", "input": {}}
    arguments = [d["delta"]["partial_json"] for n, d in found if n == "content_block_delta"]
    assert arguments == ['{"city":"Zürich"}']
    answer = answered(data, _chat_plan("chat_tool_calls.sse", stream=False))
    [use] = answer["content"]
    assert GATEWAY_ID.fullmatch(use.pop("id"))
    assert use == {"type": "tool_use", "name": "get_weather", "input": {"city": "Zürich"}}
    assert answer["stop_reason"] == "tool_use"


def _stream_of(*chunks: dict[str, Any], done: bool = True) -> bytes:
    return b"".join(event(c) for c in chunks) + (b"data: [DONE]\n\n" if done else b"")


def _reasoning(text: str) -> dict[str, Any]:
    c = chunk(None)
    c["choices"][0]["delta"]["reasoning_content"] = text
    return c


def _calls(*calls: dict[str, Any], finish: str | None = None, **top: Any) -> dict[str, Any]:
    c = chunk(None, finish, **top)
    c["choices"][0]["delta"]["tool_calls"] = list(calls)
    return c


def _call(index: int, arguments: str, *, name: str | None = "f", id: str | None = None) -> Any:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    call: dict[str, Any] = {"index": index, "type": "function", "function": function}
    if id is not None:
        call["id"] = id
    return call


SYNTHETIC = _stream_of(
    _reasoning("Let me "),
    _reasoning("think."),
    chunk("The "),
    chunk("answer."),
    _reasoning("More thought."),
    _calls(_call(0, '{"a":', id="call-a")),
    _calls(_call(0, "1}", name=None), _call(1, "not json", id="call-b", name="g")),
    chunk("", "tool_calls", usage(completion=7, prompt=5)),
)


def test_reasoning_text_and_tool_calls_open_blocks_in_order() -> None:
    _, found = streamed(SYNTHETIC, _plan(tools=True))
    check_grammar(found)
    check_sdk_types(found)
    starts = [(d["index"], d["content_block"]) for n, d in found if n == "content_block_start"]
    ids = [block.pop("id") for _, block in starts if block["type"] == "tool_use"]
    assert starts == [
        (0, {"type": "thinking", "thinking": "", "signature": ""}),
        (1, {"type": "text", "text": ""}),
        (2, {"type": "thinking", "thinking": "", "signature": ""}),
        (3, {"type": "tool_use", "name": "f", "input": {}}),
        (4, {"type": "tool_use", "name": "g", "input": {}}),
    ]
    # The gateway's, one per worker call (call-a, call-b), never the worker's.
    assert all(GATEWAY_ID.fullmatch(i) and i.startswith("toolu_") for i in ids)
    assert len(set(ids)) == 2
    partial = [
        (d["index"], d["delta"]["partial_json"])
        for n, d in found
        if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
    ]
    assert partial == [(3, '{"a":'), (3, "1}"), (4, "not json")]
    assert _texts(found, "thinking") == "Let me think.More thought."
    assert _texts(found) == "The answer."
    [(_, final)] = [f for f in found if f[0] == "message_delta"]
    assert final["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert final["usage"] == {"input_tokens": 5, "output_tokens": 7}


def test_one_tool_call_streamed_in_pieces_is_one_block() -> None:
    data = _stream_of(
        _calls(_call(0, '{"city":', id="call-1", name="get_weather")),
        _calls(_call(0, '"Z"}', name=None)),
        chunk("", "tool_calls", usage()),
    )
    _, found = streamed(data, _plan(tools=True))
    check_grammar(found)
    assert [n for n, _ in found].count("content_block_start") == 1
    partial = [d["delta"]["partial_json"] for n, d in found if n == "content_block_delta"]
    assert "".join(partial) == '{"city":"Z"}'
    answer = answered(data, _plan(stream=False, tools=True))
    [use] = answer["content"]
    assert GATEWAY_ID.fullmatch(use.pop("id"))
    assert use == {"type": "tool_use", "name": "get_weather", "input": {"city": "Z"}}


@pytest.mark.parametrize("index", ["0", 1.5, None, [], {}, [0]])
def test_a_tool_call_without_an_integer_index_is_dropped_as_in_the_answer(index: Any) -> None:
    # Tool calls are not checked by the grammar: a worker's odd index must not
    # reach the dialect's typed state (compiled: a TypeError, not a frame).
    odd = _call(0, '{"b":2}', id="call-odd", name="g")
    odd["index"] = index
    data = _stream_of(
        chunk("Hi."),
        _calls(_call(0, '{"a":1}', id="call-a")),
        _calls(odd),
        chunk("", "tool_calls", usage()),
    )
    _, found = streamed(data, _plan(tools=True))
    check_grammar(found)
    check_sdk_types(found)
    blocks = [d["content_block"]["type"] for n, d in found if n == "content_block_start"]
    assert blocks == ["text", "tool_use"]
    deltas = [d["delta"] for n, d in found if n == "content_block_delta"]
    assert [d.get("partial_json") for d in deltas if d["type"] == "input_json_delta"] == ['{"a":1}']
    answer = answered(data, _plan(stream=False, tools=True))
    assert [block["type"] for block in answer["content"]] == ["text", "tool_use"]


def test_the_answer_has_thinking_text_and_each_tool_input() -> None:
    answer = answered(SYNTHETIC, _plan(stream=False, tools=True))
    MESSAGE.validate_python(answer)
    ids = [block.pop("id") for block in answer["content"] if block["type"] == "tool_use"]
    assert answer["content"] == [
        {"type": "thinking", "thinking": "Let me think.More thought.", "signature": ""},
        {"type": "text", "text": "The answer."},
        {"type": "tool_use", "name": "f", "input": {"a": 1}},
        # arguments that do not parse as a JSON object: {"arguments": raw}
        {"type": "tool_use", "name": "g", "input": {"arguments": "not json"}},
    ]
    assert len(set(ids)) == 2 and all(GATEWAY_ID.fullmatch(i) for i in ids)
    assert answer["usage"] == {"input_tokens": 9, "output_tokens": 3}  # the settled usage


@pytest.mark.parametrize(
    ("arguments", "parsed"),
    [
        ('{"q":1}', {"q": 1}),
        ("{}", {}),
        ("", {"arguments": ""}),
        ("not json", {"arguments": "not json"}),
        ("[1,2]", {"arguments": "[1,2]"}),
        ('"text"', {"arguments": '"text"'}),
        ("7", {"arguments": "7"}),
        ('{"q":', {"arguments": '{"q":'}),
    ],
)
def test_tool_input_is_parsed_or_kept_raw(arguments: str, parsed: Any) -> None:
    assert tool_input(arguments) == parsed


def _finish_stream(finish: str, stop_sequence: str | None) -> bytes:
    last = chunk("", finish, usage(completion=1))
    if stop_sequence is not None:
        last["choices"][0]["stop_sequence"] = stop_sequence
    body = [chunk("x"), last]
    if finish == "tool_calls":
        body.insert(1, _calls(_call(0, "{}", id="c")))
    return _stream_of(*body)


@pytest.mark.parametrize(
    ("finish", "stop_sequence", "reason"),
    [
        ("stop", None, "end_turn"),
        ("length", None, "max_tokens"),
        ("tool_calls", None, "tool_use"),
        ("stop", "</s>", "stop_sequence"),
    ],
)
def test_stop_reason_from_the_finish(finish: str, stop_sequence: str | None, reason: str) -> None:
    data = _finish_stream(finish, stop_sequence)
    plan = _plan(max_tokens=1 if finish == "length" else 64, tools=finish == "tool_calls")
    _, found = streamed(data, plan)
    check_grammar(found)
    check_sdk_types(found)
    [(_, final)] = [f for f in found if f[0] == "message_delta"]
    assert final["delta"] == {"stop_reason": reason, "stop_sequence": stop_sequence}
    plan.stream = False
    answer = answered(data, plan)
    MESSAGE.validate_python(answer)
    assert (answer["stop_reason"], answer["stop_sequence"]) == (reason, stop_sequence)


def test_stop_reason_mapping() -> None:
    assert stop_reason("stop", None) == "end_turn"
    assert stop_reason("eos", None) == "end_turn"
    assert stop_reason("length", None) == "max_tokens"
    assert stop_reason("tool_calls", None) == "tool_use"
    assert stop_reason("stop", "END") == "stop_sequence"
    assert stop_reason(None, None) == "end_turn"


def test_ids_are_msg_and_96_random_bits_per_dialect() -> None:
    ids = [MessagesDialect(_plan(), StreamBounds(), collect=False).id for _ in range(200)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"msg_[0-9a-f]{24,}", i) for i in ids)
    # every hex digit position varies (not a counter, not a timestamp)
    for position in range(4, 28):
        assert len({i[position] for i in ids}) > 4
    dialect, found = streamed((SSE / "chat_valid.sse").read_bytes())
    assert found[0][1]["message"]["id"] == dialect.id


def test_a_failure_ends_with_one_error_event_and_no_message_stop() -> None:
    data = _stream_of(chunk("a"), chunk("b"), done=False)  # the body ends early
    dialect = MessagesDialect(_plan(), StreamBounds(), collect=False)
    out, done = run(dialect, data)
    assert not done
    found = frames(b"".join(out))
    assert [n for n, _ in found].count("error") == 1 and found[-1][0] == "error"
    assert "message_stop" not in [n for n, _ in found]
    assert found[-1][1] == {
        "type": "error",
        "error": {
            "type": "api_error",
            "message": "The inference worker closed the stream before it was complete.",
            "code": "upstream_unavailable",
            "param": None,
        },
    }
    with pytest.raises(GatewayError):
        check_grammar(found)


def test_a_worker_error_or_an_agentic_event_mid_stream_is_one_error_event() -> None:
    for bad, code in (
        (b'data: {"error":{"message":"boom","type":"server_error"}}\n\n', "upstream_error"),
        (b"event: agentic_tool_call_progress\ndata: {}\n\n", "upstream_protocol_error"),
    ):
        dialect = MessagesDialect(_plan(), StreamBounds(), collect=False)
        out, done = run(dialect, event(chunk("a")) + bad + b"data: [DONE]\n\n")
        assert not done
        found = frames(b"".join(out))
        assert [n for n, _ in found] == [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "error",
        ]
        assert found[-1][1]["error"]["code"] == code
        assert "boom" not in found[-1][1]["error"]["message"]


def test_nul_in_text_is_replaced_before_it_reaches_the_caller() -> None:
    data = (SSE / "chat_nul.sse").read_bytes()
    _, found = streamed(data)
    assert "\x00" not in _texts(found) and "\ufffd" in _texts(found)


def test_bounds_of_the_chat_stream_hold_under_the_dialect() -> None:
    small = StreamBounds(Framing(max_line_bytes=256, max_event_bytes=256))
    dialect = MessagesDialect(_plan(), small, collect=False)
    out, done = run(dialect, _stream_of(chunk("x" * 400), chunk("", "stop", usage())))
    assert not done
    [(name, body)] = frames(b"".join(out))
    assert name == "error" and body["error"]["code"] == "upstream_protocol_error"
