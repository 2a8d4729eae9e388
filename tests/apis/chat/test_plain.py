"""Plain chunks (apis/chat/plain.py): checked and framed on their text alone.

The property that matters: whatever the texts, every frame is byte for byte
``data: `` + ``orjson.dumps`` of the worker's chunk edited as the dialect
edits it (the gateway's id, the alias, usage as asked) -- the frame the full
path makes -- and the fast path is really taken for plain texts.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.apis.base import Plan, StreamBounds
from gateway.apis.chat.dialect import ChunkDialect
from gateway.apis.chat.grammar import Chunk, SSEValidator, StreamRules
from gateway.apis.chat.plain import plain_text, text_parts, with_text
from gateway.core.errors import GatewayError
from gateway.core.sse import NEED_DATA, Done, KeepAlive
from tests.support.sse import chunk, drain, event, usage

ALIAS = "my-alias"


def _plan(include_usage: bool) -> Plan:
    return Plan("chat.completions", ALIAS, {"messages": []}, True, include_usage, 10_000, 10, "n")


def _completion(text: str, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "cmpl-7",
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
        "created": 1755870000,
        "model": "Qwen/Qwen3-4B",
        "system_fingerprint": "local",
        "object": "text_completion",
    }


def _stream(kind: str, texts: list[str]) -> list[bytes]:
    if kind == "chat":
        body = [event(chunk(t)) for t in texts]
        body.append(event(chunk("", "stop", usage(len(texts), 5))))
    else:
        body = [event(_completion(t)) for t in texts]
        body.append(event(_completion("", "length")))
    return [b":\n\n", *body, b"data: [DONE]\n\n"]


def _expected(kind: str, raw: bytes, dialect: ChunkDialect, include_usage: bool) -> bytes:
    """The full path's frame: the worker's chunk parsed, edited, serialized
    (NUL in text replaced, the route's default ``text_nul``)."""
    data = json.loads(raw[len(b"data: ") :])
    holder = data["choices"][0]["delta"] if kind == "chat" else data["choices"][0]
    field = "content" if kind == "chat" else "text"
    holder[field] = holder[field].replace("\x00", "\ufffd")
    data["id"] = dialect.id
    data["model"] = ALIAS
    if not include_usage or kind == "completion":
        data.pop("usage", None)
    elif data["choices"][0]["finish_reason"] is not None:
        data["usage"] = {
            k: data["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")
        }
    return b"data: " + orjson.dumps(data) + b"\n\n"


def _relay(
    kind: Literal["chat", "completion"], events: list[bytes], include_usage: bool
) -> tuple[ChunkDialect, list[tuple[bool, bytes | None]]]:
    """Every item's (taken plainly, frame), one read per event."""
    dialect = ChunkDialect(kind, _plan(include_usage), StreamBounds(), collect=False)
    out: list[tuple[bool, bytes | None]] = []
    for piece in [*events, b""]:
        dialect.source.receive_data(piece)
        while (item := dialect.source.next_event()) is not NEED_DATA:
            if isinstance(item, Done):
                return dialect, out
            if not isinstance(item, KeepAlive):
                out.append((item.template is not None, dialect.on_item(item)))
    raise AssertionError("the stream did not end")


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(st.text(max_size=12), min_size=1, max_size=12),
    kind=st.sampled_from(["chat", "completion"]),
    include_usage=st.booleans(),
)
def test_every_frame_is_the_full_paths_frame(
    texts: list[str], kind: Literal["chat", "completion"], include_usage: bool
) -> None:
    events = _stream(kind, texts)
    dialect, frames = _relay(kind, events, include_usage)
    items = events[1:-1]
    assert len(frames) == len(items)
    for raw, (_, frame) in zip(items, frames, strict=True):
        assert frame == _expected(kind, raw.rstrip(b"\n"), dialect, include_usage)
    plain = [taken for taken, _ in frames]
    # learned from the first plain text, taken for every later one
    first = next((i for i, t in enumerate(texts) if t and plain_text(t)), None)
    for i, text in enumerate(texts):
        assert plain[i] == (first is not None and i > first and plain_text(text))
    assert plain[-1] is False  # the finish chunk: in full
    scrubbed = [t.replace("\x00", "\ufffd") for t in texts]
    assert dialect.validator.chunks.text.bytes == sum(len(t.encode()) for t in scrubbed)


def test_the_fast_path_is_taken_and_counts_like_the_full_one() -> None:
    texts = [" the", " 日本", " 🙂", "é", "x" * 50]
    dialect, frames = _relay("chat", _stream("chat", texts), False)
    assert [taken for taken, _ in frames] == [False, True, True, True, True, False]
    grammar = dialect.validator.chunks
    assert grammar.text.bytes == sum(len(t.encode()) for t in texts)
    assert dialect.content_chunks == len(texts)


def test_a_chunk_whose_data_was_read_is_framed_from_its_data() -> None:
    validator = SSEValidator(StreamRules("chat"))
    items, error = drain(validator, _stream("chat", ["a", "b"]))
    assert error is None
    plain = items[2]
    assert isinstance(plain, Chunk) and plain.template is not None
    assert "<plain" in repr(plain)  # repr does not parse it
    assert plain.template is not None
    plain.data["choices"][0]["delta"]["content"] = "edited"
    assert plain.template is None  # read: the splice no longer holds
    assert plain.data["id"] == "7"


def test_texts_a_writer_escapes_take_the_full_path() -> None:
    for text in ['say "hi"', "back\\slash", "line\n", "tab\t", "nul\x00", "\x1f"]:
        assert not plain_text(text), text
    # not escaped by a writer, but left to the full path all the same
    for text in ["del\x7f", "\u2028"]:
        assert not plain_text(text), text
    # what orjson writes as itself, as the splice does
    for text in ["", " plain", "日本 🙂", "é/<>&"]:
        assert plain_text(text), text
        assert orjson.dumps(text) == b'"' + text.encode() + b'"'


@pytest.mark.parametrize("chat", [True, False])
def test_text_parts_cut_the_json_around_the_text(chat: bool) -> None:
    obj = chunk("x") if chat else _completion("x")
    head, tail = text_parts(obj, chat) or ("", "")
    for text in ["", "abc", "日本"]:
        assert (head + text + tail).encode() == orjson.dumps(with_text(obj, chat, text))
    assert obj == (chunk("x") if chat else _completion("x"))  # not changed
    # an empty string before the text's place does not fool it
    tricky = {**obj, "id": ""}
    head, tail = text_parts(tricky, chat) or ("", "")
    assert (head + "q" + tail).encode() == orjson.dumps(with_text(tricky, chat, "q"))
    assert text_parts({**obj, "created": 1 << 70}, chat) is None  # orjson cannot write it


def test_a_worker_writing_other_json_is_checked_in_full() -> None:
    # spaces after the separators: never orjson's bytes, so nothing is learned
    spaced = [b"data: " + json.dumps(chunk(t)).encode() + b"\n\n" for t in ["a", "b", "c"]]
    dialect, frames = _relay(
        "chat", [*spaced, event(chunk("", "stop", usage(3, 5))), b"data: [DONE]\n\n"], False
    )
    assert [taken for taken, _ in frames] == [False] * 4
    assert frames[1][1] == _expected("chat", event(chunk("b")).rstrip(b"\n"), dialect, False)


@pytest.mark.parametrize(
    ("late", "message"),
    [
        (chunk("a", id="8"), "Upstream chunk id changed within the stream."),
        (chunk("a", model="other"), "Upstream chunk model changed within the stream."),
        (chunk("a", created=1), "Upstream chunk created changed within the stream."),
    ],
)
def test_a_chunk_unlike_the_learned_one_is_checked_in_full(
    late: dict[str, Any], message: str
) -> None:
    validator = SSEValidator(StreamRules("chat"))
    items, error = drain(validator, [event(chunk("a")), event(chunk("b")), event(late)])
    assert len(items) == 2 and items[1].template is not None
    assert isinstance(error, GatewayError) and error.message == message


def test_after_the_finish_a_plain_chunk_is_a_violation() -> None:
    validator = SSEValidator(StreamRules("chat"))
    stream = [
        event(chunk("a")),
        event(chunk("b")),
        event(chunk("", "stop", usage())),
        event(chunk("c")),
    ]
    items, error = drain(validator, stream)
    assert len(items) == 3
    assert isinstance(error, GatewayError)
    assert error.message == "Upstream sent a chunk after the finish_reason."


def _items(validator: SSEValidator, events: list[bytes]) -> list[Chunk]:
    """The chunks of events fed without the body's end."""
    found: list[Chunk] = []
    for piece in events:
        validator.receive_data(piece)
        while isinstance(item := validator.next_event(), Chunk):
            found.append(item)
    return found


def test_a_new_turn_forgets_the_learned_chunk() -> None:
    validator = SSEValidator(StreamRules("chat"))
    items = _items(validator, [event(chunk("a")), event(chunk("b"))])
    assert [item.template is not None for item in items] == [False, True]
    validator.chunks.new_turn()
    (turn,) = _items(validator, [event(chunk("c", id="9", created=5))])
    assert turn.template is None and turn.data["id"] == "9"
    # and learns the new turn's
    (again,) = _items(validator, [event(chunk("d", id="9", created=5))])
    assert again.template is not None and again.data["created"] == 5


def test_a_worker_not_writing_orjsons_bytes_is_not_asked_past_four_chunks() -> None:
    validator = SSEValidator(StreamRules("chat"))
    spaced = [b"data: " + json.dumps(chunk(t)).encode() + b"\n\n" for t in "abcdef"]
    _items(validator, spaced)
    assert validator.chunks._learn_left == 0


# -- the fast path against the full path itself ---------------------------------

#: texts a writer escapes, or that only look plain, beside plain ones
ODD_TEXTS = st.sampled_from(
    ["", " a", '"', "\\", "\n", "\x00", "\u2028", "\u2029", "\x7f", "\x85", "\ufeff", "日本", "🙂"]
)
TEXTS = st.one_of(ODD_TEXTS, st.text(max_size=6))


@st.composite
def _chunks(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    """A worker chunk of any shape the full path accepts (and some it does not)."""
    text = draw(TEXTS)
    obj = chunk(text) if kind == "chat" else _completion(text)
    choice = obj["choices"][0]
    shape = draw(
        st.sampled_from(["text", "text", "text", "reasoning", "logprobs", "extra", "identity"])
    )
    if shape == "reasoning" and kind == "chat":
        choice["delta"]["reasoning_content"] = draw(TEXTS)
    elif shape == "logprobs":
        choice["logprobs"] = {"content": [{"token": text, "logprob": -0.5, "bytes": [1]}]}
    elif shape == "extra":
        obj["extra"] = draw(st.sampled_from(["", '""', None, 1.5, [], {"content": ""}]))
    elif shape == "identity":
        key = draw(st.sampled_from(["id", "model", "created"]))
        obj[key] = draw(st.sampled_from(["", "7", '""', 7, 1755870000, None]))
    return obj


def _run(
    kind: Literal["chat", "completion"],
    events: list[bytes],
    *,
    collect: bool,
    include_usage: bool,
    fast: bool,
    taken: list[bool] | None = None,
) -> tuple[list[bytes | None], Any, Any]:
    """The dialect over ``events``: its frames, how it ended (the error, or its
    report and answer) -- with the plain path, or with it never learned
    (``taken`` gets whether each chunk came by the plain path)."""
    plan = _plan(include_usage)
    plan.stream = not collect
    dialect = ChunkDialect(kind, plan, StreamBounds(), collect=collect)
    dialect.id = "chatcmpl-fixed"
    if not fast:
        dialect.validator.chunks._learn_left = 0
    frames: list[bytes | None] = []
    try:
        for piece in [*events, b""]:
            dialect.source.receive_data(piece)
            while (item := dialect.source.next_event()) is not NEED_DATA:
                if isinstance(item, Done):
                    counts = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
                    answer = dialect.answer(counts) if collect else dialect.terminal_frame
                    return frames, dialect.report(), answer
                if not isinstance(item, KeepAlive):
                    if taken is not None:
                        taken.append(item.template is not None)
                    frames.append(dialect.on_item(item))
    except GatewayError as exc:
        return frames, (exc.code, exc.message), dialect.report()
    raise AssertionError("the stream did not end")


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    kind=st.sampled_from(["chat", "completion"]),
    collect=st.booleans(),
    include_usage=st.booleans(),
)
def test_the_plain_path_decides_and_frames_as_the_full_path(
    data: st.DataObject, kind: Literal["chat", "completion"], collect: bool, include_usage: bool
) -> None:
    body = data.draw(st.lists(_chunks(kind), min_size=1, max_size=10))
    last = chunk("", "stop", usage(3, 5)) if kind == "chat" else _completion("", "length")
    events = [event(c) for c in [*body, last]] + [b"data: [DONE]\n\n"]
    fast = _run(kind, events, collect=collect, include_usage=include_usage, fast=True)
    full = _run(kind, events, collect=collect, include_usage=include_usage, fast=False)
    assert fast == full


@pytest.mark.parametrize("collect", [False, True])
def test_the_comparison_above_takes_the_plain_path(collect: bool) -> None:
    body = [chunk(t) for t in ["a", " b", "日本", '"q"', "c"]]
    events = [event(c) for c in [*body, chunk("", "stop", usage(3, 5))]] + [b"data: [DONE]\n\n"]
    taken: list[bool] = []
    fast = _run("chat", events, collect=collect, include_usage=True, fast=True, taken=taken)
    assert taken == [False, True, True, False, True, False]
    assert fast == _run("chat", events, collect=collect, include_usage=True, fast=False)


def test_the_learned_chunks_data_is_its_callers_to_mutate() -> None:
    # ``Chunk.data`` is the caller's to edit; the plain chunk learned from it
    # must not change with it (a shared nested object would change the splice).
    def with_extra(text: str) -> dict[str, Any]:
        return {**chunk(text), "extra": {"k": "v"}}

    dialect = ChunkDialect("chat", _plan(False), StreamBounds(), collect=False)
    dialect.source.receive_data(event(with_extra("a")) + event(with_extra("b")))
    learned, plain = dialect.source.next_event(), dialect.source.next_event()
    assert isinstance(learned, Chunk) and isinstance(plain, Chunk)
    assert plain.template is not None
    learned.data["extra"]["k"] = "edited"
    assert dialect.on_item(plain) == _expected(
        "chat", event(with_extra("b")).rstrip(b"\n"), dialect, False
    )
