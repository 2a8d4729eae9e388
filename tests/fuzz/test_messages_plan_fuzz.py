"""Fuzz the Anthropic Messages request planner (spec §19, ``gateway/apis/messages/api.py``).

(The Messages event grammar and dialect are fuzzed in
``test_message_events_fuzz.py``.)

Properties, for generated bodies (as the body guard parses them from JSON
text) and headers through ``MessagesApi.plan`` and ``CountTokensApi.plan``
and their ``forward``:

- **one error sink**: the only exception is :class:`GatewayError`, with a 4xx
  status; an ``invalid_request``, ``unsupported_field`` or
  ``caller_url_forbidden`` of an object body names its ``param``;
- **a plan is what was asked, bounded**: the caller's alias, ``max_tokens``
  within the tenant's limit (none when counting), ``stream`` only when asked
  and never when counting, no more media refs than the tenant allows, and the
  forwarded body names the exact route and carries no URL the caller wrote in
  an image source (placeholders only).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from gateway.apis.base import Api, PlanContext
from gateway.apis.messages.api import REFUSED, CountTokensApi, MessagesApi
from gateway.config import LimitsConfig
from gateway.config.policy import (
    MediaPolicy,
    Modality,
    PolicyLimits,
    Tenant,
    TenantPolicy,
    resolve_limits,
)
from gateway.core.errors import GatewayError
from gateway.http.bodyguard import parse_json
from tests.fuzz.budget import budget
from tests.support.urls import CALLER_URLS

pytestmark = pytest.mark.fuzz

ROUTE = "/srv/mosaic-models/" + "ef" * 32
ALIAS = "gemma-4-mm"
NONCE = "0123456789abcdef"
APIS: dict[str, Api] = {"messages": MessagesApi(), "count": CountTokensApi()}
#: codes that must say which part of the request they refuse
NAMED = {"invalid_request", "unsupported_field", "caller_url_forbidden"}
URLS = [*CALLER_URLS, "evidence:ev_abc123", "evidence:ev_", "evidence:../x", ""]

# ------------------------------------------------------------------ strategies
#
# Each strategy takes ``noisy``: clean, it builds bodies the planner should
# mostly accept (roles and blocks agree, values in range); noisy, any value may
# be any JSON, blocks and roles mix, and refused or unknown names appear.

odd_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "[[sim chunks=3]]", "\x00", "🙂", "user", "assistant", "x" * 70]),
)
json_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(), odd_text, st.integers(2**63, 2**70)
    ),
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(odd_text, c, max_size=3)),
    max_leaves=6,
)


def maybe(value: st.SearchStrategy[Any], noisy: bool) -> st.SearchStrategy[Any]:
    """``value``; when noisy, one time in eight any JSON instead."""
    if not noisy:
        return value
    return st.integers(0, 7).flatmap(lambda n: json_values if n == 0 else value)


def pick(good: list[Any], bad: list[Any], noisy: bool) -> st.SearchStrategy[Any]:
    return st.sampled_from(good + bad if noisy else good)


@st.composite
def sources(draw: st.DrawFn, noisy: bool) -> Any:
    kind = draw(pick(["url", "base64"], ["file", None], noisy))
    source: dict[str, Any] = {} if kind is None else {"type": kind}
    if kind == "url" or (noisy and draw(st.integers(0, 4)) == 0):
        source["url"] = draw(maybe(st.sampled_from(URLS), noisy))
    if kind == "base64" or (noisy and draw(st.integers(0, 4)) == 0):
        types = ["image/png", "image/jpeg"]
        source["media_type"] = draw(maybe(pick(types, ["x/y", ""], noisy), noisy))
        data = ["iVBORw0KGgo=", "AAAA" * 8]
        source["data"] = draw(maybe(pick(data, ["", "!!"], noisy), noisy))
    return draw(maybe(st.just(source), noisy))


USER_BLOCKS = ["text", "text", "image", "image", "tool_result"]
ASSISTANT_BLOCKS = ["text", "text", "tool_use", "thinking", "redacted_thinking"]
ODD_BLOCKS = ["document", "server_tool_use", ""]


@st.composite
def blocks(draw: st.DrawFn, role: Any, noisy: bool, depth: int = 0) -> Any:
    good = ASSISTANT_BLOCKS if role == "assistant" else USER_BLOCKS
    if depth:
        good = ["text", "image"]
    kind = draw(pick(good, ASSISTANT_BLOCKS + USER_BLOCKS + ODD_BLOCKS, noisy))
    block: dict[str, Any] = {"type": kind}
    if kind == "text" or (noisy and draw(st.integers(0, 6)) == 0):
        block["text"] = draw(maybe(odd_text, noisy))
    if kind == "image":
        block["source"] = draw(sources(noisy))
    if kind == "tool_use":
        block.update(
            id=draw(maybe(odd_text, noisy)),
            name=draw(maybe(odd_text, noisy)),
            input=draw(json_values),
        )
    if kind == "tool_result":
        block["tool_use_id"] = draw(maybe(odd_text, noisy))
        if depth < 1 and draw(st.booleans()):
            nested = st.lists(blocks(role, noisy, depth + 1), max_size=3)
            block["content"] = draw(st.one_of(odd_text, nested, *([json_values] * noisy)))
        if draw(st.booleans()):
            block["is_error"] = draw(maybe(st.booleans(), noisy))
    if kind == "thinking":
        block.update(thinking=draw(maybe(odd_text, noisy)), signature=draw(maybe(odd_text, noisy)))
    if kind == "redacted_thinking":
        block["data"] = draw(maybe(odd_text, noisy))
    if draw(st.integers(0, 5)) == 0:
        block["cache_control"] = {"type": "ephemeral"}
    if noisy and draw(st.integers(0, 9)) == 0:
        block[draw(st.sampled_from(["citations", "extra", "type"]))] = draw(json_values)
    return draw(maybe(st.just(block), noisy))


@st.composite
def messages(draw: st.DrawFn, noisy: bool) -> Any:
    role = draw(maybe(st.sampled_from(["user", "assistant"]), noisy))
    content = draw(st.one_of(odd_text, st.lists(blocks(role, noisy), min_size=1, max_size=4)))
    message: dict[str, Any] = {"role": role, "content": content}
    if noisy and draw(st.integers(0, 9)) == 0:
        del message[draw(st.sampled_from(["role", "content"]))]
    return draw(maybe(st.just(message), noisy))


@st.composite
def tools(draw: st.DrawFn, noisy: bool) -> Any:
    schema = st.fixed_dictionaries({"type": st.just("object")})
    tool: dict[str, Any] = {
        "name": draw(maybe(odd_text, noisy)),
        "input_schema": draw(st.one_of(schema, json_values) if noisy else schema),
    }
    if draw(st.booleans()):
        odd_types = ["web_search_20250305", "bash_20250124", "mcp"]
        tool["type"] = draw(maybe(pick(["custom"], odd_types, noisy), noisy))
    if draw(st.booleans()):
        tool["description"] = draw(maybe(odd_text, noisy))
    return draw(maybe(st.just(tool), noisy))


def optional(noisy: bool) -> dict[str, st.SearchStrategy[Any]]:
    return {
        "system": st.one_of(
            odd_text,
            st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": odd_text})),
        ),
        "stream": st.booleans(),
        "temperature": st.one_of(st.floats(0, 2), *([st.floats()] * noisy)),
        "top_p": st.floats(0, 1) if not noisy else st.floats(),
        "top_k": st.integers(0 if not noisy else -2, 100),
        "stop_sequences": st.lists(odd_text, max_size=3),
        "tools": st.lists(tools(noisy), max_size=3),
        "tool_choice": st.fixed_dictionaries(
            {"type": pick(["auto", "any", "tool", "none"], ["sometimes"], noisy)},
            optional={"name": odd_text, "disable_parallel_tool_use": st.booleans()},
        ),
        "thinking": st.fixed_dictionaries(
            {"type": pick(["enabled", "disabled"], ["maybe"], noisy)},
            optional={"budget_tokens": st.integers(0 if not noisy else -5, 5000)},
        ),
        "metadata": json_values,
        "service_tier": json_values,
        "cache_control": json_values,
    }


@st.composite
def bodies(draw: st.DrawFn, noisy: bool, counting: bool = False) -> Any:
    if noisy and draw(st.integers(0, 19)) == 0:
        return draw(json_values)
    body: dict[str, Any] = {
        "model": draw(maybe(pick([ALIAS], ["other", "release:x"], noisy), noisy))
    }
    if not counting or (noisy and draw(st.integers(0, 7)) == 0):
        bad = [0, -1, 513, 10**9, True, 1.0]
        body["max_tokens"] = draw(
            maybe(
                st.one_of(st.integers(1, 512), pick([], bad, noisy))
                if noisy
                else st.integers(1, 512),
                noisy,
            )
        )
    body["messages"] = draw(
        maybe(st.lists(messages(noisy), min_size=0 if noisy else 1, max_size=4), noisy)
    )
    fields = optional(noisy)
    for name in draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=5)):
        body[name] = draw(maybe(fields[name], noisy))
    if noisy:
        if draw(st.integers(0, 5)) == 0:
            names = [*sorted(REFUSED), "frobnicate", "n", "logprobs"]
            body[draw(st.sampled_from(names))] = draw(json_values)
        if draw(st.integers(0, 9)) == 0:
            del body[draw(st.sampled_from(sorted(body)))]
    return body


def any_bodies(counting: bool = False) -> st.SearchStrategy[Any]:
    return st.booleans().flatmap(lambda noisy: bodies(noisy, counting))


headers = st.lists(
    st.tuples(
        st.sampled_from([b"anthropic-version", b"anthropic-beta", b"x-other"]),
        st.one_of(
            st.sampled_from([b"2023-06-01", b"2023-06-01", b"june", b"2023-6-1", b"", b"b" * 1025]),
            st.binary(max_size=12),
        ),
    ),
    max_size=2,
).map(tuple)

ALL_MODALITIES: list[Modality] = ["text", "image", "audio", "video"]


@st.composite
def tenants(draw: st.DrawFn) -> Tenant:
    policy = TenantPolicy(
        tenant="acme",
        models={ALIAS: ROUTE},
        endpoints=["messages"],
        modalities=draw(
            st.one_of(
                st.just(ALL_MODALITIES), st.lists(st.sampled_from(ALL_MODALITIES), unique=True)
            )
        ),
        limits=PolicyLimits(
            max_media_parts=draw(st.integers(0, 4)),
            max_prompt_bytes=draw(st.sampled_from([64, 65_536, 65_536])),
            max_output_tokens=512,
        ),
        media=MediaPolicy(
            caller_urls=draw(st.sampled_from(["reject", "drop"])),
            inline_data=draw(st.sampled_from(["reject", "stage"])),
        ),
    )
    return Tenant("acme", policy, resolve_limits(policy.limits, LimitsConfig()))


# ------------------------------------------------------------------ checks


def _caller_urls(body: Any) -> set[str]:
    """Every non-evidence URL string the caller put in an image source."""
    found: set[str] = set()
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return found
    stack: list[Any] = list(body["messages"])
    for _ in range(10_000):  # bounded walk
        if not stack:
            break
        node = stack.pop()
        if isinstance(node, dict):
            source = node.get("source")
            if isinstance(source, dict) and isinstance(source.get("url"), str):
                url = source["url"]
                if len(url) > 8 and not url.startswith("evidence:"):
                    found.add(url)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def check(which: str, body: Any, tenant: Tenant, sent: tuple[tuple[bytes, bytes], ...]) -> None:
    api = APIS[which]
    # What the planner gets is what the body guard parsed from the wire: no
    # integer past 64 bits, no NaN, no lone surrogate (those are invalid_json).
    try:
        body = parse_json(json.dumps(body).encode(), 32)
    except GatewayError as exc:
        assert exc.status == 400, exc.code
        event(f"{which}: refused by the body guard ({exc.code})")
        return
    urls = _caller_urls(body)
    try:
        plan = api.plan(body, PlanContext(tenant, NONCE, sent))
    except GatewayError as exc:
        assert 400 <= exc.status < 500, exc.code
        if exc.code in NAMED and isinstance(body, dict):  # a non-object: the whole body
            assert exc.param, (exc.code, exc.message)
        event(f"{which}: {exc.code}")
        return
    event(f"{which}: planned")
    assert isinstance(body, dict)
    assert plan.alias == body["model"] == ALIAS
    assert plan.prompt_bytes >= 0
    assert len(plan.media) <= tenant.limits.max_media_parts
    if which == "count":
        assert plan.max_tokens is None and plan.stream is False
    else:
        assert plan.max_tokens is not None and plan.max_tokens == body["max_tokens"]
        assert 1 <= plan.max_tokens <= tenant.limits.max_output_tokens
        assert plan.stream is (body.get("stream") is True)
    # Whatever the plan accepted, the worker's body is built: every refusal
    # comes with the plan, before any cost (spec §13).
    forwarded = api.forward(plan, ROUTE)
    assert forwarded["model"] == ROUTE
    text = json.dumps(forwarded, default=str)
    for url in urls:
        assert json.dumps(url)[1:-1] not in text, f"a caller URL forwarded: {url!r}"


# ------------------------------------------------------------------ tests


@budget(300)
@given(body=any_bodies(), tenant=tenants(), sent=headers)
def test_messages_plan_is_a_plan_or_a_gateway_error(
    body: Any, tenant: Tenant, sent: tuple[tuple[bytes, bytes], ...]
) -> None:
    check("messages", body, tenant, sent)


@budget(150)
@given(body=any_bodies(counting=True), tenant=tenants(), sent=headers)
def test_count_tokens_plan_is_a_plan_or_a_gateway_error(
    body: Any, tenant: Tenant, sent: tuple[tuple[bytes, bytes], ...]
) -> None:
    check("count", body, tenant, sent)


def test_a_plain_message_plans() -> None:
    policy = TenantPolicy(tenant="acme", models={ALIAS: ROUTE}, endpoints=["messages"])
    tenant = Tenant("acme", policy, resolve_limits(policy.limits, LimitsConfig()))
    body = {"model": ALIAS, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    plan = MessagesApi().plan(
        body, PlanContext(tenant, NONCE, ((b"anthropic-version", b"2023-06-01"),))
    )
    assert plan.alias == ALIAS and plan.max_tokens == 8
    assert MessagesApi().forward(plan, ROUTE)["model"] == ROUTE
