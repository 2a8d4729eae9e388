"""Every value of a full request replaced by every other JSON type: a
descriptor's ``plan`` (and ``forward`` of what it accepts) answers a plan or a
4xx :class:`GatewayError`, never another exception.

This is the compiled build's audit (``gateway/native.py``): a compiled
function checks its annotated argument types at its boundary, so a caller's
value of a type an annotation did not foresee would be a ``TypeError`` (a 500)
where pure Python might have answered a 400. Exhaustive over one body per
descriptor, deterministic; ``make test`` runs it on both builds.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.apis.base import Api, PlanContext
from gateway.apis.chat.api import ChatApi
from gateway.apis.chat.completions import CompletionsApi
from gateway.apis.embeddings.api import EmbeddingsApi
from gateway.apis.messages.api import MessagesApi
from gateway.apis.responses.api import ResponsesApi
from gateway.config import LimitsConfig
from gateway.config.policy import MediaPolicy, Tenant, TenantPolicy, resolve_limits
from gateway.core.errors import GatewayError

pytestmark = pytest.mark.fuzz

ALIAS = "gemma-4-mm"
ROUTE = "/srv/mosaic-models/sim"
EVIDENCE = "evidence:ev_" + "ab" * 16
PNG = "data:image/png;base64,iVBORw0KGgo="
#: one value of each JSON type (and the shapes the specs branch on)
SUBSTITUTES: tuple[Any, ...] = (
    None, True, False, 0, -1, 7, 2**63 - 1, 1.5, -0.0, "", "x", "auto",
    [], [1], ["x"], [{}], {}, {"type": "text"}, {"a": 1},
)  # fmt: skip

TOOL = {
    "type": "function",
    "function": {"name": "lookup", "description": "d", "parameters": {"type": "object"}},
}
CHAT = {
    "model": ALIAS,
    "messages": [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": EVIDENCE, "detail": "low"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ],
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_tokens": 32,
    "temperature": 0.5,
    "top_p": 0.9,
    "stop": ["\n"],
    "seed": 3,
    "logit_bias": {"50256": -100},
    "logprobs": True,
    "top_logprobs": 2,
    "tools": [TOOL],
    "tool_choice": {"type": "function", "function": {"name": "lookup"}},
    "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}}},
    "n": 1,
}
COMPLETION = {
    "model": ALIAS,
    "prompt": "once upon a time",
    "max_tokens": 16,
    "stream": False,
    "temperature": 0.2,
    "stop": "\n",
    "echo": False,
}
RESPONSES = {
    "model": ALIAS,
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "y"}]},
    ],
    "instructions": "be brief",
    "max_output_tokens": 32,
    "stream": True,
    "temperature": 0.5,
    "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
    "tool_choice": "auto",
    "text": {"format": {"type": "text"}},
    "store": False,
    "metadata": {"k": "v"},
}
MESSAGES = {
    "model": ALIAS,
    "max_tokens": 32,
    "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image", "source": {"type": "url", "url": EVIDENCE}},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": 1}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "found"}],
        },
    ],
    "tools": [{"name": "lookup", "description": "d", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "auto"},
    "stream": True,
    "temperature": 0.5,
    "stop_sequences": ["\n\n"],
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "metadata": {"user_id": "u"},
}
EMBEDDINGS = {"model": ALIAS, "input": ["a", "b"], "encoding_format": "float", "user": "u"}

CASES: dict[str, tuple[Api, dict[str, Any], tuple[tuple[bytes, bytes], ...]]] = {
    "chat": (ChatApi(), CHAT, ()),
    "completions": (CompletionsApi(), COMPLETION, ()),
    "responses": (ResponsesApi(), RESPONSES, ()),
    "messages": (MessagesApi(), MESSAGES, ((b"anthropic-version", b"2023-06-01"),)),
    "embeddings": (EmbeddingsApi(), EMBEDDINGS, ()),
}


def _tenant() -> Tenant:
    policy = TenantPolicy(
        tenant="acme",
        models={ALIAS: ROUTE},
        modalities=["text", "image", "audio", "video"],
        media=MediaPolicy(caller_urls="reject", inline_data="stage"),
    )
    return Tenant("acme", policy, resolve_limits(policy.limits, LimitsConfig()))


def _paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON value, the value itself first."""
    yield at
    if isinstance(value, dict):
        for key, entry in value.items():
            yield from _paths(entry, (*at, key))
    elif isinstance(value, list):
        for index, entry in enumerate(value):
            yield from _paths(entry, (*at, index))


def _replaced(body: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return copy.deepcopy(value)
    out = copy.deepcopy(body)
    node = out
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = copy.deepcopy(value)
    return out


def _plan(api: Api, body: Any, sent: tuple[tuple[bytes, bytes], ...]) -> str:
    try:
        plan = api.plan(body, PlanContext(_tenant(), "0123456789abcdef", sent))
        api.forward(plan, ROUTE)
    except GatewayError as exc:
        assert 400 <= exc.status < 500, exc.code
        return exc.code
    return "planned"


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_value_of_every_type_is_a_plan_or_a_4xx(name: str) -> None:
    api, body, sent = CASES[name]
    assert _plan(api, copy.deepcopy(body), sent) == "planned"  # the base body is whole
    outcomes: dict[str, int] = {}
    places = list(_paths(body))
    for path in places:
        for value in SUBSTITUTES:
            outcome = _plan(api, _replaced(body, path, value), sent)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # Both kinds of answers were reached: the walk changed what the plan saw.
    assert outcomes.get("planned", 0) > 0 and len(outcomes) > 2, outcomes
    assert len(places) >= len(body) + 1
