"""The Responses named-event grammar and dialect: fixtures replayed whole, byte by
byte and at random splits (the decision never depends on the split)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.apis.base import Plan, StreamBounds
from gateway.apis.responses.events import (
    ResponseEvent,
    ResponsesDialect,
    ResponsesGrammar,
    ResponsesValidator,
)
from gateway.core.errors import GatewayError
from gateway.core.sse import NEED_DATA, Done, Framing, KeepAlive
from tests.support.sse import MODEL, RESPONSE_ID, drain, response_bytes, response_stream

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "sse" / "responses"
EXPECTED: dict[str, dict[str, Any]] = json.loads((FIXTURES / "expected.json").read_text())
NAMES = sorted(EXPECTED)


@dataclass
class Replay:
    validator: ResponsesValidator
    events: list[Any] = field(default_factory=list)
    error: GatewayError | None = None

    @property
    def outcome(self) -> Any:
        if self.error is not None:
            return (self.error.code, self.error.outcome, len(self.events))
        return [type(e).__name__ for e in self.events]

    @property
    def items(self) -> list[ResponseEvent]:
        return [e for e in self.events if isinstance(e, ResponseEvent)]


def validator(rules: dict[str, Any]) -> ResponsesValidator:
    return ResponsesValidator(Framing(), ResponsesGrammar(loads=orjson.loads, **rules))


def replay(data: bytes, rules: dict[str, Any], pieces: Iterable[bytes] | None = None) -> Replay:
    checked = validator(rules)
    events, error = drain(checked, pieces if pieces is not None else [data])
    return Replay(checked, events, error)


def splits(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, max(2, len(data))), min(8, max(0, len(data) - 1))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def test_every_fixture_has_an_expectation_and_a_row() -> None:
    on_disk = {p.name for p in FIXTURES.glob("*.sse")}
    assert on_disk == set(EXPECTED)
    readme = (FIXTURES / "README.md").read_text()
    assert all(f"| `{name}` |" in readme for name in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_fixture_replayed_whole_byte_by_byte_and_split(name: str) -> None:
    expected = EXPECTED[name]
    data = (FIXTURES / name).read_bytes()
    rules = expected["rules"]
    whole = replay(data, rules)
    assert replay(data, rules, [data[i : i + 1] for i in range(len(data))]).outcome == whole.outcome
    for seed in range(5):
        assert replay(data, rules, splits(data, seed)).outcome == whole.outcome
    if expected["result"] == "error":
        assert whole.error is not None
        assert (whole.error.code, whole.error.outcome) == (expected["code"], expected["outcome"])
        assert len(whole.events) == expected["events_before"]
        assert str(whole.error.message) and "wörld" not in whole.error.message
        return
    assert whole.error is None, whole.error
    assert isinstance(whole.events[-1], Done)
    grammar = whole.validator.grammar
    assert (
        "".join(e.text for e in whole.items if e.name == "response.output_text.delta")
        == expected["text"]
    )
    assert grammar.terminal == expected["terminal"]
    assert len(whole.items) == expected["events"]
    assert sum(isinstance(e, KeepAlive) for e in whole.events) == expected["keepalives"]
    assert grammar.usage == expected["usage"]
    assert grammar.response_id == RESPONSE_ID


def _plan(stream: bool = True, max_tokens: int = 64) -> Plan:
    return Plan("responses", "alias-x", {}, stream, True, max_tokens, 10, "n")


def _run(dialect: ResponsesDialect, data: bytes) -> list[bytes]:
    frames = []
    dialect.source.receive_data(data)
    dialect.source.receive_data(b"")
    while not isinstance(event := dialect.source.next_event(), Done):
        if isinstance(event, ResponseEvent):
            frame = dialect.on_item(event)
            if frame is not None:
                frames.append(frame)
    return frames


def test_the_caller_gets_every_event_with_the_alias() -> None:
    data = (FIXTURES / "valid.sse").read_bytes()
    dialect = ResponsesDialect(_plan(), StreamBounds(), collect=False)
    frames = _run(dialect, data)
    names = [f.split(b"\n", 1)[0] for f in frames]
    assert names[0] == b"event: response.created" and names[-1] == b"event: response.completed"
    assert len(frames) == EXPECTED["valid.sse"]["events"]
    payloads = [orjson.loads(f.split(b"data: ", 1)[1]) for f in frames]
    assert all(p["response"]["model"] == "alias-x" for p in payloads if "response" in p)
    assert MODEL.encode() not in b"".join(frames), "the route never reaches the caller"
    report = dialect.report()
    assert (report.outcome, report.finish_reason, report.counts) == ("complete", "stop", (9, 3, 12))
    # The caller sees the gateway's id (spec §21); the worker's goes to the receipt.
    assert report.upstream_id == RESPONSE_ID
    assert report.response_id == dialect.id and dialect.id.startswith("resp_")
    assert RESPONSE_ID.encode() not in b"".join(frames)
    assert {p["response"]["id"] for p in payloads if "response" in p} == {dialect.id}


@pytest.mark.parametrize(
    ("name", "outcome"),
    [
        ("valid.sse", "complete"),
        ("valid_incomplete.sse", "length"),
        ("valid_failed.sse", "upstream_error"),
    ],
)
def test_non_streaming_answer_is_the_terminal_response(name: str, outcome: str) -> None:
    dialect = ResponsesDialect(_plan(stream=False), StreamBounds(), collect=True)
    assert _run(dialect, (FIXTURES / name).read_bytes()) == []
    answer = dialect.answer({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0})
    assert answer["id"] == dialect.id != RESPONSE_ID and answer["object"] == "response"
    assert answer["model"] == "alias-x"
    assert dialect.report().outcome == outcome


def test_non_streaming_text_is_trimmed_like_the_workers() -> None:
    events = response_stream(["\n\n", "  hi ", "\n"])
    dialect = ResponsesDialect(_plan(stream=False), StreamBounds(), collect=True)
    _run(dialect, response_bytes(events))
    answer = dialect.answer({})
    # trim_start only (the worker's finish_or_add_toks_to_seq): trailing whitespace stays.
    assert answer["output_text"] == "hi \n"
    assert answer["output"][0]["content"][0]["text"] == "hi \n"


def test_a_gateway_error_ends_with_one_error_event_numbered_next() -> None:
    dialect = ResponsesDialect(_plan(), StreamBounds(), collect=False)
    # Three events arrived, then the worker went quiet (the gateway's idle timeout).
    dialect.source.receive_data(response_bytes(response_stream(["a"])[:3], done=False))
    while (event := dialect.source.next_event()) is not NEED_DATA:
        assert isinstance(event, ResponseEvent)
        dialect.on_item(event)
    frame = dialect.error_frame(GatewayError("upstream_timeout"))
    name, _, data = frame.partition(b"\ndata: ")
    body = orjson.loads(data)
    assert name == b"event: error"
    assert body == {
        "type": "error",
        "code": "upstream_timeout",
        "message": "The inference worker timed out.",
        "param": None,
        "sequence_number": 3,
    }


def test_nul_in_the_terminal_text_is_scrubbed_but_counted_once() -> None:
    dialect = ResponsesDialect(_plan(stream=False), StreamBounds(), collect=True)
    _run(dialect, (FIXTURES / "nul_delta.sse").read_bytes())
    answer = dialect.answer({})
    assert answer["output_text"] == "a\ufffdb"
    assert dialect.report().nul_replaced == 1


@pytest.mark.parametrize(
    "output",
    [7, True, "text", {"a": 1}, [7, None], [{"type": "message", "content": 3}], [{"content": [5]}]],
    ids=["int", "bool", "str", "object", "scalars", "content_int", "part_int"],
)
def test_an_odd_output_shape_in_the_terminal_response_passes_unread(output: Any) -> None:
    """Found by tests/fuzz/test_response_events_fuzz.py: the NUL scrub and the
    non-streaming answer iterated ``output`` and ``content`` whatever their type,
    so ``"output": 7`` escaped as a TypeError instead of being passed on."""
    events = response_stream(["a\x00"])
    events[-1][1]["response"]["output"] = output
    data = response_bytes(events)
    streamed = ResponsesDialect(_plan(), StreamBounds(), collect=False)
    assert len(_run(streamed, data)) == len(events)
    collected = ResponsesDialect(_plan(stream=False), StreamBounds(), collect=True)
    _run(collected, data)
    answer = collected.answer({})
    assert answer["output"] == output and answer["output_text"] == "a\ufffd"
    assert collected.report().nul_replaced == 1
