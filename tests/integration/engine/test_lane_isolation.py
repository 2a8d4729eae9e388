"""The prefix-cache side channel on the real engine (spec §21, issue 25).

The engine's prefix cache is shared by every tenant of the worker, and its
usage reports the cache hits (``prompt_tokens_details.cached_tokens``) and
timings. A tenant that could read them could rank guesses of another
tenant's recent prompt. Under the default policy a caller sees the counts
only; the receipts keep everything (the channel is real: the receipt shows
it), and the counts a caller sees depend on its own prompt alone.
"""

from __future__ import annotations

from typing import Any

from tests.support.engine import chat_body
from tests.support.engine_stack import ALIAS, EngineStack

COUNTS = {"prompt_tokens", "completion_tokens", "total_tokens"}
SECRET = "mango"
CANDIDATES = ["apple", "mango", "peach", "lemon", "grape", "melon"]


def _ask(stack: EngineStack, tenant: str, prompt: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the usage the caller sees, the receipt's usage) of a non-streamed chat."""
    with stack.client(stack.rs256(tenant), timeout=120) as client:
        body = chat_body(messages=[{"role": "user", "content": prompt}], max_tokens=2)
        response = client.post("/v1/chat/completions", json={**body, "model": ALIAS})
    assert response.status_code == 200, response.text
    receipt = stack.receipt(response.headers["x-request-id"], timeout_s=30)
    return response.json()["usage"], receipt["usage"]


def _prompt(word: str) -> str:
    return "Remember the following words carefully. " * 6 + f"The secret word is {word}."


def test_another_tenants_prompt_cannot_be_ranked_from_usage(lane: EngineStack) -> None:
    for _ in range(2):  # alpha's prompt is in the shared cache
        _ask(lane, "acme", _prompt(SECRET))
    seen: dict[str, dict[str, Any]] = {}
    kept: dict[str, dict[str, Any]] = {}
    for word in CANDIDATES:
        seen[word], kept[word] = _ask(lane, "globex", _prompt(word))
    for word in CANDIDATES:
        assert set(seen[word]) == COUNTS, seen[word]  # no cache hits, no timings
    # What a caller sees is its own prompt's count: asking again (now from its
    # own warm cache) shows the same numbers.
    for word in CANDIDATES:
        again, _ = _ask(lane, "globex", _prompt(word))
        assert again["prompt_tokens"] == seen[word]["prompt_tokens"]
    # The receipts keep every field the worker reported, and the channel is
    # real: the worker's prefix cache hit on alpha's prompt for beta's guesses.
    hits = [
        (kept[w].get("reported") or {}).get("prompt_tokens_details", {}).get("cached_tokens", 0)
        for w in CANDIDATES
    ]
    assert any(hit > 0 for hit in hits), hits
