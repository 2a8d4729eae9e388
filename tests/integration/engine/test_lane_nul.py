"""U+0000 from the real engine (a byte-fallback token, forced with logit_bias) through the gateway.

``upstream.text_nul: replace`` (the default) delivers it as U+FFFD and counts it
in the receipt; ``reject`` treats it as a protocol violation: one error event
and no ``[DONE]`` once the stream has started, an HTTP 502 before that.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.testing.engine import modelgen
from tests.support.engine import EngineAdapter, chat_body
from tests.support.engine_stack import (
    EngineStack,
    gateway_body,
    running_engine_stack,
    stream_raw,
)


@pytest.fixture(scope="module")
def rejecting(
    tiny_adapter: EngineAdapter, dev_secret: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineStack]:
    with running_engine_stack(
        tmp_path_factory.mktemp("reject"), tiny_adapter, upstream={"text_nul": "reject"}
    ) as stack:
        yield stack


def _forced(adapter: EngineAdapter, bias: float = 100, **fields: Any) -> dict[str, Any]:
    nul = modelgen.nul_token_id(adapter.route)
    return chat_body(logit_bias={str(nul): bias}, **fields)


def _nul_after_the_first_chunk(adapter: EngineAdapter) -> dict[str, Any]:
    """A greedy request whose stream has a NUL, but not in its first chunk (searched)."""
    for prompt in ("hello", "a b c", "?", "Say something."):
        for bias in (0.2, 0.25, 0.3):
            body = _forced(adapter, bias, messages=[{"role": "user", "content": prompt}])
            body["max_tokens"] = 12
            texts = [c["choices"][0]["delta"]["content"] or "" for c in _direct(adapter, body)]
            if "\x00" not in texts[0] and any("\x00" in t for t in texts[1:]):
                return body
    raise AssertionError("no prompt and bias put a NUL after the first chunk")


def _direct(adapter: EngineAdapter, body: dict[str, Any]) -> list[dict[str, Any]]:
    answer = stream_raw(adapter.base_url, body)
    assert answer.stream.events[-1] == "[DONE]"
    return answer.stream.chunks


def test_replace_delivers_u_fffd_and_counts_it(lane: EngineStack) -> None:
    body = _forced(lane.adapter, max_tokens=3)
    engine_text = "".join(c["choices"][0]["delta"]["content"] for c in _direct(lane.adapter, body))
    assert engine_text == "\x00\x00\x00"
    via = stream_raw(lane.url, gateway_body(body), lane.headers())
    assert via.status == 200
    assert via.stream.events[-1] == "[DONE]"
    assert via.stream.text() == "\ufffd\ufffd\ufffd"
    assert b"\\u0000" not in via.stream.raw
    receipt = lane.receipt(via.request_id)
    assert (receipt["outcome"], receipt["nul_replaced"]) == ("length", 3)
    # the non-streaming answer too
    with lane.openai() as client:
        answer = client.chat.completions.create(**gateway_body(body))
    assert answer.choices[0].message.content == "\ufffd\ufffd\ufffd"


def test_reject_ends_a_started_stream_with_one_protocol_error(rejecting: EngineStack) -> None:
    body = _nul_after_the_first_chunk(rejecting.adapter)
    via = stream_raw(rejecting.url, gateway_body(body), rejecting.headers())
    assert via.status == 200
    events = via.stream.events
    assert "[DONE]" not in events
    *chunks, last = events
    assert chunks and all("\x00" not in (c["choices"][0]["delta"]["content"] or "") for c in chunks)
    assert list(last) == ["error"]
    assert (last["error"]["type"], last["error"]["code"]) == ("upstream_protocol_error",) * 2
    receipt = rejecting.receipt(via.request_id)
    assert (receipt["outcome"], receipt["error_code"]) == (
        "protocol_error",
        "upstream_protocol_error",
    )
    assert receipt["nul_replaced"] == 0


def test_reject_before_the_first_byte_is_http_502(rejecting: EngineStack) -> None:
    with rejecting.client() as client:
        body = {**gateway_body(_forced(rejecting.adapter)), "stream": True}
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 502
    assert json.loads(response.content)["error"]["code"] == "upstream_protocol_error"
    receipt = rejecting.receipt(response.headers["x-request-id"])
    assert receipt["outcome"] == "protocol_error"
