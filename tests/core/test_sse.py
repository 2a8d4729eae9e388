"""The validator's one-read fast path frames exactly as its line-by-line path.

A stream fed whole takes the fast path for each ``data: X`` event (and each
``event: N`` + ``data: X`` one); fed a byte at a time, every event is framed
line by line. Both must give the same events and the same error, bounds
included.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.errors import GatewayError
from gateway.core.sse import NEED_DATA, Done, Framing, KeepAlive, StreamValidator


class _Events:
    """A grammar that keeps what it is given; ``[DONE]`` ends the stream."""

    def __init__(self) -> None:
        self.terminated = False

    def on_event(self, name: str | None, data: str) -> tuple[str | None, str] | None:
        if data == "[DONE]":
            self.terminated = True
            return None
        return (name, data)


def _run(stream: bytes, framing: Framing, piece: int) -> tuple[list[object], str | None]:
    validator = StreamValidator(framing, _Events())
    out: list[object] = []
    try:
        for at in range(0, len(stream), piece):
            validator.receive_data(stream[at : at + piece])
            while (event := validator.next_event()) is not NEED_DATA:
                out.append("keepalive" if isinstance(event, KeepAlive) else event)
        validator.receive_data(b"")
        while (event := validator.next_event()) is not NEED_DATA:
            if isinstance(event, Done):
                out.append("done")
                break
            out.append(event)
    except GatewayError as exc:
        return out, str(exc)
    return out, None


def _same_both_ways(stream: bytes, framing: Framing) -> tuple[list[object], str | None]:
    whole = _run(stream, framing, len(stream) or 1)
    assert _run(stream, framing, 1) == whole
    return whole


def test_named_and_unnamed_events_come_out_alike_whole_or_byte_by_byte() -> None:
    stream = (
        b'event: response.created\ndata: {"a":1}\n\n'
        b"data: plain\n\n"
        b"event: \ndata: unnamed\n\n"
        b"event:  spaced\ndata: x\n\n"
        b":\n\n"
        b"event: two\ndata: a\ndata: b\n\n"
        b"data: [DONE]\n\n"
    )
    events, error = _same_both_ways(stream, Framing())
    assert error is None
    assert events == [
        ("response.created", '{"a":1}'),
        (None, "plain"),
        (None, "unnamed"),
        (" spaced", "x"),
        "keepalive",
        ("two", "a\nb"),
        "done",
    ]


def test_an_event_over_its_bound_fails_at_the_same_place_whichever_path() -> None:
    # Each line is within max_line_bytes; together they pass max_event_bytes.
    framing = Framing(max_line_bytes=40, max_event_bytes=48)
    stream = b"data: ok\n\nevent: " + b"n" * 20 + b"\ndata: " + b"d" * 30 + b"\n\ndata: [DONE]\n\n"
    events, error = _same_both_ways(stream, framing)
    assert events == [(None, "ok")]
    assert error is not None and "event exceeded" in error


def test_a_line_over_its_bound_and_the_event_count_fail_alike() -> None:
    long_line = b"data: " + b"x" * 50 + b"\n\n"
    events, error = _same_both_ways(long_line, Framing(max_line_bytes=40))
    assert events == [] and error is not None and "line exceeded" in error
    many = b"data: a\n\n" * 3 + b"data: [DONE]\n\n"
    events, error = _same_both_ways(many, Framing(max_events=2))
    assert events == [(None, "a"), (None, "a")]
    assert error is not None and "event count" in error


_LINES = st.sampled_from(
    [b"data: x", b"data: [DONE]", b"event: e", b"event: ", b"data:y", b":c", b"id: 1", b"",
     b"data: \xc3\xa9", b"data: \xc3", b"event: \xff"]
)  # fmt: skip
_ENDS = st.sampled_from([b"\n", b"\r\n", b"\r"])


@given(st.lists(st.tuples(_LINES, _ENDS), max_size=12), st.integers(1, 64), st.integers(1, 64))
def test_any_stream_frames_alike_whole_or_byte_by_byte(
    lines: list[tuple[bytes, bytes]], max_line: int, max_event: int
) -> None:
    stream = b"".join(line + end for line, end in lines)
    framing = Framing(max_line_bytes=max_line, max_event_bytes=max_event)
    _same_both_ways(stream, framing)


@pytest.mark.parametrize("cut", [b"event: e\n", b"event: e\ndata: x\n", b"data: x\n"])
def test_an_event_cut_short_waits_for_the_rest(cut: bytes) -> None:
    validator = StreamValidator(Framing(), _Events())
    validator.receive_data(cut)
    assert validator.next_event() is NEED_DATA
    validator.receive_data(b"\n" if cut.endswith(b"x\n") else b"data: x\n\n")
    assert validator.next_event() == (("e" if cut.startswith(b"event") else None), "x")
