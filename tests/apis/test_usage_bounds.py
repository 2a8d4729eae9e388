"""Worker-reported usage is checked before it is billed (spec §21): a count
past what the request could have cost is a protocol error, and the estimate
is billed instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.apis.base import Plan, StreamBounds
from gateway.apis.chat.dialect import ChunkDialect
from gateway.apis.embeddings.api import EmbeddingsDialect
from gateway.apis.responses.events import ResponsesDialect
from gateway.core.errors import GatewayError
from gateway.core.sse import Done, KeepAlive, NeedData

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sse"


def _drain(dialect: Any, data: bytes) -> None:
    dialect.source.receive_data(data)
    dialect.source.receive_data(b"")
    while not isinstance(event := dialect.source.next_event(), Done):
        if not isinstance(event, KeepAlive | NeedData):
            dialect.on_item(event)


def _chat_plan() -> Plan:
    return Plan("chat.completions", "a", {}, True, True, 64, 10, "n")


def _prompt_tokens(path: Path) -> int:
    for line in path.read_bytes().split(b"\n"):
        if line.startswith(b"data: {") and b'"usage":{' in line:
            usage = orjson.loads(line[6:]).get("usage")
            if usage:
                return int(usage["prompt_tokens"])
    raise AssertionError("no usage in the fixture")


def test_chat_usage_within_the_bound_is_billed_as_reported() -> None:
    path = FIXTURES / "chat_valid.sse"
    reported = _prompt_tokens(path)
    dialect = ChunkDialect(
        "chat", _chat_plan(), StreamBounds(max_prompt_tokens=reported), collect=True
    )
    _drain(dialect, path.read_bytes())
    assert dialect.report().counts is not None


def test_chat_usage_past_the_bound_is_a_protocol_error_and_nothing_reported() -> None:
    path = FIXTURES / "chat_valid.sse"
    reported = _prompt_tokens(path)
    dialect = ChunkDialect(
        "chat", _chat_plan(), StreamBounds(max_prompt_tokens=reported - 1), collect=True
    )
    with pytest.raises(GatewayError) as raised:
        _drain(dialect, path.read_bytes())
    assert raised.value.code == "upstream_protocol_error"
    # No counts: the pipeline bills the estimate (usage_of with counts None).
    assert dialect.report().counts is None


def test_responses_usage_past_the_bound_is_refused() -> None:
    path = FIXTURES / "responses" / "valid.sse"
    plan = Plan("responses", "a", {}, True, True, 64, 10, "n")
    dialect = ResponsesDialect(plan, StreamBounds(max_prompt_tokens=1), collect=True)
    with pytest.raises(GatewayError) as raised:
        _drain(dialect, path.read_bytes())
    assert raised.value.code == "upstream_protocol_error"
    assert dialect.report().counts is None


def test_an_embeddings_answer_claiming_10e15_tokens_is_refused() -> None:
    plan = Plan("embeddings", "a", {"input": ["hi"]}, False, True, None, 2, "n")
    dialect = EmbeddingsDialect(plan, StreamBounds(max_prompt_tokens=1030))
    answer = {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
        "model": "m",
        "usage": {"prompt_tokens": 10**15, "total_tokens": 10**15},
    }
    with pytest.raises(GatewayError) as raised:
        _drain(dialect, orjson.dumps(answer))
    assert raised.value.code == "upstream_protocol_error"
    assert dialect.report().counts is None
