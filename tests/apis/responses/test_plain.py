"""Plain text deltas: a Responses stream's common event checked and re-framed
on its bytes (``gateway/apis/responses/events.py``), as chat's plain chunks are.

After a text delta checked in full, a later one that is its JSON with the
next sequence number and a text needing no escape is validated on that text
alone, and its caller frame is the learned frame with the number and the
text spliced in. The properties: every frame, the report and the answer are
the full path's, whatever the texts; the path is taken for plain texts; a
worker whose JSON is not orjson's is checked in full; an event unlike the
learned one is checked in full (and refused where the full path refuses).
"""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.apis.base import Plan, StreamBounds
from gateway.apis.responses.events import ResponseEvent, ResponsesDialect, delta_parts
from gateway.core.errors import GatewayError
from gateway.core.sse import Done
from tests.support.sse import named, response_bytes, response_stream

TEXTS = st.text(
    alphabet=st.sampled_from(
        ['a', ' ', 'é', '日', '🙂', '"', '\\', '\x00', '\n', '\u2028', '\x7f', '\x85', '\ufeff']
    ),
    max_size=6,
)  # fmt: skip


#: the gateway's own ids (the response's, its items'), new for every dialect
_GATEWAY_ID = re.compile(rb"(resp|msg|fc|call|rs)_[0-9a-f]{24}")


def _plan(stream: bool = True) -> Plan:
    return Plan("responses", "alias-x", {}, stream, True, 4096, 10, "n")


def _stream(deltas: list[str], item_id: bool = False) -> list[tuple[str, dict[str, Any]]]:
    events = response_stream(
        deltas, usage={"input_tokens": 9, "output_tokens": 1, "total_tokens": 10}
    )
    if item_id:
        for name, obj in events:
            if name == "response.output_text.delta":
                obj["item_id"] = "msg_1"
    return events


def _run(
    data: bytes, *, collect: bool = False, learn: bool = True
) -> tuple[ResponsesDialect, list[bytes], list[ResponseEvent]]:
    dialect = ResponsesDialect(_plan(not collect), StreamBounds(), collect=collect)
    if not learn:
        dialect.validator.grammar._learn_left = 0
    source = dialect.source
    source.receive_data(data)
    source.receive_data(b"")
    frames: list[bytes] = []
    events: list[ResponseEvent] = []
    while not isinstance(event := source.next_event(), Done):
        if isinstance(event, ResponseEvent):
            events.append(event)
            frame = dialect.on_item(event)
            if frame is not None:
                frames.append(frame)
    return dialect, frames, events


def _report(dialect: ResponsesDialect) -> tuple[Any, ...]:
    r = dialect.report()
    return (r.outcome, r.finish_reason, r.counts, r.output_estimate, r.nul_replaced)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(deltas=st.lists(TEXTS, min_size=1, max_size=12), item_id=st.booleans())
def test_every_frame_is_the_full_paths_frame(deltas: list[str], item_id: bool) -> None:
    data = response_bytes(_stream(deltas, item_id))
    fast, frames, _ = _run(data)
    full, expected, _ = _run(data, learn=False)
    # The gateway's ids are new per dialect: compared as placeholders.
    assert [_GATEWAY_ID.sub(b"ID", f) for f in frames] == [
        _GATEWAY_ID.sub(b"ID", f) for f in expected
    ]
    assert _report(fast) == _report(full)
    collected, _, _ = _run(data, collect=True)
    whole, _, _ = _run(data, collect=True, learn=False)
    usage = {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}
    answer, other = collected.answer(usage), whole.answer(usage)
    assert _GATEWAY_ID.sub(b"ID", orjson.dumps(answer)) == _GATEWAY_ID.sub(
        b"ID", orjson.dumps(other)
    )
    assert _report(collected) == _report(whole)


def test_plain_texts_take_the_plain_path() -> None:
    deltas = ["Hello", " world", ", again", " and", " again"]
    dialect, frames, events = _run(response_bytes(_stream(deltas, item_id=True)))
    texts = [e for e in events if e.name == "response.output_text.delta"]
    # The first is checked in full and taught the template; the rest are plain.
    assert [e.plain for e in texts] == [False, True, True, True, True]
    assert texts[0].learned and not any(e.learned for e in texts[1:])
    sent = [orjson.loads(f.split(b"data: ", 1)[1]) for f in frames if b"text.delta" in f]
    assert [d["delta"] for d in sent] == deltas
    assert len({d["item_id"] for d in sent}) == 1 and sent[0]["item_id"] != "msg_1"
    assert [d["sequence_number"] for d in sent] == list(range(4, 4 + len(deltas)))
    # Its data is the event the full path would have given, parsed on demand.
    assert texts[2].data["delta"] == ", again" and texts[2].data["sequence_number"] == 6
    assert dialect.validator.grammar.text.bytes == len("".join(deltas))


def test_a_worker_writing_other_json_is_checked_in_full() -> None:
    spaced = b"".join(
        named(name, orjson.dumps(obj).replace(b'":', b'": '))
        for name, obj in _stream(["a", "b", "c"])
    )
    _, frames, events = _run(spaced + b"data: [DONE]\n\n")
    assert not any(e.plain or e.learned for e in events)
    assert len(frames) == len(_stream(["a", "b", "c"]))


def test_a_delta_out_of_order_after_learning_is_refused() -> None:
    events = _stream(["a", "b", "c"])
    events[6][1]["sequence_number"] += 1  # the third delta skips a number
    with pytest.raises(GatewayError) as refused:
        _run(response_bytes(events))
    assert refused.value.code == "upstream_protocol_error"


def test_a_delta_unlike_the_learned_one_is_checked_in_full() -> None:
    events = _stream(["a", "b", "c"])
    events[6][1]["content_index"] = 1  # another part: not the learned event
    _, _, seen = _run(response_bytes(events))
    deltas = [e for e in seen if e.name == "response.output_text.delta"]
    assert [e.plain for e in deltas] == [False, True, False]
    assert deltas[2].data["content_index"] == 1


def test_delta_parts_cut_at_the_number_and_the_text() -> None:
    obj = {"type": "response.output_text.delta", "sequence_number": 4, "delta": "x", "k": [1]}
    parts = delta_parts(obj)
    assert parts is not None
    head, mid, tail = parts
    assert (
        head + "9" + mid + "hé" + tail
        == orjson.dumps({**obj, "sequence_number": 9, "delta": "hé"}).decode()
    )
    # The text before the number: no cut (the grammar checks the number first).
    assert delta_parts({"delta": "x", "sequence_number": 1}) is None


def test_showing_a_plain_delta_does_not_parse_it() -> None:
    _, _, events = _run(response_bytes(_stream(["a", "b"])))
    plain = events[5]
    assert plain.plain and "<plain" in repr(plain)
    assert plain.plain  # a repr (a log line, an assertion) keeps its spliced frame
