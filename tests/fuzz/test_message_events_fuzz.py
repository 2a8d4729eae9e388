"""Fuzz the Anthropic Messages stream grammar and dialect (spec §19,
``gateway/apis/messages/events.py``).

Properties:

- **one error sink**: fed mutated captures (``fixtures/sse/messages/*.sse``)
  under the gateway's SSE framing, captures whose events had a JSON value
  swapped, or random sequences of plausible events, ``EventGrammar`` raises
  nothing but :class:`GatewayError` (``upstream_protocol_error``; the
  framing's EOF rule adds ``upstream_unavailable``);
- **never a stream without message_stop**: whatever it accepts (``end()``
  passes, or the framing reaches ``Done``) has ``message_start`` first and
  ``message_stop`` last, once each, ``message_delta`` once right before it
  (pings aside);
- **one decision, whatever the split**: the same events and error fed whole
  or in pieces;
- **the dialect's output is always a valid prefix**: ``MessagesDialect`` fed
  mutated chat captures (``fixtures/sse/chat_*.sse``) only ever sends frames
  the grammar accepts, a complete stream when the worker's was valid, and
  otherwise one ``error`` event after a valid prefix.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.apis.base import Plan, StreamBounds
from gateway.apis.chat.grammar import Chunk
from gateway.apis.messages.events import EventGrammar, MessagesDialect
from gateway.core.errors import GatewayError
from gateway.core.sse import NEED_DATA, Done, Framing
from tests.fuzz.budget import budget
from tests.fuzz.shapes import json_paths, mutate, split
from tests.support.anthropic import frames, validator

pytestmark = pytest.mark.fuzz

SSE = Path(__file__).resolve().parents[2] / "fixtures" / "sse"
SEEDS = {p.name: p.read_bytes() for p in sorted((SSE / "messages").glob("*.sse"))}
VALID = sorted(n for n in SEEDS if not n.startswith("messages_bad_"))
CHAT = {p.name: p.read_bytes() for p in sorted(SSE.glob("chat_*.sse"))}
SMALL = Framing(max_line_bytes=640, max_event_bytes=1280, max_stream_bytes=8192, max_events=48)
CODES = {"upstream_protocol_error", "upstream_unavailable"}

EDITS = st.lists(
    st.tuples(st.integers(0, 1 << 16), st.sampled_from("dirc"), st.binary(max_size=8)),
    min_size=1,
    max_size=6,
)
SIZES = st.lists(st.integers(1, 97), max_size=40)


def assert_well_formed(accepted: list[tuple[str, Any]]) -> None:
    """What the grammar accepted as a whole stream: start first, delta then stop last."""
    names = [name for name, _ in accepted if name != "ping"]
    assert names[0] == "message_start" and names.count("message_start") == 1
    assert names[-2:] == ["message_delta", "message_stop"]
    assert names.count("message_delta") == names.count("message_stop") == 1


def decide(pieces: list[bytes], framing: Framing = SMALL) -> tuple[list[Any], Any]:
    """Framing + grammar over ``pieces`` then EOF: what came out, then how it ended."""
    checked = validator(framing)
    out: list[Any] = []
    try:
        for piece in [*pieces, b""]:
            checked.receive_data(piece)
            while (item := checked.next_event()) is not NEED_DATA:
                if isinstance(item, Done):
                    accepted = [o for o in out if isinstance(o, tuple)]
                    assert_well_formed(accepted)
                    assert checked.grammar.terminated
                    return out, "done"
                out.append(item if isinstance(item, tuple) else "keepalive")
    except GatewayError as exc:
        assert exc.code in CODES, exc.code
        assert exc.status == 502
        return out, (exc.code, exc.outcome, exc.message)
    raise AssertionError("no decision at EOF")


def feed_all(events: list[tuple[str, Any]]) -> bool:
    """Each event to a fresh grammar, then its end: whether it accepted the stream."""
    grammar = EventGrammar()
    try:
        for name, fed in events:
            grammar.feed(name, fed)
        grammar.end()
    except GatewayError as exc:
        assert (exc.code, exc.outcome) == ("upstream_protocol_error", "protocol_error")
        return False
    assert_well_formed(events)
    return True


def _events(data: bytes) -> list[tuple[str, Any]]:
    out = []
    for block in data.split(b"\n\n"):
        name, payload = None, None
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                payload = json.loads(line[6:])
        if name is not None:
            out.append((name, payload))
    return out


# ------------------------------------------------------------------ the grammar


@budget(200)
@given(name=st.sampled_from(sorted(SEEDS)), edits=EDITS, sizes=SIZES)
def test_mutated_captures_decide_alike_and_only_gateway_errors_escape(
    name: str, edits: list[tuple[int, str, bytes]], sizes: list[int]
) -> None:
    mutated = mutate(SEEDS[name], edits)
    whole = decide([mutated])
    assert decide(split(mutated, sizes)) == whole


@budget(100)
@given(name=st.sampled_from(VALID), sizes=SIZES)
def test_valid_captures_are_accepted_split_anywhere(name: str, sizes: list[int]) -> None:
    data = SEEDS[name]
    assert decide([data], Framing())[1] == "done"
    assert decide(split(data, sizes), Framing())[1] == "done"


@budget(100)
@given(name=st.sampled_from(VALID), cut=st.integers(0, 1 << 16))
def test_a_capture_cut_anywhere_before_its_end_is_never_accepted(name: str, cut: int) -> None:
    data = SEEDS[name]
    stop = data.rindex(b"event: message_stop")
    cut_at = cut % (stop + len(b"event: message_stop\ndata: {"))
    _, ended = decide([data[:cut_at]], Framing())
    assert ended != "done"


RETYPED = st.sampled_from([0, 7, -1, 1.5, True, None, "", "x", [], [1], {}, {"a": 1}])
NAMES = st.sampled_from(
    [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
        "agentic_tool_call_progress",
    ]
)


@budget(300)
@given(
    name=st.sampled_from(VALID),
    changes=st.lists(
        st.tuples(st.integers(0, 99), st.integers(0, 999), st.booleans(), RETYPED, NAMES),
        min_size=1,
        max_size=3,
    ),
)
def test_edited_events_never_escape_and_never_lose_message_stop(
    name: str, changes: list[tuple[int, int, bool, Any, str]]
) -> None:
    events = copy.deepcopy(_events(SEEDS[name]))
    for at, where, rename, value, new_name in changes:
        index = at % len(events)
        _, payload = events[index]
        if rename:
            events[index] = (new_name, payload)
            continue
        paths = [p for p in json_paths(payload) if p]
        path = paths[where % len(paths)]
        parent = payload
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = copy.deepcopy(value)
    feed_all(events)


@budget(300)
@given(
    name=st.sampled_from(VALID),
    moves=st.lists(st.tuples(st.sampled_from("dwr"), st.integers(0, 99), st.integers(0, 99))),
)
def test_dropped_duplicated_or_swapped_events_never_lose_message_stop(
    name: str, moves: list[tuple[str, int, int]]
) -> None:
    events = _events(SEEDS[name])
    for op, a, b in moves:
        if not events:
            break
        i, j = a % len(events), b % len(events)
        if op == "d":
            del events[i]
        elif op == "w":
            events.insert(j, copy.deepcopy(events[i]))
        else:
            events[i], events[j] = events[j], events[i]
    accepted = feed_all(events)
    if not any(n == "message_stop" for n, _ in events):
        assert not accepted


@budget(200)
@given(
    events=st.lists(
        st.tuples(
            NAMES,
            st.one_of(
                RETYPED,
                st.fixed_dictionaries(
                    {"type": NAMES},
                    optional={
                        "index": st.integers(-1, 3),
                        "message": st.fixed_dictionaries(
                            {
                                "type": st.sampled_from(["message", "x"]),
                                "role": st.just("assistant"),
                            }
                        ),
                        "content_block": st.fixed_dictionaries(
                            {"type": st.sampled_from(["text", "thinking", "tool_use", "image"])}
                        ),
                        "delta": st.fixed_dictionaries(
                            {
                                "type": st.sampled_from(
                                    ["text_delta", "thinking_delta", "input_json_delta", "x"]
                                )
                            }
                        ),
                        "usage": st.fixed_dictionaries({"output_tokens": RETYPED}),
                    },
                ),
            ),
        ),
        max_size=14,
    )
)
def test_random_event_sequences_only_raise_protocol_errors(events: list[tuple[str, Any]]) -> None:
    feed_all(events)


# ------------------------------------------------------------------ the dialect


def _plan(name: str) -> Plan:
    tools = "tool" in name
    return Plan("messages", "alias-x", {}, True, True, None, 10, "n", tools_requested=tools)


@budget(200)
@given(name=st.sampled_from(sorted(CHAT)), edits=EDITS, mutated=st.booleans())
def test_the_dialect_only_sends_a_valid_prefix_and_one_error(
    name: str, edits: list[tuple[int, str, bytes]], mutated: bool
) -> None:
    data = mutate(CHAT[name], edits) if mutated else CHAT[name]
    dialect = MessagesDialect(_plan(name), StreamBounds(SMALL), collect=False)
    out: list[bytes] = []
    source = dialect.source
    grammar = EventGrammar()
    source.receive_data(data)
    source.receive_data(b"")
    try:
        while not isinstance(item := source.next_event(), Done):
            assert item is not NEED_DATA, "no decision at EOF"
            if isinstance(item, Chunk):
                frame = dialect.on_item(item)
                if frame is not None:
                    out.append(frame)
                    for event_name, payload in frames(frame):
                        grammar.feed(event_name, payload)  # a valid prefix, always
    except GatewayError as exc:
        error = frames(dialect.error_frame(exc))
        assert [n for n, _ in error] == ["error"]
        assert error[0][1]["error"]["type"] == "api_error"
        assert error[0][1]["error"]["code"] == exc.code
        dialect.report()
        return
    for event_name, payload in frames(dialect.terminal_frame):
        grammar.feed(event_name, payload)
    grammar.end()
    dialect.report()
