"""The pure rewriter: plan_request (allowlist, limits, caller URLs) and render."""

from __future__ import annotations

import base64
import hashlib
from typing import Any, Literal

import orjson
import pytest

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
from tests.apis.support import (
    REFUSED_FIELDS,
    MediaRef,
    RequestPlan,
    ResolvedMedia,
    data_url_parts,
    inline_size,
    plan_request,
    render,
)
from tests.support.urls import CALLER_URLS, PNG_DATA_URL

ROUTE = "/srv/mosaic-models/" + "ab" * 32
ALIAS = "gemma-4-mm"
ALIASES = {ALIAS: ROUTE}
ALL: list[Modality] = ["text", "image", "audio", "video"]


def make_tenant(
    *,
    caller_urls: Literal["reject", "drop"] = "reject",
    inline_data: Literal["reject", "stage"] = "reject",
    modalities: list[Modality] | None = None,
    max_prompt_bytes: int | None = None,
    max_media_parts: int | None = None,
    max_media_bytes: int | None = None,
    max_output_tokens: int | None = 512,
) -> Tenant:
    policy = TenantPolicy(
        tenant="acme",
        models=dict(ALIASES),
        modalities=ALL if modalities is None else modalities,
        limits=PolicyLimits(
            max_prompt_bytes=max_prompt_bytes,
            max_media_parts=max_media_parts,
            max_media_bytes=max_media_bytes,
            max_output_tokens=max_output_tokens,
        ),
        media=MediaPolicy(caller_urls=caller_urls, inline_data=inline_data),
    )
    return Tenant("acme", policy, resolve_limits(policy.limits, LimitsConfig()))


TENANT = make_tenant()


def part(kind: str, url: str) -> dict[str, Any]:
    key = f"{kind}_url"
    return {"type": key, key: {"url": url}}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def chat(*content: dict[str, Any], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": ALIAS,
        "messages": [{"role": "user", "content": list(content)}],
    }
    body.update(extra)
    return body


def refused(body: Any, tenant: Tenant = TENANT, endpoint: Any = "chat.completions") -> str:
    with pytest.raises(GatewayError) as info:
        plan_request(endpoint, body, tenant, ALIASES)
    return info.value.code


def resolved(kind: str, evidence_id: str, size: int = 10, mime: str = "") -> ResolvedMedia:
    media_type = mime or {"image": "image/png", "audio": "audio/wav", "video": "video/mp4"}[kind]
    digest = hashlib.sha256(evidence_id.encode()).hexdigest()
    return ResolvedMedia(
        url=f"data:{media_type};base64,{evidence_id}",
        modality=kind,
        media_type=media_type,
        size=size,
        evidence_id=evidence_id,
        sha256=digest,
        locator_sha256=None,
    )


def do_render(
    plan: RequestPlan,
    media: list[ResolvedMedia],
    tenant: Tenant = TENANT,
    max_request_bytes: int = 52_428_800,
) -> dict[str, Any]:
    out = render(
        plan,
        media,
        route=ROUTE,
        tenant=tenant,
        max_request_bytes=max_request_bytes,
        dumps=orjson.dumps,
    )
    body: dict[str, Any] = orjson.loads(out)
    return body


def render_code(
    plan: RequestPlan,
    media: list[ResolvedMedia],
    tenant: Tenant = TENANT,
    max_request_bytes: int = 52_428_800,
) -> str:
    with pytest.raises(GatewayError) as info:
        do_render(plan, media, tenant, max_request_bytes)
    return info.value.code


# ------------------------------------------------------------------ allowlist


@pytest.mark.parametrize("name", sorted(REFUSED_FIELDS))
def test_refused_fields(name: str) -> None:
    with pytest.raises(GatewayError) as info:
        plan_request("chat.completions", chat(text("hi"), **{name: True}), TENANT, ALIASES)
    assert info.value.code == "unsupported_field"
    assert info.value.param == name


@pytest.mark.parametrize("name", sorted(REFUSED_FIELDS))
def test_refused_fields_on_completions(name: str) -> None:
    body = {"model": ALIAS, "prompt": "hi", name: True}
    assert refused(body, endpoint="completions") == "unsupported_field"


def test_the_named_refused_set_matches_the_spec() -> None:
    assert {
        "web_search_options",
        "max_tool_rounds",
        "enable_shell",
        "agent_permission",
        "code_execution_permission",
        "session_id",
        "files",
        "adapter",
    } <= REFUSED_FIELDS


@pytest.mark.parametrize("name", ["frobnicate", "Messages", "mcp_servers", "lora"])
def test_unknown_field(name: str) -> None:
    assert refused(chat(text("hi"), **{name: 1})) == "unsupported_field"


@pytest.mark.parametrize("kind", ["web_search", "code_interpreter", "mcp", "shell", None])
def test_non_function_tools(kind: str | None) -> None:
    tool: dict[str, Any] = {"function": {"name": "f", "parameters": {}}}
    if kind is not None:
        tool["type"] = kind
    assert refused(chat(text("hi"), tools=[tool])) == "unsupported_field"


def test_function_tools_are_allowed() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    plan = plan_request("chat.completions", chat(text("hi"), tools=[tool]), TENANT, ALIASES)
    assert plan.tools_requested is True


def test_sampling_extensions_pass_through() -> None:
    body = chat(text("hi"), top_k=5, min_p=0.1, repetition_penalty=1.1, dry_multiplier=0.5)
    out = do_render(plan_request("chat.completions", body, TENANT, ALIASES), [])
    assert (out["top_k"], out["min_p"], out["repetition_penalty"]) == (5, 0.1, 1.1)
    assert out["dry_multiplier"] == 0.5


# --------------------------------------------------------------------- models


@pytest.mark.parametrize("alias", ["other-model", "default", ROUTE, ""])
def test_model_not_found(alias: str) -> None:
    body = chat(text("hi"))
    body["model"] = alias
    assert refused(body) == "model_not_found"


# ----------------------------------------------------------------- max_tokens


def test_max_tokens_absent_gets_the_tenant_limit() -> None:
    plan = plan_request("chat.completions", chat(text("hi")), TENANT, ALIASES)
    assert plan.max_tokens == 512
    assert do_render(plan, [])["max_tokens"] == 512


def test_max_tokens_at_the_limit_is_kept() -> None:
    plan = plan_request("chat.completions", chat(text("hi"), max_tokens=512), TENANT, ALIASES)
    assert plan.max_tokens == 512


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_above_the_limit(field: str) -> None:
    assert refused(chat(text("hi"), **{field: 513})) == "output_tokens_exceeded"


def test_max_completion_tokens_becomes_max_tokens() -> None:
    body = chat(text("hi"), max_completion_tokens=7)
    out = do_render(plan_request("chat.completions", body, TENANT, ALIASES), [])
    assert out["max_tokens"] == 7
    assert "max_completion_tokens" not in out


def test_both_max_tokens_fields_differing() -> None:
    body = chat(text("hi"), max_tokens=5, max_completion_tokens=6)
    assert refused(body) == "invalid_request"


def test_both_max_tokens_fields_equal() -> None:
    body = chat(text("hi"), max_tokens=6, max_completion_tokens=6)
    assert plan_request("chat.completions", body, TENANT, ALIASES).max_tokens == 6


@pytest.mark.parametrize("value", [0, -1, 1.5, "10", True])
def test_max_tokens_must_be_a_positive_integer(value: Any) -> None:
    assert refused(chat(text("hi"), max_tokens=value)) == "invalid_request"


# --------------------------------------------------------------------- limits


def test_prompt_bytes_limit() -> None:
    tenant = make_tenant(max_prompt_bytes=10)
    plan = plan_request("chat.completions", chat(text("0123456789")), tenant, ALIASES)
    assert plan.prompt_bytes == 10
    assert refused(chat(text("0123456789a")), tenant) == "prompt_too_large"
    # Bytes, not characters: five two-byte characters are ten bytes.
    assert refused(chat(text("é" * 5), text("x")), tenant) == "prompt_too_large"


def test_prompt_bytes_limit_on_completions() -> None:
    tenant = make_tenant(max_prompt_bytes=4)
    body = {"model": ALIAS, "prompt": "12345"}
    assert refused(body, tenant, endpoint="completions") == "prompt_too_large"


def test_media_parts_count_limit() -> None:
    tenant = make_tenant(max_media_parts=2)
    two = chat(part("image", "evidence:ev_a"), part("audio", "evidence:ev_b"))
    assert len(plan_request("chat.completions", two, tenant, ALIASES).media) == 2
    three = chat(
        part("image", "evidence:ev_a"),
        part("audio", "evidence:ev_b"),
        part("video", "evidence:ev_c"),
    )
    assert refused(three, tenant) == "media_limit_exceeded"


def test_no_media_parts_allowed_at_zero() -> None:
    tenant = make_tenant(max_media_parts=0)
    assert refused(chat(part("image", "evidence:ev_a")), tenant) == "media_limit_exceeded"


# ----------------------------------------------------------- order and refs


def test_content_part_order_is_preserved() -> None:
    content = [
        text("first"),
        part("image", "evidence:ev_img"),
        text("second"),
        part("audio", "evidence:ev_aud"),
        part("video", "evidence:ev_vid"),
        text("third"),
    ]
    body = {
        "model": ALIAS,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": content},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [part("image", "evidence:ev_two"), text("last")]},
        ],
    }
    plan = plan_request("chat.completions", body, TENANT, ALIASES)
    # positions in the flattened sequence of content parts, in request order
    assert [(m.kind, m.evidence_id, m.slot, m.flat_index) for m in plan.media] == [
        ("image", "ev_img", 0, 1),
        ("audio", "ev_aud", 1, 3),
        ("video", "ev_vid", 2, 4),
        ("image", "ev_two", 3, 6),
    ]
    assert [m.flat_index for m in plan.media] == [1, 3, 4, 6]
    media = [
        resolved("image", "ev_img"),
        resolved("audio", "ev_aud"),
        resolved("video", "ev_vid"),
        resolved("image", "ev_two"),
    ]
    out = do_render(plan, media)
    assert out["messages"][0] == {"role": "system", "content": "be brief"}
    assert out["messages"][2] == {"role": "assistant", "content": "ok"}
    assert out["messages"][1]["content"] == [
        text("first"),
        part("image", media[0].url),
        text("second"),
        part("audio", media[1].url),
        part("video", media[2].url),
        text("third"),
    ]
    assert out["messages"][3]["content"] == [part("image", media[3].url), text("last")]
    # The caller's body is not changed in place.
    assert content[1] == part("image", "evidence:ev_img")


def test_render_requires_one_resolution_per_pending_ref() -> None:
    plan = plan_request("chat.completions", chat(part("image", "evidence:ev_a")), TENANT, ALIASES)
    with pytest.raises(ValueError, match="exactly one"):
        do_render(plan, [])


def test_detail_is_not_forwarded() -> None:
    body = chat({"type": "image_url", "image_url": {"url": "evidence:ev_a", "detail": "high"}})
    plan = plan_request("chat.completions", body, TENANT, ALIASES)
    out = do_render(plan, [resolved("image", "ev_a")])
    assert out["messages"][0]["content"] == [part("image", resolved("image", "ev_a").url)]


# ---------------------------------------------------------------- caller URLs


@pytest.mark.parametrize("url", CALLER_URLS)
@pytest.mark.parametrize("kind", ["image", "audio", "video"])
def test_caller_urls_are_forbidden(url: str, kind: str) -> None:
    assert refused(chat(text("look"), part(kind, url))) == "caller_url_forbidden"


@pytest.mark.parametrize("url", ["DATA:image/png;base64,AAAA", " data:image/png;base64,AAAA"])
def test_data_url_tricks_are_forbidden_without_staging(url: str) -> None:
    assert refused(chat(part("image", url))) == "caller_url_forbidden"


def test_a_caller_url_after_an_evidence_part_is_still_forbidden() -> None:
    body = chat(part("image", "evidence:ev_a"), part("image", "https://example.com/a.png"))
    assert refused(body) == "caller_url_forbidden"


@pytest.mark.parametrize("url", CALLER_URLS)
def test_caller_urls_are_dropped_under_drop(url: str) -> None:
    tenant = make_tenant(caller_urls="drop")
    body = {
        "model": ALIAS,
        "messages": [
            {"role": "user", "content": [text("a"), part("image", "evidence:ev_a")]},
            {"role": "assistant", "content": "ok"},
            {
                "role": "user",
                "content": [text("b"), part("image", url), part("audio", "evidence:ev_b")],
            },
        ],
    }
    plan = plan_request("chat.completions", body, tenant, ALIASES)
    # Flat indices: [text a, image a] + [text b, caller URL, audio b].
    assert plan.dropped_parts == [3]
    assert [m.evidence_id for m in plan.media] == ["ev_a", "ev_b"]
    media = [resolved("image", "ev_a"), resolved("audio", "ev_b")]
    out = do_render(plan, media, tenant)
    assert out["messages"][0]["content"] == [text("a"), part("image", media[0].url)]
    assert out["messages"][2]["content"] == [text("b"), part("audio", media[1].url)]
    assert url not in orjson.dumps(out).decode()


def test_drop_lists_every_dropped_index_in_order() -> None:
    tenant = make_tenant(caller_urls="drop")
    body = chat(
        part("image", "https://a.example/1.png"),
        text("x"),
        part("video", "file:///v.mp4"),
        part("audio", "evidence:ev_a"),
        part("image", PNG_DATA_URL),
    )
    plan = plan_request("chat.completions", body, tenant, ALIASES)
    assert plan.dropped_parts == [0, 2, 4]
    out = do_render(plan, [resolved("audio", "ev_a")], tenant)
    assert out["messages"][0]["content"] == [
        text("x"),
        part("audio", resolved("audio", "ev_a").url),
    ]


def test_dropped_parts_do_not_count_toward_the_media_limit() -> None:
    tenant = make_tenant(caller_urls="drop", max_media_parts=1)
    body = chat(part("image", "https://a.example/1.png"), part("image", "evidence:ev_a"))
    plan = plan_request("chat.completions", body, tenant, ALIASES)
    assert plan.dropped_parts == [0]
    assert len(plan.media) == 1


def test_inline_data_staged_becomes_a_pending_ref() -> None:
    tenant = make_tenant(inline_data="stage")
    body = chat(text("t"), part("image", PNG_DATA_URL), part("audio", "evidence:ev_b"))
    plan = plan_request("chat.completions", body, tenant, ALIASES)
    assert plan.dropped_parts == []
    assert [(m.source, m.flat_index) for m in plan.media] == [
        ("data", 1),
        ("evidence", 2),
    ]
    assert plan.media[0].data_url == PNG_DATA_URL
    assert plan.media[0].evidence_id is None
    out = do_render(plan, [resolved("image", "ev_new"), resolved("audio", "ev_b")], tenant)
    assert out["messages"][0]["content"][1] == part("image", resolved("image", "ev_new").url)


def test_inline_data_staged_still_refuses_other_caller_urls() -> None:
    tenant = make_tenant(inline_data="stage")
    assert refused(chat(part("image", "https://example.com/a.png")), tenant) == (
        "caller_url_forbidden"
    )


def test_inline_stage_with_drop_keeps_data_and_drops_urls() -> None:
    tenant = make_tenant(inline_data="stage", caller_urls="drop")
    body = chat(part("image", "http://x/a.png"), part("image", PNG_DATA_URL))
    plan = plan_request("chat.completions", body, tenant, ALIASES)
    assert plan.dropped_parts == [0]
    assert [m.source for m in plan.media] == ["data"]


def test_inline_data_size_and_type_are_known_before_decoding() -> None:
    mime, payload = data_url_parts(PNG_DATA_URL)
    data = base64.b64decode(payload)
    assert mime == "image/png" and data.startswith(b"\x89PNG")
    assert inline_size(PNG_DATA_URL, "messages") == len(data)
    for bad in ("data:image/png;base64,!!!!", "data:image/png,rawbytes", "data:;base64,AAA"):
        with pytest.raises(GatewayError) as info:
            inline_size(bad, "messages")
        assert info.value.code == "invalid_request"


def test_inline_data_over_the_byte_limit_is_refused_from_its_length() -> None:
    tenant = make_tenant(inline_data="stage", max_media_bytes=1000)
    plan = plan_request(
        "chat.completions", chat(part("image", "data:image/png;base64," + "A" * 4000)), tenant
    )
    assert plan.media[0].inline_bytes == 3000
    assert render_code(plan, [resolved("image", "ev_x", 3000)], tenant) == "media_limit_exceeded"


def test_media_parts_need_the_user_role() -> None:
    body = {
        "model": ALIAS,
        "messages": [{"role": "system", "content": [part("image", "evidence:ev_a")]}],
    }
    assert refused(body) == "invalid_request"


# --------------------------------------------------------------------- render


@pytest.mark.parametrize(
    ("kind", "evidence"), [("image", "audio"), ("audio", "video"), ("video", "image")]
)
def test_render_modality_mismatch(kind: str, evidence: str) -> None:
    plan = plan_request("chat.completions", chat(part(kind, "evidence:ev_a")), TENANT, ALIASES)
    assert render_code(plan, [resolved(evidence, "ev_a")]) == "modality_not_allowed"


@pytest.mark.parametrize("url", ["evidence:ev_a", PNG_DATA_URL])
def test_modality_outside_the_tenant_is_refused_when_planning(url: str) -> None:
    # At planning: before any evidence lookup, decoding or staging happens.
    tenant = make_tenant(modalities=["text", "image"], inline_data="stage")
    assert refused(chat(part("audio", url)), tenant) == "modality_not_allowed"


def test_render_media_byte_limit() -> None:
    tenant = make_tenant(max_media_bytes=100)
    body = chat(part("image", "evidence:ev_a"), part("audio", "evidence:ev_b"))
    plan = plan_request("chat.completions", body, tenant, ALIASES)
    ok = do_render(plan, [resolved("image", "ev_a", 50), resolved("audio", "ev_b", 50)], tenant)
    assert len(ok["messages"][0]["content"]) == 2
    over = [resolved("image", "ev_a", 50), resolved("audio", "ev_b", 51)]
    assert render_code(plan, over, tenant) == "media_limit_exceeded"


def test_render_forwarded_body_limit() -> None:
    plan = plan_request("chat.completions", chat(part("image", "evidence:ev_a")), TENANT, ALIASES)
    media = [resolved("image", "ev_a")]
    size = len(
        render(plan, media, route=ROUTE, tenant=TENANT, max_request_bytes=10**6, dumps=orjson.dumps)
    )
    assert do_render(plan, media, max_request_bytes=size)["model"] == ROUTE
    assert render_code(plan, media, max_request_bytes=size - 1) == "media_limit_exceeded"


def test_render_rewrites_model_stream_and_usage() -> None:
    body = chat(text("hi"), stream=False, stream_options={"include_usage": False})
    plan = plan_request("chat.completions", body, TENANT, ALIASES)
    assert (plan.stream, plan.include_usage) == (False, False)
    out = do_render(plan, [])
    assert out["model"] == ROUTE
    assert out["stream"] is True
    assert out["stream_options"] == {"include_usage": True}
    assert out["max_tokens"] == 512
    assert plan.alias == ALIAS


def test_render_completions() -> None:
    body = {"model": ALIAS, "prompt": "once", "max_tokens": 9, "stream": True}
    plan = plan_request("completions", body, TENANT, ALIASES)
    out = do_render(plan, [])
    assert out == {
        "model": ROUTE,
        "prompt": "once",
        "max_tokens": 9,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_completions_refuse_chat_fields() -> None:
    body = {"model": ALIAS, "prompt": "x", "messages": []}
    assert refused(body, endpoint="completions") == "unsupported_field"


def test_media_ref_fields() -> None:
    plan = plan_request("chat.completions", chat(part("video", "evidence:ev_v")), TENANT, ALIASES)
    assert plan.media == [MediaRef(0, 0, "video", "evidence", evidence_id="ev_v")]
