"""The SSE validator: fixture replays at any split, each rule, each bound."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.apis.base import Plan, StreamBounds
from gateway.apis.chat.dialect import (
    Chunk,
    ChunkDialect,
    SSEValidator,
    StreamRules,
    StreamState,
    answer_logprob,
)
from gateway.core.errors import GatewayError
from gateway.core.sse import NEED_DATA, Done, KeepAlive
from tests.support.sse import MODEL, chunk, drain, event, usage

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "sse"
EXPECTED: dict[str, dict[str, Any]] = json.loads((FIXTURES / "expected.json").read_text())
NAMES = sorted(EXPECTED)
VALID = [name for name in NAMES if EXPECTED[name]["result"] == "ok"]
LOADERS: dict[str, Callable[[bytes | str], Any]] = {"json": json.loads, "orjson": orjson.loads}

PROTOCOL = ("upstream_protocol_error", "protocol_error")
UPSTREAM = ("upstream_error", "upstream_error")
INCOMPLETE = ("upstream_unavailable", "incomplete")


@dataclass
class Replay:
    validator: SSEValidator
    events: list[KeepAlive | Chunk | Done] = field(default_factory=list)
    error: GatewayError | None = None

    @property
    def outcome(self) -> tuple[list[Any], tuple[str, str, str] | None]:
        """What must not depend on split points: events, then the error."""
        described = [repr(event) for event in self.events]
        if self.error is None:
            return described, None
        return described, (self.error.code, self.error.outcome, self.error.message)

    @property
    def kind(self) -> tuple[str, str] | None:
        return None if self.error is None else (self.error.code, self.error.outcome)

    @property
    def chunks(self) -> list[Chunk]:
        return [event for event in self.events if isinstance(event, Chunk)]


def cut(data: bytes, points: Iterable[int]) -> list[bytes]:
    bounds = [0, *sorted(set(points)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def replay(data: bytes, rules: StreamRules, pieces: Iterable[bytes] | None = None) -> Replay:
    """Feed the pieces then EOF, draining events after every feed."""
    validator = SSEValidator(rules)
    events, error = drain(validator, pieces if pieces is not None else [data])
    return Replay(validator, events, error)


def byte_by_byte(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def assert_split_invariant(data: bytes, rules: StreamRules) -> Replay:
    whole = replay(data, rules)
    assert replay(data, rules, byte_by_byte(data)).outcome == whole.outcome
    for step in (2, 3, 7, 64):
        assert replay(data, rules, cut(data, range(step, len(data), step))).outcome == whole.outcome
    return whole


def rules_for(name: str, loads: Callable[[bytes | str], Any] = json.loads) -> StreamRules:
    return StreamRules(**EXPECTED[name]["rules"], loads=loads)


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def stream(*middle: Any, end: bytes = b"data: [DONE]\n\n") -> bytes:
    """A chat stream: the given chunks, a valid terminal chunk, [DONE]."""
    return b"".join(event(obj) for obj in middle) + event(chunk("", "stop", usage())) + end


CHAT = StreamRules("chat")


# -- fixtures -----------------------------------------------------------------


def test_every_fixture_has_an_expectation() -> None:
    on_disk = {path.name for path in FIXTURES.glob("*.sse")}
    assert on_disk == set(EXPECTED)
    assert {"chat_valid.sse", "chat_valid_crlf.sse", "completion_valid.sse"} <= on_disk
    readme = (FIXTURES / "README.md").read_text()
    assert all(f"| `{name}` |" in readme for name in NAMES)


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("name", NAMES)
def test_fixture_replayed_whole_and_byte_by_byte(name: str, loader: str) -> None:
    expected = EXPECTED[name]
    data = fixture(name)
    rules = rules_for(name, LOADERS[loader])
    whole = replay(data, rules)
    assert replay(data, rules, byte_by_byte(data)).outcome == whole.outcome
    validator = whole.validator
    assert validator.bytes_received == len(data)
    if expected["result"] == "error":
        assert whole.kind == (expected["code"], expected["outcome"])
        assert len(whole.events) == expected["events_before"]
        assert validator.state is StreamState.ERROR
        return
    assert whole.error is None
    assert isinstance(whole.events[-1], Done)
    assert "".join(c.text for c in whole.chunks) == expected["text"]
    assert len(whole.chunks) == expected["chunks"]
    assert sum(isinstance(e, KeepAlive) for e in whole.events) == expected["keepalives"]
    assert validator.finish_reason == expected["finish_reason"]
    assert validator.usage == expected["usage"]
    assert validator.state is StreamState.CLOSED
    assert validator.events == expected["keepalives"] + expected["chunks"] + 1
    assert validator.model == MODEL
    assert isinstance(validator.chunk_id, str)
    assert validator.created == 1755870000


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(NAMES), draw=st.data())
def test_fixture_at_random_split_points(name: str, draw: st.DataObject) -> None:
    data = fixture(name)
    rules = rules_for(name, orjson.loads)
    points = draw.draw(st.lists(st.integers(0, len(data)), max_size=24))
    assert replay(data, rules, cut(data, points)).outcome == replay(data, rules).outcome


def test_worker_stream_passes_unknown_fields_untouched() -> None:
    result = replay(fixture("chat_extra_fields.sse"), rules_for("chat_extra_fields.sse"))
    first, _, last = result.chunks
    assert first.data["session_id"] == "s-1"
    assert first.data["choices"][0]["logprobs"]["top_logprobs"][0]["token"] == 87
    assert first.data["choices"][0]["delta"]["reasoning_content"] == "thinking…"
    assert last.usage is not None
    assert last.usage["prompt_tokens_details"] == {"cached_tokens": 3}
    assert "stop_sequence" in last.data["choices"][0]
    # reasoning counts toward the text bound but is not the chunk's text
    assert result.validator.text_bytes == len("thinking…abcd".encode())


def test_tool_call_chunk_is_delivered() -> None:
    result = replay(fixture("chat_tool_calls.sse"), rules_for("chat_tool_calls.sse"))
    final = result.chunks[-1]
    assert final.finish_reason == "tool_calls"
    assert final.data["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "get_weather"


# -- framing --------------------------------------------------------------------


def test_cr_ending_one_feed_and_lf_starting_the_next_make_one_line_end() -> None:
    data = stream(chunk("a")).replace(b"\n", b"\r\n")
    pieces = cut(data, [i + 1 for i, byte in enumerate(data) if byte == 0x0D])
    assert len(pieces) > 4
    assert all(p.startswith(b"\n") for p in pieces[1:])
    result = replay(data, CHAT, pieces)
    assert result.error is None
    assert [c.text for c in result.chunks] == ["a", ""]


def test_utf8_split_inside_a_character_is_reassembled() -> None:
    data = stream(chunk("🙂é"))
    emoji = data.index("🙂".encode())
    result = replay(data, CHAT, cut(data, [emoji + 1, emoji + 2, emoji + 3, emoji + 5]))
    assert result.chunks[0].text == "🙂é"


def test_comment_only_events_are_keepalives() -> None:
    data = b":\n\n: ping\n\n" + stream(chunk("a"), end=b":\n\ndata: [DONE]\n\n")
    kinds = [type(e).__name__ for e in assert_split_invariant(data, CHAT).events]
    assert kinds == ["KeepAlive", "KeepAlive", "Chunk", "Chunk", "KeepAlive", "Done"]


def test_stray_blank_lines_are_not_events() -> None:
    result = assert_split_invariant(b"\n\n\n" + stream(chunk("a")), CHAT)
    assert result.validator.events == 3


def test_empty_event_name_is_the_default_event() -> None:
    data = b"event:\n" + event(chunk("a")) + stream()
    assert replay(data, CHAT).error is None


def test_bom_is_stripped_only_at_the_start() -> None:
    stripped = replay(b"\xef\xbb\xbf" + stream(chunk("a")), CHAT)
    assert stripped.error is None
    # Not merely ignored as an unknown line: the first event is there.
    assert [c.text for c in stripped.chunks] == ["a", ""]
    # elsewhere it is part of a field name, which makes the line unknown
    data = event(chunk("a")) + b"\xef\xbb\xbfdata: x\n\n" + stream()
    assert replay(data, CHAT).error is None


# -- classification -------------------------------------------------------------


def test_error_is_sticky_and_the_same_object() -> None:
    validator = SSEValidator(CHAT)
    validator.receive_data(b"event: x\ndata: {}\n\n")
    with pytest.raises(GatewayError) as first:
        validator.next_event()
    validator.receive_data(stream(chunk("a")))  # ignored once failed
    validator.receive_data(b"")
    for _ in range(2):
        with pytest.raises(GatewayError) as again:
            validator.next_event()
        assert again.value is first.value
    assert validator.state is StreamState.ERROR


@pytest.mark.parametrize(
    "name",
    ["bad_error_event_raw.sse", "bad_error_event_json.sse", "bad_invalid_json.sse", "bad_nul.sse"],
)
def test_messages_never_carry_stream_content(name: str) -> None:
    result = replay(fixture(name), rules_for(name))
    assert result.error is not None
    text = str(result.error) + result.error.message
    for needle in ("Prompt", "truncate_sequence", "server_error", '"id"', "a\x00b"):
        assert needle not in text
    # the decoder's exception holds the document; it must not ride along
    assert result.error.__cause__ is None
    assert result.error.__suppress_context__ or result.error.__context__ is None


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b":\n\n",
        b"data: {",
        event(chunk("a")),
        event(chunk("a")) + b"data: x\n",
        stream(chunk("a"), end=b"data: [DONE]"),
        stream(chunk("a"), end=b"data: [DONE]\r"),
    ],
)
def test_eof_before_done_is_incomplete(data: bytes) -> None:
    result = assert_split_invariant(data, CHAT)
    assert result.kind == INCOMPLETE
    assert result.validator.state is StreamState.ERROR


def test_canceled_keeps_sound_usage_for_the_receipt() -> None:
    result = replay(event(chunk("a")) + event(chunk("", "canceled", usage(5, 7))), CHAT)
    assert result.kind == ("upstream_error", "canceled")
    assert result.validator.usage == usage(5, 7)
    assert result.validator.finish_reason == "canceled"


def test_canceled_wins_over_unsound_usage() -> None:
    bad_usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 5}
    for use in (bad_usage, None):
        result = replay(event(chunk("", "canceled", use)), CHAT)
        assert result.kind == ("upstream_error", "canceled")
        assert result.validator.usage is None


@pytest.mark.parametrize(
    ("payload", "kind"),
    [
        (b"Internal error: model crashed", UPSTREAM),
        (b"   ", UPSTREAM),
        (b'{"error": {"message": "boom", "type": "server_error"}}', UPSTREAM),
        (b'{"error": "text"}', UPSTREAM),
        (b"", PROTOCOL),
        (b' {"id": "7", ', PROTOCOL),
        (b"[1, ", PROTOCOL),
        (b"null", PROTOCOL),
        (b'"a string"', PROTOCOL),
        (b"42", PROTOCOL),
        (b'{"error": null}', PROTOCOL),
    ],
)
def test_payload_classification(payload: bytes, kind: tuple[str, str]) -> None:
    for loads in LOADERS.values():
        rules = StreamRules("chat", loads=loads)
        assert replay(event(chunk("a")) + b"data: " + payload + b"\n\n", rules).kind == kind


def test_deeply_nested_json_is_a_violation_with_either_loader() -> None:
    data = b"data: " + b"[" * 100_000 + b"\n\n"
    for loads in LOADERS.values():
        assert replay(data, StreamRules("chat", loads=loads)).kind == PROTOCOL


def test_lone_surrogate_text_is_a_violation() -> None:
    data = event(
        b'{"id":"7","choices":[{"index":0,"delta":{"content":"\\ud800"}}],'
        b'"created":1,"model":"m","object":"chat.completion.chunk"}'
    )
    for loads in LOADERS.values():
        assert replay(data, StreamRules("chat", loads=loads)).kind == PROTOCOL


# -- chunk rules ------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        chunk(id=7),
        chunk(id=None),
        chunk(created="1755870000"),
        chunk(created=True),
        chunk(created=1755870000.0),
        chunk(model=None),
        chunk(object=None),
        chunk(choices={"0": {}}),
        chunk(choices=["x"]),
        chunk(choices=[{"index": "0", "delta": {}}]),
        chunk(choices=[{"index": False, "delta": {}}]),
        chunk(choices=[{"index": 0}]),
        chunk(choices=[{"index": 0, "delta": "x"}]),
        chunk(usage=[1]),
        chunk(content=7),
        chunk(content={"x": 1}),
        chunk(finish=7),
        chunk(finish=""),
        chunk(choices=[{"index": 0, "delta": {"content": "x", "reasoning_content": 1}}]),
        chunk(choices=[{"index": 0, "delta": {"role": "system"}}]),
    ],
)
def test_malformed_chunk_is_a_protocol_error(bad: dict[str, Any]) -> None:
    result = assert_split_invariant(stream(chunk("a"), bad), CHAT)
    assert result.kind == PROTOCOL
    assert len(result.events) == 1


@pytest.mark.parametrize("key", ["content", "reasoning_content"])
def test_nul_in_text_follows_text_nul(key: str) -> None:
    delta = {"content": "", "role": "assistant", key: "a\x00b\x00"}
    data = stream(chunk(choices=[{"index": 0, "delta": delta}]))
    assert replay(data, StreamRules("chat", text_nul="reject")).kind == PROTOCOL
    passed = replay(data, StreamRules("chat", text_nul="pass"))
    assert passed.error is None
    replaced = replay(data, StreamRules("chat"))
    assert replaced.error is None
    first = replaced.events[0]
    assert isinstance(first, Chunk)
    assert first.data["choices"][0]["delta"][key] == "a\ufffdb\ufffd", "the caller's chunk"
    validator = SSEValidator(StreamRules("chat"))
    validator.receive_data(data)
    while validator.next_event() is not NEED_DATA:
        pass
    assert validator.nul_replaced == 2


def test_identity_must_hold_from_the_first_chunk() -> None:
    assert replay(stream(chunk(id=7)), CHAT).kind == PROTOCOL


def test_role_may_be_absent_or_null() -> None:
    for delta in ({"content": "a"}, {"content": "a", "role": None}):
        bare = chunk(choices=[{"index": 0, "delta": delta}])
        assert replay(stream(bare), CHAT).error is None


def test_usage_only_chunk_must_follow_a_finish_without_usage() -> None:
    usage_only = chunk(choices=[], usage=usage())
    assert replay(stream(chunk("a"), usage_only), CHAT).kind == PROTOCOL
    after_usage = event(chunk("", "stop", usage())) + event(usage_only) + b"data: [DONE]\n\n"
    assert replay(after_usage, CHAT).kind == PROTOCOL
    empty = event(chunk("", "stop")) + event(chunk(choices=[])) + b"data: [DONE]\n\n"
    assert replay(empty, CHAT).kind == PROTOCOL


def test_usage_only_chunk_is_checked() -> None:
    bad = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 3}
    data = event(chunk("", "stop")) + event(chunk(choices=[], usage=bad)) + b"data: [DONE]\n\n"
    assert replay(data, CHAT).kind == PROTOCOL


@pytest.mark.parametrize(
    "use",
    [
        {"prompt_tokens": 1, "completion_tokens": 2},
        {"prompt_tokens": 1, "completion_tokens": True, "total_tokens": 2},
        {"prompt_tokens": -1, "completion_tokens": 2, "total_tokens": 1},
        {"prompt_tokens": "1", "completion_tokens": 2, "total_tokens": 3},
    ],
)
def test_usage_counts_are_non_negative_ints(use: dict[str, Any]) -> None:
    assert replay(event(chunk("", "stop", use)) + b"data: [DONE]\n\n", CHAT).kind == PROTOCOL


def test_max_tokens_is_inclusive() -> None:
    data = event(chunk("", "stop", usage(completion=4))) + b"data: [DONE]\n\n"
    assert replay(data, StreamRules("chat", max_tokens=4)).error is None
    assert replay(data, StreamRules("chat", max_tokens=3)).kind == PROTOCOL


def test_tool_calls_finish_needs_tools_requested() -> None:
    data = event(chunk(None, "tool_calls", usage())) + b"data: [DONE]\n\n"
    assert replay(data, StreamRules("chat", tools_requested=True)).error is None
    assert replay(data, CHAT).kind == PROTOCOL


def test_completion_stream_accepts_optional_terminal_usage() -> None:
    base = json.loads(fixture("completion_valid.sse").split(b"\n\n")[1][len(b"data: ") :])
    final = dict(base, choices=[dict(base["choices"][0], text="", finish_reason="stop")])
    rules = StreamRules("completion")
    data = event(base) + event(dict(final, usage=usage())) + b"data: [DONE]\n\n"
    assert replay(data, rules).error is None
    assert replay(event(base) + event(final) + b"data: [DONE]\n\n", rules).error is None
    wrong_kind = event(chunk("a")) + b"data: [DONE]\n\n"
    assert replay(wrong_kind, rules).kind == PROTOCOL


def test_caller_may_mutate_chunk_data() -> None:
    validator = SSEValidator(CHAT)
    validator.receive_data(event(chunk("a")))
    first = validator.next_event()
    assert isinstance(first, Chunk)
    first.data["model"] = "alias"
    first.data["id"] = "gw-1"
    validator.receive_data(stream(chunk("b")))
    events = []
    while (e := validator.next_event()) is not NEED_DATA:
        events.append(e)
        if isinstance(e, Chunk) and e.usage is not None:
            del e.data["usage"]
            e.usage.clear()
    validator.receive_data(b"")
    assert isinstance(validator.next_event(), Done)
    assert validator.model == MODEL
    assert validator.chunk_id == "7"
    assert validator.usage == usage()


def test_done_repeats_after_close_and_feeding_after_eof_is_a_bug() -> None:
    validator = SSEValidator(CHAT)
    validator.receive_data(stream(chunk("a")))
    validator.receive_data(b"")
    validator.receive_data(b"")
    events = [validator.next_event() for _ in range(4)]
    assert [type(e).__name__ for e in events] == ["Chunk", "Chunk", "Done", "Done"]
    with pytest.raises(RuntimeError):
        validator.receive_data(b"x")


def test_done_waits_for_eof() -> None:
    validator = SSEValidator(CHAT)
    validator.receive_data(stream(chunk("a")))
    assert isinstance(validator.next_event(), Chunk)
    assert isinstance(validator.next_event(), Chunk)
    assert validator.next_event() is NEED_DATA
    assert validator.state is StreamState.DONE
    assert validator.next_event() is NEED_DATA
    validator.receive_data(b"")
    assert isinstance(validator.next_event(), Done)


def test_states_follow_the_grammar() -> None:
    validator = SSEValidator(CHAT)
    seen = [validator.state]
    for piece in (
        b":\n\n",
        event(chunk("a")),
        event(chunk("", "stop", usage())),
        b"data: [DONE]\n\n",
    ):
        validator.receive_data(piece)
        while validator.next_event() is not NEED_DATA:
            pass
        seen.append(validator.state)
    assert seen == [
        StreamState.START,
        StreamState.START,
        StreamState.STREAMING,
        StreamState.FINISHED,
        StreamState.DONE,
    ]


# -- bounds -------------------------------------------------------------------------


def test_line_bound_fires_while_the_line_is_still_buffering() -> None:
    validator = SSEValidator(StreamRules("chat", max_line_bytes=100))
    validator.receive_data(b"data: " + b"x" * 95)
    with pytest.raises(GatewayError) as caught:
        validator.next_event()
    assert (caught.value.code, caught.value.outcome) == PROTOCOL
    assert "line" in caught.value.message


def test_line_bound_is_inclusive() -> None:
    data = stream(chunk("a"))
    longest = max(len(line) for line in data.split(b"\n"))
    assert assert_split_invariant(data, StreamRules("chat", max_line_bytes=longest)).error is None
    tight = StreamRules("chat", max_line_bytes=longest - 1)
    assert assert_split_invariant(data, tight).kind == PROTOCOL


def test_event_bound_counts_every_line_of_the_event() -> None:
    data = b"data: " + b"x" * 80 + b"\n" + b"data: " + b"y" * 80 + b"\n\n"
    rules = StreamRules("chat", max_line_bytes=100, max_event_bytes=150)
    result = assert_split_invariant(data, rules)
    assert result.error is not None
    assert "event" in result.error.message
    comments = b"".join(b": " + b"z" * 60 + b"\n" for _ in range(3)) + b"\n"
    result = assert_split_invariant(comments, rules)
    assert result.error is not None
    assert "event" in result.error.message


def test_stream_bound_keeps_the_events_before_it() -> None:
    data = fixture("chat_valid.sse")
    exact = StreamRules("chat", max_stream_bytes=len(data))
    assert replay(data, exact).error is None
    short = StreamRules("chat", max_stream_bytes=len(data) - 20)
    result = assert_split_invariant(data, short)
    assert result.kind == PROTOCOL
    assert len(result.events) == 10  # all but the terminal chunk
    assert result.validator.bytes_received == len(data)


def test_stream_bound_after_done() -> None:
    data = stream(chunk("a"))
    result = assert_split_invariant(data + b"\n", StreamRules("chat", max_stream_bytes=len(data)))
    assert result.kind == PROTOCOL
    assert result.error is not None
    assert "size" in result.error.message


def test_event_count_bound_includes_keepalives() -> None:
    data = fixture("chat_valid.sse")
    result = assert_split_invariant(data, StreamRules("chat", max_events=3))
    assert result.kind == PROTOCOL
    assert len(result.events) == 3
    assert replay(data, StreamRules("chat", max_events=12)).error is None
    assert replay(data, StreamRules("chat", max_events=11)).kind == PROTOCOL


def test_text_bound_counts_utf8_bytes() -> None:
    data = fixture("chat_valid.sse")
    # "Héllo" is 6 bytes, "," 1, " wörld" 7
    assert len(assert_split_invariant(data, StreamRules("chat", max_text_bytes=14)).events) == 5
    result = assert_split_invariant(data, StreamRules("chat", max_text_bytes=13))
    assert result.kind == PROTOCOL
    assert len(result.events) == 4


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "embeddings"},
        {"kind": "chat", "max_line_bytes": 0},
        {"kind": "chat", "max_events": -1},
    ],
)
def test_rules_refuse_nonsense(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        StreamRules(**bad)


# Fuzzing (random and mutated bytes, split anywhere, bounded memory): tests/fuzz/test_sse_fuzz.py


# -- the non-streaming answer (ChunkDialect.answer), as the worker writes it ----
# Each rule below was found on the real engine by the lane's fidelity test
# (tests/integration/engine/test_lane_fidelity.py, docs/engine-lane.md).


def _answer(*chunks: dict[str, Any], **body: Any) -> dict[str, Any]:
    """Feed a chat stream (the chunks, then [DONE]) to a collecting dialect; its answer."""
    plan = Plan(
        endpoint="chat.completions",
        alias="alias",
        body={"messages": [], **body},
        stream=False,
        include_usage=False,
        max_tokens=64,
        prompt_bytes=1,
        nonce="n",
    )
    dialect = ChunkDialect("chat", plan, StreamBounds(), collect=True)
    dialect.source.receive_data(b"".join(event(c) for c in chunks) + b"data: [DONE]\n\n")
    dialect.source.receive_data(b"")
    while not isinstance(event_ := dialect.source.next_event(), Done):
        assert event_ is not NEED_DATA
        if isinstance(event_, Chunk):
            assert dialect.on_item(event_) is None
    return dialect.answer(usage())


def _finish(content: str = "", finish: str = "stop", **choice: Any) -> dict[str, Any]:
    final = chunk(content, finish, usage())
    final["choices"][0].update(choice)
    return final


def _content(answer: dict[str, Any]) -> Any:
    return answer["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    ("streamed", "expected"),
    [
        ("\n\n\r x ", "x "),  # leading whitespace trimmed, trailing kept
        ("\r\r\r", ""),  # CR-only
        ("\x1c\x1f x", "\x1c\x1f x"),  # U+001C..1F: whitespace to Python, not to Rust
        ("\x85\xa0\u3000x\u2028", "x\u2028"),  # Unicode White_Space, as Rust's trim_start
        ("\x00 x", "\ufffd x"),  # NUL is no whitespace (and is replaced by default)
    ],
)
def test_the_answer_trims_leading_whitespace_as_rust_does(streamed: str, expected: str) -> None:
    pieces = [chunk(c) for c in streamed]
    assert _content(_answer(*pieces, _finish(finish="length"))) == expected


def test_a_named_stop_sequence_goes_after_the_finish_reason_and_nothing_is_cut() -> None:
    # 0.9.5 streams the text before the stop string and names it.
    answer = _answer(chunk("a\ufffd"), chunk(" b"), _finish(" c", stop_sequence="\ufffd"))
    (choice,) = answer["choices"]
    assert list(choice) == ["finish_reason", "stop_sequence", "index", "message", "logprobs"]
    assert (choice["stop_sequence"], _content(answer)) == ("\ufffd", "a\ufffd b c")
    assert list(answer) == [
        "id", "choices", "created", "model", "system_fingerprint", "object", "usage",
    ]  # fmt: skip


def test_an_unnamed_stop_string_streamed_at_the_end_is_cut() -> None:
    # 0.9.2: the stream carries the stop string and the one token after it.
    answer = _answer(
        chunk("one "), chunk("two "), chunk("EN"), chunk("D"), _finish(" x"), stop="END"
    )
    assert _content(answer) == "one two "
    assert "stop_sequence" not in answer["choices"][0]
    later = _answer(chunk("a"), chunk("ST"), chunk("OP"), _finish(), stop=["zz", "STOP"])
    assert _content(later) == "a"  # the stop string's end in the last two content chunks


def test_a_stop_string_earlier_in_an_eos_answer_stays() -> None:
    # EOS (or a stop token) ended it: the engine did not stop on the requested
    # "\ufffd" (it matches raw bytes, not the U+FFFD of a replaced invalid byte).
    pieces = [chunk("po\ufffd"), chunk(" pode"), chunk(" rika"), chunk(" misor")]
    answer = _answer(*pieces, _finish(""), stop=["\ufffd"])
    assert _content(answer) == "po\ufffd pode rika misor"
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert (
        _content(_answer(*pieces, _finish(finish="length"), stop="po"))
        == "po\ufffd pode rika misor"
    )


def _logprob(token: str, raw: list[int]) -> dict[str, Any]:
    top = [{"token": 7, "logprob": -1.5, "bytes": token}]
    return {"token": token, "logprob": -1.5, "bytes": raw, "top_logprobs": top}


def test_logprobs_bytes_are_the_tokens_utf8_as_the_non_streaming_answer_writes_them() -> None:
    first, second = chunk("\ufffd"), chunk(" r")
    first["choices"][0]["logprobs"] = _logprob("\ufffd", [249])  # a byte-fallback token
    second["choices"][0]["logprobs"] = _logprob(" rika", [32, 114])  # cut by a stop string
    answer = _answer(first, second, _finish(stop_sequence="ika"), logprobs=True, top_logprobs=1)
    assert answer["choices"][0]["logprobs"] == {
        "content": [_logprob("\ufffd", [239, 191, 189]), _logprob(" rika", list(b" rika"))]
    }
    assert answer_logprob({"token": "x", "bytes": None}) == {"token": "x", "bytes": None}


def test_logprobs_asked_for_give_the_object_even_without_entries() -> None:
    # A forced EOS: one chunk, logprobs null; the engine's answer has {"content": [...]}.
    assert _answer(_finish(), logprobs=True)["choices"][0]["logprobs"] == {"content": []}
    assert _answer(_finish())["choices"][0]["logprobs"] is None
