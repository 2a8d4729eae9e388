"""The embeddings answer as the dialect reads it (spec §14): held once, bounded by
what the request can produce, scanned rather than parsed whole, and given back
as the worker's bytes with the alias in ``model``.

The reference for every verdict is the check as it was written on a parsed
answer (:func:`reference`); ``tests/fuzz/test_embeddings_fuzz.py`` compares the
two on mutated answers.
"""

from __future__ import annotations

import base64
import gc
import math
import struct
import tracemalloc
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from gateway.apis.base import Plan, StreamBounds
from gateway.apis.embeddings.api import EmbeddingsDialect
from gateway.apis.embeddings.scan import (
    FLOAT_TEXT_BYTES,
    MAX_DIMENSIONS,
    answer_bound,
    vector_bound,
)
from gateway.core.errors import GatewayError
from gateway.core.sse import NEED_DATA, Done, Framing

ALIAS = "embed-model"
ROUTE = "/srv/models/embed"


def plan(inputs: int, *, b64: bool = False) -> Plan:
    body: dict[str, Any] = {"model": ROUTE, "input": [f"text {i}" for i in range(inputs)]}
    if b64:
        body["encoding_format"] = "base64"
    return Plan(
        endpoint="embeddings",
        alias=ALIAS,
        body=body,
        stream=False,
        include_usage=True,
        max_tokens=None,
        prompt_bytes=inputs * 6,
        nonce="0123456789abcdef",
    )


def dialect(
    inputs: int, *, b64: bool = False, max_stream_bytes: int = 1 << 26
) -> EmbeddingsDialect:
    bounds = StreamBounds(framing=Framing(max_stream_bytes=max_stream_bytes))
    return EmbeddingsDialect(plan(inputs, b64=b64), bounds)


def vector(index: int, dims: int) -> list[float]:
    return [((index * 31 + k * 7) % 256 - 128) / 128 for k in range(dims)]


def encoded(values: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


def answer(inputs: int, dims: int = 8, *, b64: bool = False, **top: Any) -> dict[str, Any]:
    """The worker's answer in serde's key order (``top`` adds or replaces fields)."""
    data = [
        {
            "object": "embedding",
            "embedding": encoded(vector(i, dims)) if b64 else vector(i, dims),
            "index": i,
        }
        for i in range(inputs)
    ]
    tokens = 2 * inputs
    doc: dict[str, Any] = {
        "object": "list",
        "data": data,
        "model": ROUTE,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    doc.update(top)
    return doc


def feed(d: EmbeddingsDialect, raw: bytes, piece: int = 65_536) -> list[Any]:
    """The relay's loop over ``raw`` in pieces; the items the dialect was given."""
    items: list[Any] = []
    source = d.source
    for at in range(0, len(raw), piece):
        source.receive_data(raw[at : at + piece])
        assert source.next_event() is NEED_DATA
    source.receive_data(b"")
    while not isinstance(event := source.next_event(), Done):
        d.on_item(event)
        items.append(event)
    return items


def caller_bytes(d: EmbeddingsDialect) -> bytes:
    return orjson.dumps(d.answer({}))


def served(inputs: int, raw: bytes, *, b64: bool = False, piece: int = 65_536) -> bytes:
    d = dialect(inputs, b64=b64)
    feed(d, raw, piece)
    return caller_bytes(d)


def refused(inputs: int, raw: bytes, *, b64: bool = False, piece: int = 65_536) -> GatewayError:
    d = dialect(inputs, b64=b64)
    with pytest.raises(GatewayError) as info:
        feed(d, raw, piece)
    assert (info.value.code, info.value.status) == ("upstream_protocol_error", 502)
    return info.value


def reference(doc: Any, inputs: int, *, b64: bool) -> bool:
    """The checks on a parsed answer (the dialect's rules, spelled out plainly)."""
    if not isinstance(doc, dict) or doc.get("object") != "list":
        return False
    data = doc.get("data")
    if not isinstance(data, list) or len(data) != inputs:
        return False
    width = None
    for index, entry in enumerate(data):
        if not isinstance(entry, dict) or entry.get("object") != "embedding":
            return False
        if type(entry.get("index")) is not int or entry["index"] != index:
            return False
        vec = entry.get("embedding")
        values: Sequence[Any]
        if b64:
            if not isinstance(vec, str):
                return False
            try:
                raw = base64.b64decode(vec, validate=True)
            except ValueError:
                return False
            if not raw or len(raw) % 4:
                return False
            values = struct.unpack(f"<{len(raw) // 4}f", raw)
        else:
            if not isinstance(vec, list) or not vec:
                return False
            values = vec
        for value in values:
            if isinstance(value, bool) or not isinstance(value, int | float):
                return False
            if not math.isfinite(value):
                return False
        if width is not None and len(values) != width:
            return False
        width = len(values)
    usage = doc.get("usage")
    if not isinstance(usage, dict):
        return False
    prompt, total = usage.get("prompt_tokens"), usage.get("total_tokens")
    return type(prompt) is int and type(total) is int and 0 <= prompt == total


def with_alias(doc: dict[str, Any]) -> dict[str, Any]:
    out = dict(doc)
    out["model"] = ALIAS
    return out


# -- what the caller gets ------------------------------------------------------------


def _spaced(doc: Any, gap: bytes = b" \n\t ") -> bytes:
    """JSON with whitespace around every token (still one valid document)."""
    if isinstance(doc, dict):
        parts = [gap + orjson.dumps(k) + gap + b":" + gap + _spaced(v, gap) for k, v in doc.items()]
        return b"{" + b",".join(parts) + gap + b"}"
    if isinstance(doc, list):
        return b"[" + b",".join(gap + _spaced(v, gap) for v in doc) + gap + b"]"
    return orjson.dumps(doc)


SHAPES: dict[str, tuple[int, bool, dict[str, Any]]] = {
    "one": (1, False, answer(1)),
    "several": (5, False, answer(5, 16)),
    "base64": (3, True, answer(3, 16, b64=True)),
    "ints_and_exponents": (
        2,
        False,
        answer(2, 3)
        | {
            "data": [
                {"object": "embedding", "embedding": [0, -1, 2.5e-7], "index": 0},
                {"object": "embedding", "embedding": [1e3, -0.0, 3], "index": 1},
            ]
        },
    ),
    "unknown_fields_kept": (
        2,
        False,
        {
            "id": "emb-1",
            **answer(2),
            "extra": {"nested": [1, "two", {"three": None}]},
        },
    ),
    "usage_first_data_last": (
        2,
        False,
        {
            "usage": {"prompt_tokens": 4, "total_tokens": 4},
            "object": "list",
            "data": answer(2)["data"],
        },
    ),
    "no_model": (1, False, {k: v for k, v in answer(1).items() if k != "model"}),
    "unicode_model": (1, False, answer(1, model='modèle \u2028 "q" \\ end')),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("spacing", ["compact", "spaced", "indented"])
def test_the_caller_gets_the_workers_answer_with_the_alias(name: str, spacing: str) -> None:
    inputs, b64, doc = SHAPES[name]
    raw = {
        "compact": orjson.dumps(doc),
        "spaced": _spaced(doc),
        "indented": orjson.dumps(doc, option=orjson.OPT_INDENT_2),
    }[spacing]
    assert reference(orjson.loads(raw), inputs, b64=b64)
    out = served(inputs, raw, b64=b64)
    expected = with_alias(doc)
    assert orjson.loads(out) == expected
    assert list(orjson.loads(out)) == list(expected)  # the worker's key order
    if spacing == "compact":
        # byte for byte the worker's, but for the model
        assert out == orjson.dumps(expected)


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 64, 1000])
def test_however_the_answer_is_cut_into_reads(piece: int) -> None:
    doc = answer(3, 5)
    assert orjson.loads(served(3, orjson.dumps(doc), piece=piece)) == with_alias(doc)


def test_the_data_array_is_the_workers_bytes() -> None:
    """Numbers keep their spelling (no float round trip)."""
    raw = (
        b'{"object":"list","data":[{"object":"embedding","embedding":[1.50000,1E-3,-0,7],'
        b'"index":0}],"model":"m","usage":{"prompt_tokens":1,"total_tokens":1}}'
    )
    out = served(1, raw)
    assert b'"embedding":[1.50000,1E-3,-0,7]' in out
    assert out.endswith(b'"model":"embed-model","usage":{"prompt_tokens":1,"total_tokens":1}}')


def test_the_answer_is_handed_over_once() -> None:
    d = dialect(1)
    feed(d, orjson.dumps(answer(1)))
    d.answer({})
    with pytest.raises(AssertionError):
        d.answer({})


# -- what is refused -----------------------------------------------------------------

_GOOD = orjson.dumps(answer(1, 4))
_ENTRY = b'{"object":"embedding","embedding":[0.5,0.25],"index":0}'
_USAGE = b'"usage":{"prompt_tokens":1,"total_tokens":1}'


def _one(entry: bytes, *tail: bytes) -> bytes:
    rest = b"".join(b"," + t for t in tail) if tail else b""
    return b'{"object":"list","data":[' + entry + b'],"model":"m",' + _USAGE + rest + b"}"


MALFORMED: dict[str, bytes] = {
    "empty": b"",
    "not_json": b"not json",
    "truncated": _GOOD[:-1],
    "cut_in_a_vector": _GOOD[: _GOOD.index(b"0.") + 3],
    "trailing_garbage": _GOOD + b"x",
    "two_documents": _GOOD + _GOOD,
    "an_array": b"[" + _GOOD + b"]",
    "not_a_list_object": _GOOD.replace(b'"object":"list"', b'"object":"dict"'),
    "data_not_an_array": _GOOD.replace(b'"data":[', b'"data":{"x":[', 1)[:-1] + b"}}",
    "data_null": (b'{"object":"list","data":null,"model":"m",' + _USAGE + b"}"),
    "entry_not_an_object": _one(b"[1]"),
    "entry_without_vector": _one(b'{"object":"embedding","index":0}'),
    "nested_vector": _one(b'{"object":"embedding","embedding":[[0.5],[0.25]],"index":0}'),
    "string_in_vector": _one(b'{"object":"embedding","embedding":[0.5,"]"],"index":0}'),
    "bool_in_vector": _one(b'{"object":"embedding","embedding":[0.5,true],"index":0}'),
    "null_in_vector": _one(b'{"object":"embedding","embedding":[null],"index":0}'),
    "empty_vector": _one(b'{"object":"embedding","embedding":[],"index":0}'),
    "infinite": _one(b'{"object":"embedding","embedding":[1e999],"index":0}'),
    "huge_int": _one(b'{"object":"embedding","embedding":[1' + b"0" * 400 + b'],"index":0}'),
    "bad_number": _one(b'{"object":"embedding","embedding":[1.,2],"index":0}'),
    "double_comma": _one(b'{"object":"embedding","embedding":[1,,2],"index":0}'),
    "vector_is_a_string": _one(b'{"object":"embedding","embedding":"AAAAAA==","index":0}'),
    "wrong_index": _one(_ENTRY.replace(b'"index":0', b'"index":1')),
    "bool_index": _one(_ENTRY.replace(b'"index":0', b'"index":false')),
    "no_usage": b'{"object":"list","data":[' + _ENTRY + b'],"model":"m"}',
    "usage_mismatch": _one(_ENTRY).replace(b'"total_tokens":1', b'"total_tokens":2'),
    "repeated_key": _one(_ENTRY, b'"model":"again"'),
    "repeated_entry_key": _one(_ENTRY.replace(b'"index":0', b'"index":0,"index":0')),
    "bad_utf8_in_a_field": _one(_ENTRY, b'"x":"\xff"'),
    "bad_escape": _one(_ENTRY, b'"x":"\\q"'),
    "control_char": _one(_ENTRY, b'"x":"a\x01b"'),
    "unquoted_key": _one(_ENTRY, b"x:1"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_answer_is_a_protocol_error(name: str) -> None:
    raw = MALFORMED[name]
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    else:  # what orjson alone accepts, the plain checks refuse (or a key repeats)
        assert not reference(doc, 1, b64=False) or name.startswith("repeated")
    refused(1, raw)


@pytest.mark.parametrize(
    "vec",
    ["AAAAAA", "AAA=", "!!!!", "AACAfw==", "AADAfw==", ""],
    ids=["unpadded", "not_float32", "not_base64", "infinity", "nan", "empty"],
)
def test_a_malformed_base64_vector_is_a_protocol_error(vec: str) -> None:
    doc = answer(1, b64=True)
    doc["data"][0]["embedding"] = vec
    assert not reference(doc, 1, b64=True)
    refused(1, orjson.dumps(doc), b64=True)


def test_wrong_counts_and_widths_are_protocol_errors() -> None:
    refused(3, orjson.dumps(answer(2)))
    refused(1, orjson.dumps(answer(2)))
    uneven = answer(2, 4)
    uneven["data"][1]["embedding"] = vector(1, 5)
    refused(2, orjson.dumps(uneven))


def test_fields_besides_the_vectors_are_bounded() -> None:
    big_field = orjson.dumps(answer(1, note="x" * 70_000))
    assert reference(orjson.loads(big_field), 1, b64=False)
    assert "besides its vectors" in str(refused(1, big_field))
    big_entry = answer(1)
    big_entry["data"][0]["note"] = [0] * 600
    assert "besides its vectors" in str(refused(1, orjson.dumps(big_entry)))
    long_key = orjson.dumps(answer(1) | {"k" * 300: 1})
    refused(1, long_key)
    # what fits is kept
    fits = answer(1, note="x" * 1000)
    assert orjson.loads(served(1, orjson.dumps(fits))) == with_alias(fits)


# -- bounded by what the request can produce -----------------------------------------


def test_the_bound_is_the_widest_vectors_per_input() -> None:
    assert vector_bound(base64_vectors=False) == MAX_DIMENSIONS * FLOAT_TEXT_BYTES + 2
    assert vector_bound(base64_vectors=True) == 4 * math.ceil(4 * MAX_DIMENSIONS / 3) + 2
    assert dialect(1).max_bytes == answer_bound(1, base64_vectors=False) < 500_000
    assert dialect(3, b64=True).max_bytes == answer_bound(3, base64_vectors=True) < 400_000
    assert dialect(256, max_stream_bytes=1 << 20).max_bytes == 1 << 20  # max_stream_bytes


@pytest.mark.parametrize("b64", [False, True], ids=["float", "base64"])
def test_the_widest_vector_in_its_longest_spelling_is_served(b64: bool) -> None:
    widest = "-2.2250738585072014e-308"
    assert len(widest) + 1 == FLOAT_TEXT_BYTES
    doc = answer(1, b64=b64)
    if b64:
        doc["data"][0]["embedding"] = encoded([0.5] * MAX_DIMENSIONS)
        raw = orjson.dumps(doc)
    else:
        doc["data"][0]["embedding"] = [0.0]
        raw = orjson.dumps(doc).replace(
            b"[0.0]", b"[" + b",".join([widest.encode()] * MAX_DIMENSIONS) + b"]"
        )
    assert len(raw) <= dialect(1, b64=b64).max_bytes
    assert orjson.loads(served(1, raw, b64=b64))["data"][0]["embedding"]


@pytest.mark.parametrize("b64", [False, True], ids=["float", "base64"])
def test_a_vector_wider_than_any_model_is_refused(b64: bool) -> None:
    doc = answer(2, b64=b64)
    doc["data"][0]["embedding"] = (
        encoded([0.5] * (MAX_DIMENSIONS + 1)) if b64 else [0.5] * (MAX_DIMENSIONS + 1)
    )
    doc["data"][1]["embedding"] = doc["data"][0]["embedding"]
    raw = orjson.dumps(doc)
    assert len(raw) <= dialect(2, b64=b64).max_bytes  # the answer fits, its vectors do not
    assert "than any model" in str(refused(2, raw, b64=b64))


def test_an_answer_past_the_bound_is_refused_as_it_arrives_and_not_kept() -> None:
    d = dialect(1)
    bound = d.max_bytes
    source = d.source
    tracemalloc.start()
    try:
        source.receive_data(b"[" * (bound - 10))
        assert source.next_event() is NEED_DATA
        source.receive_data(b"[" * 20)  # past the bound: refused now, not at the end
        with pytest.raises(GatewayError) as info:
            source.next_event()
        assert info.value.code == "upstream_protocol_error"
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        for _ in range(40):  # the worker goes on: nothing more is kept
            source.receive_data(b"0" * 1_000_000)
        assert tracemalloc.get_traced_memory()[0] - held < 100_000
        with pytest.raises(GatewayError):
            source.next_event()
        source.receive_data(b"")
        with pytest.raises(GatewayError):
            source.next_event()
    finally:
        tracemalloc.stop()
    assert source.bytes_received == bound + 10 + 40_000_000


# -- memory --------------------------------------------------------------------------


def test_a_big_answer_is_held_once_and_serialized_once() -> None:
    """~10 MB of floats: the dialect holds the worker's bytes (and BytesIO's slack),
    never a parsed answer; the reply adds one serialized copy. Parsed whole, the
    same answer would add 32 bytes of Python float per value (1.6x its size here,
    3.4x for the simulator's short spellings) to a copy of its bytes."""
    inputs, dims = 64, 8192
    doc = answer(inputs, 1)
    for i, entry in enumerate(doc["data"]):  # long spellings: fewer values to trace
        entry["embedding"] = [-0.0123456789012345 * (1 + (i + k) % 7) for k in range(dims)]
    raw = orjson.dumps(doc)
    del doc
    size = len(raw)
    assert size > 10_000_000
    d = dialect(inputs)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        pieces = [raw[at : at + 262_144] for at in range(0, size, 262_144)]
        del raw
        gc.collect()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        source = d.source
        for piece in pieces:
            source.receive_data(piece)
            assert source.next_event() is NEED_DATA
        source.receive_data(b"")
        item = source.next_event()
        d.on_item(item)
        del item
        assert isinstance(source.next_event(), Done)
        current, peak = tracemalloc.get_traced_memory()
        held, checked_peak = current - base, peak - base
        reply = orjson.dumps(d.answer({}))
        reply_peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert len(reply) == size - len(ROUTE) + len(ALIAS)
    assert held < 1.05 * size  # the worker's bytes, cut to size
    assert checked_peak < 1.25 * size  # + BytesIO's growth slack; no parse of the whole
    # + the one serialized reply (orjson reserves slack for it that tracemalloc
    # counts; only what it writes becomes resident)
    assert reply_peak < 3 * size
