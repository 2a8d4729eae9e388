"""Completions usage (spec §9, §14; reference §3.5): the worker never streams
any, so the dialect counts it from the chunks received, never above
``max_tokens``, and a stream that asked for ``include_usage`` gets it as the
final usage chunk before ``data: [DONE]``. Chat's reported usage is untouched."""

from __future__ import annotations

from typing import Any

import openai.types
import orjson
import pytest

from gateway.apis.base import Plan, Report, StreamBounds
from gateway.apis.chat.dialect import Chunk, ChunkDialect
from gateway.apis.usage import count_output_tokens, estimate_output_tokens, usage_of
from gateway.core.errors import GatewayError
from gateway.core.sse import NEED_DATA, Done
from tests.support.sse import chunk, event, usage

ALIAS = "alias"
DONE = b"data: [DONE]\n\n"


def completion_chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    """A ``/v1/completions`` chunk as the worker writes it (reference §3.5): no usage key."""
    return {
        "id": "8",
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
        "created": 1755870000,
        "model": "m",
        "system_fingerprint": "local",
        "object": "text_completion",
    }


def filler(count: int, finish: str) -> list[dict[str, Any]]:
    """What the simulator streams: ``count`` one-token chunks of 12+ bytes each
    (the bytes / 4 rule made 24 of 8), the finish on the last text for
    ``length``, else on its own empty chunk."""
    texts = [f"sim-token-{i} " for i in range(count)]
    if finish == "length":
        return [completion_chunk(t) for t in texts[:-1]] + [completion_chunk(texts[-1], finish)]
    return [completion_chunk(t) for t in texts] + [completion_chunk("", finish)]


def plan(
    kind: str = "completion",
    *,
    max_tokens: int | None = 64,
    include_usage: bool = True,
    stream: bool = True,
    prompt_bytes: int = 10,
) -> Plan:
    return Plan(
        endpoint="completions" if kind == "completion" else "chat.completions",
        alias=ALIAS,
        body={"prompt": "p"} if kind == "completion" else {"messages": []},
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        prompt_bytes=prompt_bytes,
        nonce="n",
    )


def run(
    chunks: list[dict[str, Any]], plan_: Plan, kind: str = "completion"
) -> tuple[ChunkDialect, list[bytes]]:
    """Feed the chunks, [DONE] and EOF to a streaming dialect; the caller's
    frames as the relay sends them (each item's frame, then the terminator)."""
    dialect = ChunkDialect(
        "completion" if kind == "completion" else "chat",
        plan_,
        StreamBounds(),
        collect=not plan_.stream,
    )
    dialect.source.receive_data(b"".join(event(c) for c in chunks) + DONE)
    dialect.source.receive_data(b"")
    frames: list[bytes] = []
    while not isinstance(item := dialect.source.next_event(), Done):
        assert item is not NEED_DATA
        if isinstance(item, Chunk) and (frame := dialect.on_item(item)) is not None:
            frames.append(frame)
    if plan_.stream:
        frames.append(dialect.terminal_frame)
    return dialect, frames


def payloads(frames: list[bytes]) -> list[str]:
    """Every ``data:`` payload the caller gets, in order."""
    out: list[str] = []
    for block in b"".join(frames).split(b"\n\n"):
        if block:
            assert block.startswith(b"data: "), block
            out.append(block[len(b"data: ") :].decode())
    return out


def receipt_usage(dialect: ChunkDialect, plan_: Plan) -> tuple[int, int, int, str]:
    report: Report = dialect.report()
    u = usage_of(report.counts, report.usage, plan_.prompt_bytes, report.output_estimate)
    return u.prompt_tokens, u.completion_tokens, u.total_tokens, u.source


# -- the estimate ---------------------------------------------------------------


@pytest.mark.parametrize("max_tokens", [1, 2, 8, 32, 100])
@pytest.mark.parametrize("sent", [1, 5, 8, 40])
def test_the_completion_estimate_counts_chunks_and_never_exceeds_max_tokens(
    max_tokens: int, sent: int
) -> None:
    # The worker stops at max_tokens with a length finish; fewer chunks stop.
    count = min(sent, max_tokens)
    finish = "length" if sent >= max_tokens else "stop"
    p = plan(max_tokens=max_tokens)
    dialect, _ = run(filler(count, finish), p)
    report = dialect.report()
    assert report.output_estimate == count <= max_tokens
    assert receipt_usage(dialect, p) == (3, count, 3 + count, "estimated")


def test_the_estimate_is_capped_even_when_the_worker_sends_too_many_chunks() -> None:
    dialect, _ = run(filler(12, "stop"), plan(max_tokens=8))
    assert dialect.report().output_estimate == 8


def test_empty_text_chunks_are_not_tokens() -> None:
    chunks = [completion_chunk(""), completion_chunk("a"), completion_chunk("", "stop")]
    dialect, _ = run(chunks, plan())
    assert dialect.report().output_estimate == 1


def test_a_non_streaming_completion_is_estimated_the_same_way() -> None:
    p = plan(max_tokens=8, stream=False, include_usage=False)
    dialect, frames = run(filler(8, "length"), p)
    assert frames == []
    assert receipt_usage(dialect, p) == (3, 8, 11, "estimated")


@pytest.mark.parametrize(
    ("events", "size", "max_tokens", "expected"),
    [
        (2, 10, None, 3),  # the larger of events and bytes / 4, as before
        (2, 10, 64, 3),
        (8, 96, 8, 8),  # never above max_tokens
        (9, 0, 8, 8),
        (0, 0, 8, 0),
    ],
)
def test_estimate_output_tokens(
    events: int, size: int, max_tokens: int | None, expected: int
) -> None:
    assert estimate_output_tokens(events, size, max_tokens) == expected


def test_count_output_tokens() -> None:
    assert [count_output_tokens(n, 8) for n in (0, 1, 8, 9)] == [0, 1, 8, 8]
    assert count_output_tokens(9, None) == 9
    with pytest.raises(ValueError):
        count_output_tokens(-1, 8)


# -- the final usage chunk ------------------------------------------------------


@pytest.mark.parametrize(("max_tokens", "finish"), [(8, "length"), (32, "stop"), (3, "length")])
def test_include_usage_gets_one_usage_chunk_right_before_done(max_tokens: int, finish: str) -> None:
    count = 8 if finish == "stop" else max_tokens
    p = plan(max_tokens=max_tokens, prompt_bytes=17)
    dialect, frames = run(filler(count, finish), p)
    data = payloads(frames)
    assert data[-1] == "[DONE]"
    *content, last_data = data[:-1]
    chunks = [orjson.loads(d) for d in content]
    assert all("usage" not in c and len(c["choices"]) == 1 for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == finish
    # The gateway's own chunk passes the SDK's model strictly (the worker's
    # chunks carry finish_reason null, which only the SDK's lenient parse takes).
    last = openai.types.Completion.model_validate_json(last_data)
    assert last.choices == [] and last.usage is not None
    # The gateway's id (spec §21), the same as every chunk of the stream carries.
    assert {c["id"] for c in chunks} == {dialect.id} and dialect.id.startswith("cmpl-")
    assert dialect.report().upstream_id == "8"
    assert (last.id, last.created, last.model, last.object) == (
        dialect.id,
        1755870000,
        ALIAS,
        "text_completion",
    )
    assert last.usage.completion_tokens == count <= max_tokens
    assert last.usage.prompt_tokens == 5  # 17 bytes / 4, rounded up
    assert last.usage.total_tokens == 5 + count
    # the caller's chunk says what the receipt says
    assert receipt_usage(dialect, p) == (5, count, 5 + count, "estimated")
    # the worker's chunk shape, key for key, the usage last
    assert list(orjson.loads(data[-2])) == [
        "id",
        "choices",
        "created",
        "model",
        "system_fingerprint",
        "object",
        "usage",
    ]
    assert dialect.usage_source == "estimated"


def test_without_include_usage_there_is_no_usage_chunk() -> None:
    dialect, frames = run(filler(8, "stop"), plan(include_usage=False))
    data = payloads(frames)
    assert data[-1] == "[DONE]" and len(data) == 10
    assert all(orjson.loads(d)["choices"] for d in data[:-1])
    assert dialect.terminal_frame == DONE


def test_a_completion_stream_that_reports_usage_gets_no_second_one() -> None:
    chunks = filler(3, "stop")
    chunks[-1]["usage"] = usage(3, 4)
    dialect, frames = run(chunks, plan())
    data = payloads(frames)
    assert [orjson.loads(d).get("usage") for d in data[:-1]] == [None] * 3 + [usage(3, 4)]
    assert dialect.terminal_frame == DONE
    assert receipt_usage(dialect, plan())[3] == "reported"


def test_a_usage_only_chunk_from_the_worker_is_passed_on_and_not_doubled() -> None:
    only = {**completion_chunk(""), "choices": [], "usage": usage(2, 1)}
    dialect, frames = run([*filler(2, "stop"), only], plan())
    data = payloads(frames)
    assert [orjson.loads(d)["choices"] for d in data[-3:-1]][-1] == []
    assert sum(1 for d in data[:-1] if orjson.loads(d).get("usage")) == 1
    assert dialect.terminal_frame == DONE


def test_a_stream_that_fails_after_the_finish_gets_no_usage_chunk_and_no_done() -> None:
    # The relay sends the terminator only after a valid end; the frames before
    # the failure never include the usage chunk.
    dialect = ChunkDialect("completion", plan(), StreamBounds(), collect=False)
    dialect.source.receive_data(b"".join(event(c) for c in filler(2, "stop")))
    dialect.source.receive_data(b"")
    frames: list[bytes] = []
    with pytest.raises(GatewayError) as info:  # EOF before [DONE]
        while (item := dialect.source.next_event()) is not NEED_DATA:
            assert isinstance(item, Chunk)
            frame = dialect.on_item(item)
            assert frame is not None
            frames.append(frame)
    assert info.value.code == "upstream_unavailable"
    assert len(frames) == 3 and all(b'"choices":[]' not in f for f in frames)


def test_chat_streams_keep_the_workers_usage_and_no_extra_chunk() -> None:
    chunks = [chunk("a"), chunk("b"), chunk("", "stop", usage(2, 3))]
    p = plan("chat")
    dialect, frames = run(chunks, p, "chat")
    data = payloads(frames)
    assert len(data) == 4 and data[-1] == "[DONE]"
    assert orjson.loads(data[-2])["usage"] == usage(2, 3)
    assert dialect.terminal_frame == DONE
    assert dialect.usage_source == "reported"
    assert receipt_usage(dialect, p)[3] == "reported"
