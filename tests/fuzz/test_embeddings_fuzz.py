"""Fuzz the embeddings answer reader against the plain checks on a parsed answer.

Property (spec §14): for any worker bytes, in any split, the dialect either
serves exactly the answer the plain checks accept (``orjson.loads`` whole, then
:func:`tests.apis.embeddings.test_answers.reference`), with the alias in
``model`` and the worker's key order, or refuses it with its own
:class:`GatewayError` (never another exception); it refuses nothing those
checks accept, except what it refuses on purpose: a key repeated in one
object, a key over 256 bytes, or more besides the vectors than its budget.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.errors import GatewayError
from gateway.core.sse import NEED_DATA, Done
from tests.apis.embeddings.test_answers import answer, dialect, reference, with_alias
from tests.fuzz.budget import budget
from tests.fuzz.shapes import mutate, split

pytestmark = pytest.mark.fuzz

_GAPS = [b"", b" ", b"\n", b"\t", b"\r\n  "]


def _spelled(doc: Any, gaps: list[int]) -> bytes:
    """``doc`` as JSON with whitespace drawn from ``gaps`` between tokens."""
    at = [0]

    def gap() -> bytes:
        at[0] += 1
        return _GAPS[gaps[at[0] % len(gaps)] % len(_GAPS)] if gaps else b""

    def out(value: Any) -> bytes:
        if isinstance(value, dict):
            parts = [
                gap() + orjson.dumps(k) + gap() + b":" + gap() + out(v) for k, v in value.items()
            ]
            return b"{" + b",".join(parts) + gap() + b"}"
        if isinstance(value, list):
            return b"[" + b",".join(gap() + out(v) for v in value) + gap() + b"]"
        return orjson.dumps(value)

    return gap() + out(doc) + gap()


_EDITS = st.lists(
    st.tuples(
        st.integers(0, 10_000),
        st.sampled_from("dirc"),
        st.sampled_from(
            [
                b"",
                b",",
                b"]",
                b"[",
                b"{",
                b"}",
                b'"',
                b"\\",
                b"0",
                b"-",
                b"e9",
                b"1e999",
                b"null",
                b'"x":1',
                b",{}",
                b"true",
                b"\xff",
                b" ",
                b'"index":',
                b"AAAA",
            ]
        ),
    ),
    max_size=3,
)


def _pairs(doc: bytes) -> tuple[bool, int]:
    """Whether some object repeats a key, and the longest key (UTF-8 bytes)."""
    repeated, longest = False, 0

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal repeated, longest
        keys = [k for k, _ in pairs]
        repeated |= len(set(keys)) != len(keys)
        longest = max([longest, *(len(json.dumps(k).encode()) for k in keys)])
        return dict(pairs)

    json.loads(doc, object_pairs_hook=hook)
    return repeated, longest


def _served(inputs: int, b64: bool, pieces: list[bytes]) -> bytes | GatewayError:
    d = dialect(inputs, b64=b64)
    source = d.source
    try:
        for piece in pieces:
            source.receive_data(piece)
            assert source.next_event() is NEED_DATA
        source.receive_data(b"")
        while not isinstance(event := source.next_event(), Done):
            d.on_item(event)
    except GatewayError as exc:
        assert exc.code == "upstream_protocol_error"
        return exc
    return orjson.dumps(d.answer({}))


@budget(300)
@given(
    inputs=st.integers(1, 3),
    dims=st.integers(1, 4),
    b64=st.booleans(),
    extra=st.sampled_from([{}, {"id": "e-1"}, {"meta": {"a": [1, "b", None]}}]),
    order=st.permutations(["object", "data", "model", "usage"]),
    gaps=st.lists(st.integers(0, 9), max_size=12),
    edits=_EDITS,
    sizes=st.lists(st.integers(1, 64), max_size=8),
)
def test_the_reader_agrees_with_the_plain_checks(
    inputs: int,
    dims: int,
    b64: bool,
    extra: dict[str, Any],
    order: list[str],
    gaps: list[int],
    edits: list[tuple[int, str, bytes]],
    sizes: list[int],
) -> None:
    base = answer(inputs, dims, b64=b64)
    doc = {key: base[key] for key in order} | extra
    raw = mutate(_spelled(doc, gaps), edits)
    got = _served(inputs, b64, split(raw, sizes))
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        assert isinstance(got, GatewayError), raw
        return
    accepted = reference(parsed, inputs, b64=b64)
    if isinstance(got, GatewayError):
        repeated, longest = _pairs(raw)
        assert not accepted or repeated or longest > 256, (raw, got)
        return
    assert accepted, raw
    assert orjson.loads(got) == with_alias(parsed)
    assert list(orjson.loads(got)) == list(with_alias(parsed))
