"""Completions usage through the real gateway with the official ``openai`` SDK:
the worker streams none (reference §3.5), so a caller that asks for
``stream_options.include_usage`` gets the gateway's estimate as the final
chunk (``x-usage-source: estimated``, spec §14), never above ``max_tokens``,
and the receipt says the same."""

from __future__ import annotations

import pytest
from openai.types import Completion

from tests.support.stack import Stack

ALIAS = "gemma-4-mm"


@pytest.mark.parametrize(("max_tokens", "chunks"), [(8, 8), (32, 40), (32, 5)])
def test_a_streamed_completion_ends_with_the_estimated_usage_chunk(
    stack: Stack, max_tokens: int, chunks: int
) -> None:
    client = stack.sdk()
    raw = client.completions.with_raw_response.create(
        model=ALIAS,
        prompt=f"Say hi [[sim chunks={chunks}]]",
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert raw.headers["x-usage-source"] == "estimated"
    received: list[Completion] = list(raw.parse())
    *content, last = received
    assert content and all(c.usage is None and len(c.choices) == 1 for c in content)
    assert content[-1].choices[0].finish_reason == ("length" if chunks >= max_tokens else "stop")
    assert last.choices == [] and last.usage is not None
    assert (last.id, last.created, last.model) == (content[0].id, content[0].created, ALIAS)
    expected = min(chunks, max_tokens)
    assert last.usage.completion_tokens == expected <= max_tokens
    assert last.usage.total_tokens == last.usage.prompt_tokens + expected
    receipt = stack.receipt(raw.headers["x-request-id"])
    assert receipt["outcome"] == ("length" if chunks >= max_tokens else "complete")
    assert receipt["usage"]["source"] == "estimated"
    assert {k: receipt["usage"][k] for k in ("prompt_tokens", "completion_tokens")} == {
        "prompt_tokens": last.usage.prompt_tokens,
        "completion_tokens": expected,
    }


def test_without_include_usage_no_usage_chunk_and_non_streaming_stays_capped(
    stack: Stack,
) -> None:
    client = stack.sdk()
    streamed = list(
        client.completions.create(
            model=ALIAS, prompt="hi [[sim chunks=8]]", max_tokens=8, stream=True
        )
    )
    assert streamed and all(c.usage is None and len(c.choices) == 1 for c in streamed)
    raw = client.completions.with_raw_response.create(
        model=ALIAS, prompt="hi [[sim chunks=8]]", max_tokens=8
    )
    assert raw.headers["x-usage-source"] == "estimated"
    answer = raw.parse()
    assert answer.usage is not None and answer.usage.completion_tokens == 8
    receipt = stack.receipt(raw.headers["x-request-id"])
    assert (receipt["usage"]["source"], receipt["usage"]["completion_tokens"]) == ("estimated", 8)
