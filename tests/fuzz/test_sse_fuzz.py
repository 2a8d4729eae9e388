"""Fuzz the SSE validator with small bounds, so that mutations hit them often.

Properties (spec §8, §12): fed any bytes in any split, the validator only
returns events or raises its own :class:`GatewayError` (never another
exception, never a hang: it always decides at EOF), and whenever it waits for
data it holds no more than one line and one event's worth of bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.apis.chat.dialect import SSEValidator, StreamRules
from gateway.core.errors import GatewayError
from gateway.core.sse import NEED_DATA, Done
from tests.fuzz.budget import budget
from tests.fuzz.shapes import mutate, split
from tests.support.sse import chunk, event, usage

pytestmark = pytest.mark.fuzz

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sse"
SEEDS = sorted(p.read_bytes() for p in FIXTURES.glob("*.sse"))
LINE, EVENT = 256, 512
LOADERS: dict[str, Callable[[bytes | str], Any]] = {"json": json.loads, "orjson": orjson.loads}


def _rules(kind: str, loader: str) -> StreamRules:
    return StreamRules(
        kind="chat" if kind == "chat" else "completion",
        max_tokens=64,
        max_line_bytes=LINE,
        max_event_bytes=EVENT,
        max_stream_bytes=16_384,
        max_events=200,
        loads=LOADERS[loader],
    )


def _feed(rules: StreamRules, pieces: list[bytes]) -> str:
    """Run to a decision; 'done' or the error code."""
    validator = SSEValidator(rules)
    try:
        for piece in [*pieces, b""]:
            validator.receive_data(piece)
            while (out := validator.next_event()) is not NEED_DATA:
                if isinstance(out, Done):
                    return "done"
            assert validator.pending_bytes <= LINE + EVENT
    except GatewayError as exc:
        assert 500 <= exc.status < 600
        return exc.code
    raise AssertionError("no decision at EOF")


SIZES = st.lists(st.integers(1, 97), max_size=40)
KIND = st.sampled_from(["chat", "completion"])
LOADER = st.sampled_from(sorted(LOADERS))


@budget(150)
@given(data=st.binary(max_size=2048), sizes=SIZES, kind=KIND, loader=LOADER)
def test_random_bytes(data: bytes, sizes: list[int], kind: str, loader: str) -> None:
    _feed(_rules(kind, loader), split(data, sizes))


@budget(200)
@given(
    seed=st.sampled_from(SEEDS),
    edits=st.lists(
        st.tuples(st.integers(0, 1 << 16), st.sampled_from("dir"), st.binary(max_size=8)),
        min_size=1,
        max_size=6,
    ),
    sizes=SIZES,
    loader=LOADER,
)
def test_mutated_fixtures(
    seed: bytes, edits: list[tuple[int, str, bytes]], sizes: list[int], loader: str
) -> None:
    mutated = mutate(seed, edits)
    rules = _rules("chat", loader)
    # The decision never depends on how the bytes were split.
    assert _feed(rules, split(mutated, sizes)) == _feed(rules, [mutated])


@budget(100)
@given(
    text=st.text(max_size=600),
    lines=st.integers(1, 8),
    tail=st.sampled_from([b"\n\n", b"\r\n\r\n", b"\r\r", b"\n", b""]),
    sizes=SIZES,
)
def test_long_and_multiline_events_stay_bounded(
    text: str, lines: int, tail: bytes, sizes: list[int]
) -> None:
    """Events near and over the line/event bounds, split anywhere."""
    body = event(chunk(text)).rstrip(b"\n")
    data = b"\n".join([body] * lines) + tail + event(chunk("", "stop", usage(1)))
    data += b"data: [DONE]\n\n"
    _feed(_rules("chat", "orjson"), split(data, sizes))
