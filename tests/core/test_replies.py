"""Whole JSON replies: a spliced body is the same text, sent in pieces."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.core.replies import CHUNK_BYTES, Spliced, send_json, spliced_pieces


def _spliced(keys: list[str], raw: bytes) -> Spliced:
    body = Spliced("data", raw)
    for key in keys:
        body[key] = orjson.Fragment(raw) if key == "data" else {"k": key, "n": [1.5, None]}
    return body


@pytest.mark.parametrize(
    "keys", [["object", "data", "model", "usage"], ["data"], ["data", "x"], ["x", "data"]]
)
def test_spliced_pieces_are_the_serialized_text(keys: list[str]) -> None:
    body = _spliced(keys, b"[[0.5,1],[2,3]]")
    head, raw, tail = spliced_pieces(body)
    assert raw is body.raw  # the big value is not copied
    assert head + raw + tail == orjson.dumps(body)


async def test_a_spliced_reply_goes_out_in_bounded_pieces() -> None:
    raw = b"[" + b"0.125," * (CHUNK_BYTES // 2) + b"1]"
    body = _spliced(["object", "data", "model"], raw)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await send_json(send, 200, body, {"x-usage-source": "reported"})
    start, *messages = sent
    payload = b"".join(m["body"] for m in messages)
    assert payload == orjson.dumps(body)
    assert dict(start["headers"])[b"content-length"] == str(len(payload)).encode()
    assert all(len(m["body"]) <= CHUNK_BYTES for m in messages)
    assert [m.get("more_body", False) for m in messages] == [True] * (len(messages) - 1) + [False]


async def test_a_plain_reply_is_one_body() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await send_json(send, 201, {"a": 1})
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[1]["body"] == b'{"a":1}' and "more_body" not in sent[1]
