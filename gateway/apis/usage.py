"""Usage: reported by the worker, or estimated and marked so (spec §7, §9). Pure.

The estimate is the spec's: prompt tokens are prompt bytes / 4 (rounded up)
unless something better is known. Completion tokens are counted from what
arrived and never exceed the request's ``max_tokens`` (spec §8: a worker
may not send more, so an estimate of more is wrong): a stream that never
reports usage (``/v1/completions``, reference §3.5) counts one token per
content chunk (:func:`count_output_tokens`); one whose usage went missing
(a cut or failed chat or Responses stream) takes the larger of the content
events and the content bytes / 4 (:func:`estimate_output_tokens`).
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


def _capped(tokens: int, max_tokens: int | None) -> int:
    return tokens if max_tokens is None else min(tokens, max_tokens)


def estimate_output_tokens(
    content_events: int, content_bytes: int, max_tokens: int | None = None
) -> int:
    """Completion tokens of a stream whose usage went missing: the larger of the
    content events and the content bytes / 4 (rounded up), at most ``max_tokens``."""
    return _capped(max(content_events, -(-content_bytes // 4)), max_tokens)


def count_output_tokens(content_chunks: int, max_tokens: int | None) -> int:
    """Completion tokens of a stream that never reports usage: the content chunks
    received (each carries at least one token; a real engine's chunk sometimes
    carries more, so this is a floor), at most ``max_tokens``."""
    if content_chunks < 0:
        raise ValueError("content_chunks must not be negative")
    return _capped(content_chunks, max_tokens)


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


#: the counts every caller sees (spec §21); the rest (cache hits, the worker's
#: timings) can reveal other tenants' prompts and traffic
COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


def counts_only(reported: dict[str, Any]) -> dict[str, Any]:
    return {name: reported[name] for name in COUNTS if name in reported}


def public_usage(usage: Usage, *, full: bool = False) -> dict[str, Any]:
    """What a caller sees: the counts (every field the worker reported under
    ``usage_details: full``), or the estimate."""
    if usage.reported is not None:
        return dict(usage.reported) if full else counts_only(usage.reported)
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
