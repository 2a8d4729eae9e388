"""Usage: reported by the worker, or estimated and marked so (spec §7, §9). Pure.

The estimate is the spec's: prompt tokens are prompt bytes / 4 (rounded up)
unless something better is known; completion tokens are the larger of the
content events seen and the content bytes / 4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.core.sse import violation


def estimate_prompt_tokens(prompt_bytes: int) -> int:
    """The spec's prompt estimate: one token per four bytes, rounded up."""
    if prompt_bytes < 0:
        raise ValueError("prompt_bytes must not be negative")
    return -(-prompt_bytes // 4)


def usage_count(usage: dict[str, Any], key: str) -> int:
    """One token count of the worker's usage object, which must be a
    non-negative integer (bool is an int subclass; a JSON true is no count)."""
    value = usage.get(key)
    if type(value) is not int or value < 0:
        raise violation("Upstream usage counts are not non-negative integers.")
    return value


def estimate_output_tokens(content_events: int, content_bytes: int) -> int:
    return max(content_events, -(-content_bytes // 4))


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    source: str  # reported | estimated
    reported: dict[str, Any] | None = None  # the worker's usage object, all fields


def usage_of(
    counts: tuple[int, int, int] | None,
    reported: dict[str, Any] | None,
    prompt_bytes: int,
    output_estimate: int,
) -> Usage:
    """The request's usage: the worker's counts when it sent them, else the estimate."""
    if counts is not None:
        prompt, completion, total = counts
        return Usage(prompt, completion, total, "reported", reported)
    prompt = estimate_prompt_tokens(prompt_bytes)
    return Usage(prompt, output_estimate, prompt + output_estimate, "estimated")


def public_usage(usage: Usage) -> dict[str, Any]:
    """What a non-streaming caller sees: every field the worker reported, or the estimate."""
    if usage.reported is not None:
        return dict(usage.reported)
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
