"""Streams of the real engine through the real gateway (tiny random-weight model).

The caller gets the worker's own stream: the bytes the adapter sent for that
very request (their SHA-256 is the receipt's ``stream_sha256``) with only
``model`` set back to the alias; and a greedy request gives the same chunks
through the gateway as straight to the adapter (ids, creation time and
timings aside, which belong to each sequence).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tests.support.engine import chat_body
from tests.support.engine_stack import (
    ALIAS,
    EngineStack,
    gateway_body,
    stream_raw,
    worker_bytes,
)

TIMING = (
    "avg_tok_per_sec",
    "avg_prompt_tok_per_sec",
    "avg_compl_tok_per_sec",
    "total_time_sec",
    "total_prompt_time_sec",
    "total_completion_time_sec",
)


def _per_sequence(chunk: dict[str, Any]) -> dict[str, Any]:
    """A chunk without what differs between two sequences of the same request."""
    out = {k: v for k, v in chunk.items() if k not in ("id", "created", "model")}
    if out.get("usage") is not None:
        out["usage"] = {k: v for k, v in out["usage"].items() if k not in TIMING}
    return out


def _data_lines(raw: bytes) -> list[bytes]:
    return [frame for frame in raw.split(b"\n\n") if frame.startswith(b"data: {")]


def _line_without_sequence(line: bytes, chunk: dict[str, Any], model: str) -> bytes:
    """The data line's bytes with this sequence's id, created and model text blanked."""
    head = b'data: {"id":' + json.dumps(chunk["id"]).encode() + b","
    assert line.startswith(head)
    line = b'data: {"id":"-",' + line[len(head) :]
    created = b'"created":' + str(chunk["created"]).encode() + b","
    model_text = b'"model":' + json.dumps(model).encode() + b","
    assert line.count(created) == 1 and line.count(model_text) == 1
    line = line.replace(created, b'"created":0,').replace(model_text, b'"model":"-",')
    usage_at = line.find(b',"usage":{')
    return line if usage_at < 0 else line[:usage_at]  # timings differ per sequence


def test_the_caller_gets_the_workers_bytes_with_the_alias(lane: EngineStack) -> None:
    adapter = lane.adapter
    body = chat_body(
        messages=[{"role": "user", "content": "Tell me a story about the sea."}], max_tokens=48
    )
    stream_raw(adapter.base_url, body)  # the same prefix-cache state for both requests below
    direct = stream_raw(adapter.base_url, body)
    via = stream_raw(
        lane.url,
        gateway_body({**body, "stream_options": {"include_usage": True}}),
        lane.headers(),
    )
    assert (via.status, direct.status) == (200, 200)
    assert via.headers["x-usage-source"] == "reported"
    assert via.stream.events[-1] == direct.stream.events[-1] == "[DONE]"
    assert via.stream.keepalives == direct.stream.keepalives == 0  # 10 s keep-alive

    # 1. the very bytes the worker sent for this request, model aside
    receipt = lane.receipt(via.request_id)
    sent = worker_bytes(via.stream.raw, adapter.route, receipt)
    assert hashlib.sha256(sent).hexdigest() == receipt["stream_sha256"]
    assert all(chunk["model"] == ALIAS for chunk in via.stream.chunks)

    # 2. the same greedy answer as straight to the adapter
    ours, theirs = via.stream.chunks, direct.stream.chunks
    assert [_per_sequence(c) for c in ours] == [_per_sequence(c) for c in theirs]
    assert len({c["id"] for c in ours}) == 1
    assert [
        _line_without_sequence(line, chunk, ALIAS)
        for line, chunk in zip(_data_lines(via.stream.raw), ours, strict=True)
    ] == [
        _line_without_sequence(line, chunk, adapter.route)
        for line, chunk in zip(_data_lines(direct.stream.raw), theirs, strict=True)
    ]
    assert ours[-1]["usage"]["completion_tokens"] == 48
    assert receipt["outcome"] == "length"


def test_the_receipts_usage_is_the_final_chunks_every_field(lane: EngineStack) -> None:
    # The official SDK as the caller; its raw response gives the request id.
    with lane.openai() as client:
        raw = client.chat.completions.with_raw_response.create(
            model=ALIAS,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks: list[dict[str, Any]] = [chunk.to_dict() for chunk in raw.parse()]
    final = chunks[-1]
    usage: dict[str, Any] = final["usage"]
    assert final["choices"][0]["finish_reason"] == "length"
    assert all(chunk["usage"] is None for chunk in chunks[:-1])
    receipt = lane.receipt(raw.headers["x-request-id"])
    assert receipt["outcome"] == "length"
    assert receipt["usage"]["source"] == "reported"
    assert receipt["usage"]["reported"] == usage  # every field, timings included
    assert list(receipt["usage"]["reported"]) == list(usage)
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [receipt["usage"][k] for k in counts] == [usage[k] for k in counts]
    assert usage["completion_tokens"] == 20
    assert set(TIMING) <= set(usage)
