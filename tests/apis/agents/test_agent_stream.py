"""Agentic streams under the SSE framing (``fixtures/sse/agents``): the chat
chunk grammar and the agentic machine side by side, each fixture whole, byte
by byte and at random split points, with the relay's decisions."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.apis.agents import (
    AgentEvents,
    AgentStream,
    ApprovalRequired,
    EventLimits,
    FileProduced,
    ToolCalling,
    ToolComplete,
    line_bound,
)
from gateway.apis.chat.grammar import Chunk, ChunkGrammar, StreamRules
from gateway.core.errors import GatewayError
from gateway.core.sse import NEED_DATA, Done, Framing, KeepAlive, StreamValidator
from tests.apis.agents.worker import SESSION

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "sse" / "agents"
EXPECTED: dict[str, dict[str, Any]] = json.loads((FIXTURES / "expected.json").read_text())
NAMES = sorted(EXPECTED)
_KINDS = {
    ToolCalling: "calling",
    ApprovalRequired: "approval",
    FileProduced: "file",
    ToolComplete: "complete",
}


def test_every_fixture_has_an_expectation() -> None:
    assert {p.name for p in FIXTURES.glob("*.sse")} == set(EXPECTED)


def validator(expected: dict[str, Any]) -> tuple[StreamValidator[Any], AgentStream[Chunk]]:
    rules = expected["rules"]
    agent = AgentEvents(
        EventLimits(
            max_tool_rounds=rules["max_tool_rounds"],
            files_max_bytes=8 * 1024 * 1024,
            files_max_count=16,
            session_id=SESSION,
        )
    )
    bound = line_bound(1_048_576, 8 * 1024 * 1024)
    chunks = ChunkGrammar(StreamRules(kind="chat", max_tokens=512))
    stream = AgentStream(chunks, agent, lambda c: c.finish_reason is not None)
    framing = Framing(max_line_bytes=bound, max_event_bytes=bound)
    return StreamValidator(framing, stream), stream


def replay(
    name: str, pieces: list[bytes]
) -> tuple[list[Any], GatewayError | None, AgentStream[Chunk]]:
    """Feed ``pieces`` as the relay would; the items before the end or the error."""
    expected = EXPECTED[name]
    decisions = {int(k): v for k, v in expected["rules"]["decisions"].items()}
    v, stream = validator(expected)
    items: list[Any] = []
    try:
        for piece in [*pieces, b""]:
            v.receive_data(piece)
            while (item := v.next_event()) is not NEED_DATA:
                if isinstance(item, Done):
                    return items, None, stream
                if isinstance(item, KeepAlive):
                    continue
                items.append(item)
                if isinstance(item, ApprovalRequired):
                    stream.agent.on_decision(item.round, decisions[item.round])
    except GatewayError as exc:
        error = stream.eof(exc) if exc.code == "upstream_unavailable" else exc
        return items, error, stream
    raise AssertionError("the stream neither ended nor failed")


def check(name: str, pieces: list[bytes]) -> None:
    expected = EXPECTED[name]
    items, error, stream = replay(name, pieces)
    if expected["result"] == "error":
        assert error is not None, name
        assert (error.code, error.outcome) == (expected["code"], expected["outcome"])
        assert len(items) == expected["items_before"]
        return
    assert error is None, (name, error)
    text = "".join(i.text for i in items if isinstance(i, Chunk))
    assert text == expected["text"]
    assert [_KINDS[type(i)] for i in items if type(i) in _KINDS] == expected["agent"]
    agent = stream.agent
    assert (agent.rounds, agent.files_kept, agent.files_dropped) == (
        expected["rounds"],
        expected["files_kept"],
        expected["files_dropped"],
    )


@pytest.mark.parametrize("name", NAMES)
def test_fixture_whole(name: str) -> None:
    check(name, [(FIXTURES / name).read_bytes()])


@pytest.mark.parametrize("name", NAMES)
def test_fixture_byte_by_byte(name: str) -> None:
    data = (FIXTURES / name).read_bytes()
    check(name, [data[i : i + 1] for i in range(len(data))])


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=25, deadline=None)
@given(draw=st.data())
def test_fixture_at_random_split_points(name: str, draw: st.DataObject) -> None:
    data = (FIXTURES / name).read_bytes()
    cuts = sorted(draw.draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=12)))
    bounds = [0, *cuts, len(data)]
    check(name, [data[a:b] for a, b in itertools.pairwise(bounds)])


def test_the_python_rounds_files_and_approval_in_detail() -> None:
    items, error, _ = replay(
        "agents_python_round.sse", [(FIXTURES / "agents_python_round.sse").read_bytes()]
    )
    assert error is None
    files = [i for i in items if isinstance(i, FileProduced)]
    assert [(f.name, f.data, f.declared_mime) for f in files] == [
        ("result.txt", b"4\n", "text/plain"),
        ("plot.png", b"\x89PNG\r\n\x1a\n" + bytes(8), "image/png"),
    ]
    (ask,) = [i for i in items if isinstance(i, ApprovalRequired)]
    assert ask.arguments_json == b'{"code":"print(2 + 2)"}'
    final = [i for i in items if isinstance(i, Chunk)][-1]
    assert final.finish_reason == "stop" and final.data["session_id"] == SESSION


def test_eof_outside_a_round_stays_the_framings_error() -> None:
    _, stream = validator(EXPECTED["agents_python_round.sse"])
    unavailable = GatewayError("upstream_unavailable", outcome="incomplete")
    assert stream.eof(unavailable) is unavailable
