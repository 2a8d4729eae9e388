"""Fuzz the pure rewriter: plan_request + render on generated request JSON.

Properties (spec §1.2, §5, §6):

- the only exception is :class:`GatewayError`, always with a 4xx status;
- a rendered body's media parts carry only the ``data:`` URLs built from the
  resolutions we pass, one each, in order: never a URL the caller wrote;
- the rendered body always names the exact route, asks for a stream with
  usage, and bounds ``max_tokens`` by the tenant's limit.
"""

from __future__ import annotations

import base64
import hashlib
import json
import string
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

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
from tests.apis.support import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    REFUSED_FIELDS,
    Endpoint,
    MediaRef,
    ResolvedMedia,
    plan_request,
    render,
)
from tests.fuzz.budget import budget
from tests.support.urls import CALLER_URLS as SHARED_CALLER_URLS

pytestmark = pytest.mark.fuzz

ROUTE = "/srv/mosaic-models/" + "cd" * 32
ALIAS = "gemma-4-mm"
ALIASES = {ALIAS: ROUTE}
MEDIA_KEYS = ("image_url", "audio_url", "video_url")
MIMES = {"image": "image/png", "audio": "audio/wav", "video": "video/mp4"}

# ------------------------------------------------------------------ strategies

ODD = [
    "",
    "\x00",
    "\ufeff",
    "\u202e",
    "e\u0301",
    "🙂",
    "\ud800",
    "\udfff",
    "\ud83d",
    "\r\n\t",
    "\u2028",
    "[[sim fault=close_mid]]",
]
#: the shared caller URLs, plus malformed evidence references
CALLER_URLS = [
    *SHARED_CALLER_URLS,
    "evidence: ev_abc",
    " evidence:ev_abc",
    "EVIDENCE:ev_abc",
    "evidence:ev_",
    "evidence:ev_abc/../../etc/passwd",
    "evidence:ev_abc?u=http://evil.test",
    "evidence:ev_abc#file:///etc/passwd",
    "evidence:ev_abc\n",
    "evidence:ev_" + "a" * 65,
    "evidence:ev_\uff41\uff42\uff43",  # fullwidth letters
    "evidence:http://evil.test",
]

surrogates = st.integers(0xD800, 0xDFFF).map(chr)
any_char = st.one_of(st.characters(), surrogates)
odd_text = st.one_of(
    st.text(max_size=24),
    st.text(any_char, max_size=24),
    st.sampled_from(ODD),
    st.integers(0, 120_000).map(lambda n: "x" * n),  # huge strings
    st.lists(st.sampled_from(ODD), max_size=6).map("".join),
)
evidence_ids = st.text(string.ascii_letters + string.digits, min_size=1, max_size=64)
evidence_urls = st.one_of(
    evidence_ids.map(lambda s: f"evidence:ev_{s}"),
    st.builds(lambda a, b: f"evidence:ev_{a}{b}", evidence_ids, odd_text),
)
urls = st.one_of(st.sampled_from(CALLER_URLS), evidence_urls, odd_text)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63, max_value=2**80),
    st.floats(),
    odd_text,
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=8), odd_text), children, max_size=4),
    ),
    max_leaves=16,
)


@st.composite
def media_parts(draw: st.DrawFn) -> Any:
    key = draw(st.sampled_from(MEDIA_KEYS))
    inner: Any = {"url": draw(urls)}
    if draw(st.booleans()):
        inner = draw(
            st.one_of(
                st.just({"url": inner["url"], "detail": "high"}),
                st.just({**inner, "extra": 1}),
                st.just({"url": inner}),  # nested
                st.just([inner]),
                json_values,
            )
        )
    part: dict[str, Any] = {"type": draw(st.one_of(st.just(key), json_values)), key: inner}
    if draw(st.integers(0, 9)) == 0:
        part[draw(st.sampled_from([*MEDIA_KEYS, "text", "url"]))] = draw(json_values)
    return part


content_parts = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, odd_text),
    media_parts(),
    media_parts(),
    st.builds(lambda t: {"type": "text", "text": t}, json_values),
    st.builds(lambda t, v: {"type": t, "text": v}, json_values, json_values),
    json_values,
)
roles = st.one_of(
    st.sampled_from(["user", "user", "user", "system", "assistant", "tool", "developer"]),
    json_values,
)


@st.composite
def messages(draw: st.DrawFn) -> Any:
    message: dict[str, Any] = {"role": draw(roles)}
    choice = draw(st.integers(0, 9))
    if choice < 6:
        message["content"] = draw(st.lists(content_parts, max_size=6))
    elif choice < 8:
        message["content"] = draw(odd_text)
    elif choice == 8:
        message["content"] = draw(json_values)
    for extra in ("name", "tool_calls", "tool_call_id", "reasoning_content", "surprise"):
        if draw(st.integers(0, 11)) == 0:
            message[extra] = draw(json_values)
    return message


FIELD_NAMES = [*sorted(CHAT_FIELDS | COMPLETION_FIELDS | REFUSED_FIELDS), "x", "model "]
OPTIONAL_VALUES: dict[str, Any] = {
    "stream": st.one_of(st.booleans(), json_values),
    "stream_options": st.one_of(
        st.just({"include_usage": True}), st.just({"include_usage": False}), json_values
    ),
    "max_tokens": st.one_of(st.integers(-2, 2000), json_values),
    "max_completion_tokens": st.one_of(st.integers(-2, 2000), json_values),
    "tools": st.one_of(
        st.just([{"type": "function", "function": {"name": "f", "parameters": {}}}]), json_values
    ),
    "n": st.one_of(st.just(1), json_values),
    "best_of": st.one_of(st.just(1), json_values),
    "chat_template_kwargs": st.one_of(st.just({"enable_thinking": True}), json_values),
}


@st.composite
def bodies(draw: st.DrawFn, endpoint: Endpoint) -> Any:
    if draw(st.integers(0, 19)) == 0:
        return draw(json_values)  # not even an object
    body: dict[str, Any] = {"model": draw(st.one_of(st.just(ALIAS), st.just(ALIAS), json_values))}
    if endpoint == "chat.completions":
        body["messages"] = draw(st.one_of(st.lists(messages(), max_size=4), json_values))
    else:
        body["prompt"] = draw(st.one_of(odd_text, json_values))
    for name, values in OPTIONAL_VALUES.items():
        if draw(st.integers(0, 5)) == 0:
            body[name] = draw(values)
    if draw(st.integers(0, 7)) == 0:
        body[draw(st.sampled_from(FIELD_NAMES))] = draw(json_values)
    return body


ALL_MODALITIES: list[Modality] = ["text", "image", "audio", "video"]


@st.composite
def tenants(draw: st.DrawFn) -> Tenant:
    policy = TenantPolicy(
        tenant="acme",
        models=dict(ALIASES),
        modalities=draw(st.lists(st.sampled_from(ALL_MODALITIES), unique=True)),
        limits=PolicyLimits(
            max_media_parts=draw(st.integers(0, 8)),
            max_prompt_bytes=draw(st.sampled_from([64, 65_536])),
            max_output_tokens=512,
        ),
        media=MediaPolicy(
            caller_urls=draw(st.sampled_from(["reject", "drop"])),
            inline_data=draw(st.sampled_from(["reject", "stage"])),
        ),
    )
    return Tenant("acme", policy, resolve_limits(policy.limits, LimitsConfig()))


# ------------------------------------------------------------------ checks


def _resolution(ref: MediaRef, index: int, modality: str) -> ResolvedMedia:
    payload = base64.b64encode(f"gateway-built-{index}".encode()).decode()
    return ResolvedMedia(
        url=f"data:{MIMES.get(modality, 'image/png')};base64,{payload}",
        modality=modality,
        media_type=MIMES.get(modality, "image/png"),
        size=10 + index,
        evidence_id=ref.evidence_id or f"ev_staged{index}",
        sha256=hashlib.sha256(str(index).encode()).hexdigest(),
        locator_sha256=None,
    )


def _rejected_as_4xx(exc: GatewayError) -> None:
    assert 400 <= exc.status < 500, exc.code


def check_pipeline(
    endpoint: Endpoint, body: Any, tenant: Tenant, data: st.DataObject, limit: int = 52_428_800
) -> dict[str, Any] | None:
    """plan → resolve (ours) → render; assert the properties; the forwarded body or None."""
    try:
        plan = plan_request(endpoint, body, tenant, ALIASES)
    except GatewayError as exc:
        _rejected_as_4xx(exc)
        return None
    resolved = [
        _resolution(ref, i, data.draw(st.sampled_from([ref.kind, ref.kind, ref.kind, "image"])))
        for i, ref in enumerate(plan.media)
    ]
    try:
        out = render(
            plan, resolved, route=ROUTE, tenant=tenant, max_request_bytes=limit, dumps=orjson.dumps
        )
    except GatewayError as exc:
        _rejected_as_4xx(exc)
        return None
    assert len(out) <= limit
    forwarded: dict[str, Any] = orjson.loads(out)
    assert forwarded["model"] == ROUTE
    assert forwarded["stream"] is True
    assert forwarded["stream_options"] == {"include_usage": True}
    assert 1 <= forwarded["max_tokens"] <= tenant.limits.max_output_tokens
    assert "max_completion_tokens" not in forwarded
    assert set(forwarded) <= (CHAT_FIELDS if endpoint == "chat.completions" else COMPLETION_FIELDS)
    seen: list[str] = []
    for message in forwarded.get("messages", []):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            assert part["type"] in ("text", *MEDIA_KEYS)
            if part["type"] != "text":
                assert set(part) == {"type", part["type"]}
                assert set(part[part["type"]]) == {"url"}
                seen.append(part[part["type"]]["url"])
    # Every media URL the worker sees is one we built, each once, in request order.
    assert seen == [m.url for m in resolved]
    return forwarded


# ------------------------------------------------------------------ tests


@budget(300)
@given(body=bodies("chat.completions"), tenant=tenants(), data=st.data())
def test_chat_rewrite_never_crashes_and_never_forwards_caller_urls(
    body: Any, tenant: Tenant, data: st.DataObject
) -> None:
    check_pipeline("chat.completions", body, tenant, data)


@budget(150)
@given(body=bodies("completions"), tenant=tenants(), data=st.data())
def test_completions_rewrite_never_crashes(body: Any, tenant: Tenant, data: st.DataObject) -> None:
    check_pipeline("completions", body, tenant, data)


@budget(150)
@given(body=bodies("chat.completions"), tenant=tenants(), data=st.data())
def test_wire_bytes_through_parse_plan_render(
    body: Any, tenant: Tenant, data: st.DataObject
) -> None:
    """The real order: bytes → parse_json (depth bound) → plan → render."""
    raw = json.dumps(body, ensure_ascii=data.draw(st.booleans()), allow_nan=True).encode(
        "utf-8", "surrogatepass"
    )
    try:
        parsed = parse_json(raw, data.draw(st.integers(1, 32)))
    except GatewayError as exc:
        _rejected_as_4xx(exc)
        return
    check_pipeline("chat.completions", parsed, tenant, data)


VALID = json.dumps(
    {
        "model": ALIAS,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "evidence:ev_abc"}},
                    {"type": "audio_url", "audio_url": {"url": "https://evil.test/a.wav"}},
                ],
            }
        ],
        "max_tokens": 16,
        "stream": True,
    }
).encode()


@budget(200)
@given(
    cuts=st.lists(st.tuples(st.integers(0, len(VALID)), st.binary(max_size=8)), max_size=6),
    tenant=tenants(),
    data=st.data(),
)
def test_mutated_request_bytes(
    cuts: list[tuple[int, bytes]], tenant: Tenant, data: st.DataObject
) -> None:
    raw = bytearray(VALID)
    for position, insert in cuts:
        raw[position : position + len(insert)] = insert
    try:
        parsed = parse_json(bytes(raw), 32)
    except GatewayError as exc:
        _rejected_as_4xx(exc)
        return
    check_pipeline("chat.completions", parsed, tenant, data)


@budget(100)
@given(tenant=tenants(), data=st.data())
def test_forwarded_body_limit_is_a_clean_refusal(tenant: Tenant, data: st.DataObject) -> None:
    body = {"model": ALIAS, "messages": [{"role": "user", "content": data.draw(odd_text)}]}
    check_pipeline("chat.completions", body, tenant, data, limit=data.draw(st.integers(1, 4096)))


@pytest.mark.parametrize(
    "body",
    [
        {"model": ALIAS, "messages": [{"role": [], "content": "x"}]},
        {"model": ALIAS, "messages": [{"role": {"a": 1}, "content": "x"}]},
        {"model": ALIAS, "messages": [{"role": "user", "content": "\ud800"}]},
        {"model": ALIAS, "messages": [{"role": "user", "content": "x"}], "seed": 2**70},
    ],
    ids=["list_role", "dict_role", "lone_surrogate", "int_past_64_bits"],
)
def test_regressions_found_by_fuzzing(body: dict[str, Any]) -> None:
    """Each once escaped as TypeError (a 500); now a clean 400 invalid_request."""
    tenant = Tenant(
        "acme",
        TenantPolicy(tenant="acme", models=dict(ALIASES)),
        resolve_limits(PolicyLimits(), LimitsConfig()),
    )
    with pytest.raises(GatewayError) as info:
        plan = plan_request("chat.completions", body, tenant, ALIASES)
        render(plan, [], route=ROUTE, tenant=tenant, max_request_bytes=1 << 20, dumps=orjson.dumps)
    assert (info.value.status, info.value.code) == (400, "invalid_request")
