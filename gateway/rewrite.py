"""Caller request JSON → the body forwarded to the worker. Pure: no I/O.

Three steps, so that all I/O (catalog lookups, staging inline data) happens
between two pure functions and nothing reaches the worker unless every check
passed:

1. :func:`plan_request` validates the parsed body against the allowlist and
   the tenant's limits and lists every media part (:class:`MediaRef`), in
   request order. Caller URLs are refused here, before any I/O.
2. The caller (``proxy.py``) resolves each ref: evidence IDs through the
   tenant-scoped catalog (taking leases), ``data:`` URLs staged when the
   policy says ``inline_data: stage``.
3. :func:`render` checks the resolved media against modality and size limits
   and builds the upstream body: alias → exact route, ``stream: true`` with
   usage requested, ``max_tokens`` explicit, media parts rewritten in place
   or dropped, content-part order otherwise untouched.

Field names and the refused set follow spec §5 and §12 ("Refused request
fields"); anything not on the allowlist is ``unsupported_field``.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.errors import GatewayError
from gateway.policy import Tenant

Endpoint = Literal["chat.completions", "completions"]
MediaKind = Literal["image", "audio", "video"]

_SAMPLING = frozenset(
    {
        "temperature", "top_p", "n", "stop", "presence_penalty", "frequency_penalty",
        "logit_bias", "seed", "user", "top_k", "min_p", "repetition_penalty",
        "dry_multiplier", "dry_base", "dry_allowed_length", "dry_sequence_breakers",
        "grammar", "truncate_sequence",
    }
)  # fmt: skip
_COMMON = frozenset({"model", "stream", "stream_options", "max_tokens"}) | _SAMPLING
CHAT_FIELDS = _COMMON | frozenset(
    {
        "messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools",
        "tool_choice", "parallel_tool_calls", "response_format", "enable_thinking",
        "reasoning_effort", "chat_template_kwargs",
    }
)  # fmt: skip
COMPLETION_FIELDS = _COMMON | frozenset({"prompt", "echo", "best_of", "suffix", "logprobs"})
#: agentic / server-side-tool fields, named so the refusal says why (spec §12)
REFUSED_FIELDS = frozenset(
    {
        "web_search_options", "max_tool_rounds", "enable_shell", "agent_permission",
        "code_execution_permission", "session_id", "files", "adapter",
    }
)  # fmt: skip
_MESSAGE_FIELDS = frozenset(
    {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"}
)
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_MEDIA_PART = {"image_url": "image", "audio_url": "audio", "video_url": "video"}
_EVIDENCE_URL = re.compile(r"evidence:(ev_[A-Za-z0-9]{1,64})")
_CHAT_TEMPLATE_KWARGS = frozenset({"enable_thinking", "reasoning_effort"})


@dataclass(frozen=True, slots=True)
class MediaRef:
    """One media part of the request, by position."""

    flat_index: int  # index in the flattened sequence of all content parts (receipt)
    message: int
    part: int
    kind: MediaKind
    source: Literal["evidence", "data"]
    evidence_id: str | None = None
    data_url: str | None = None  # only for source == "data"


@dataclass(frozen=True, slots=True)
class ResolvedMedia:
    """What the worker will see for one MediaRef (built from verified bytes)."""

    url: str  # data:…;base64,… or file://<prefix>/<sha256>.<ext>
    modality: str
    media_type: str
    size: int
    evidence_id: str
    sha256: str
    locator_sha256: str | None


@dataclass(slots=True)
class RequestPlan:
    endpoint: Endpoint
    body: dict[str, Any]
    alias: str
    stream: bool
    include_usage: bool
    max_tokens: int
    prompt_bytes: int
    tools_requested: bool
    media: list[MediaRef] = field(default_factory=list)
    dropped_parts: list[int] = field(default_factory=list)


def _bad(code: str, message: str, param: str | None = None) -> GatewayError:
    return GatewayError(code, message, param=param)


def json_depth_ok(value: Any, limit: int) -> bool:
    """Iterative depth check (no recursion on hostile nesting)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return False
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, dict | list))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, dict | list))
    return True


def _check_fields(body: Mapping[str, Any], allowed: frozenset[str]) -> None:
    for name in body:
        if name in REFUSED_FIELDS:
            raise _bad("unsupported_field", f"Field '{name}' is not supported here.", name)
        if name not in allowed:
            raise _bad("unsupported_field", "A request field is not supported here.", None)


def _max_tokens(body: dict[str, Any], tenant: Tenant) -> int:
    values = [body[k] for k in ("max_tokens", "max_completion_tokens") if body.get(k) is not None]
    limit = tenant.limits.max_output_tokens
    if not values:
        return limit
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in values):
        raise _bad("invalid_request", "max_tokens must be a positive integer.", "max_tokens")
    if len(set(values)) > 1:
        raise _bad("invalid_request", "max_tokens and max_completion_tokens differ.", "max_tokens")
    value: int = values[0]
    if value > limit:
        raise _bad(
            "output_tokens_exceeded",
            f"max_tokens exceeds this tenant's limit of {limit}.",
            "max_tokens",
        )
    return value


def _stream_flags(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("invalid_request", "stream must be a boolean.", "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise _bad("invalid_request", "stream_options is malformed.", "stream_options")
        include_usage = options.get("include_usage", False) is True
    return stream, include_usage


def _classify_url(url: str) -> Literal["evidence", "data", "caller"]:
    if _EVIDENCE_URL.fullmatch(url):
        return "evidence"
    # Any whitespace or case trick around a data: URL is still inline data.
    if "".join(url.split()).lower().startswith("data:"):
        return "data"
    return "caller"


def _plan_media_part(
    part: dict[str, Any], kind: MediaKind, flat: int, mi: int, pi: int, tenant: Tenant
) -> MediaRef | None:
    """A MediaRef for the part, or None when the policy drops it."""
    key = f"{kind}_url"
    inner = part.get(key)
    if (
        not isinstance(inner, dict)
        or set(part) != {"type", key}
        or not isinstance(inner.get("url"), str)
        or set(inner) - {"url", "detail"}
    ):
        raise _bad("invalid_request", f"A {key} part is malformed.", "messages")
    url: str = inner["url"]
    source = _classify_url(url)
    media = tenant.policy.media
    if source != "caller" and not tenant.allows_modality(kind):
        # Before any evidence lookup, decoding or staging.
        raise _bad("modality_not_allowed", f"The {kind} modality is not allowed.", "messages")
    if source == "evidence":
        match = _EVIDENCE_URL.fullmatch(url)
        assert match is not None
        return MediaRef(flat, mi, pi, kind, "evidence", evidence_id=match.group(1))
    if source == "data" and media.inline_data == "stage":
        return MediaRef(flat, mi, pi, kind, "data", data_url=url)
    if media.caller_urls == "drop":
        return None
    raise _bad(
        "caller_url_forbidden",
        "Media must be referenced as evidence:<id>; caller URLs are not forwarded.",
        "messages",
    )


def _plan_messages(
    messages: Any, tenant: Tenant, plan: RequestPlan
) -> tuple[int, list[tuple[int, int]]]:
    """Validate messages; fill plan.media/dropped_parts; return prompt bytes and drops."""
    if not isinstance(messages, list) or not messages:
        raise _bad("invalid_request", "messages must be a non-empty array.", "messages")
    prompt_bytes = 0
    flat = 0
    drops: list[tuple[int, int]] = []
    for mi, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) - _MESSAGE_FIELDS:
            raise _bad("invalid_request", "A message is malformed.", "messages")
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLES:  # an unhashable role is no role
            raise _bad("invalid_request", "A message role is not supported.", "messages")
        content = message.get("content")
        if isinstance(content, str):
            prompt_bytes += len(content.encode("utf-8", "surrogatepass"))
        elif isinstance(content, list):
            for pi, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise _bad("invalid_request", "A content part is malformed.", "messages")
                ptype = part["type"]
                if ptype == "text":
                    text = part.get("text")
                    if not isinstance(text, str) or set(part) != {"type", "text"}:
                        raise _bad("invalid_request", "A text part is malformed.", "messages")
                    prompt_bytes += len(text.encode("utf-8", "surrogatepass"))
                elif ptype in _MEDIA_PART:
                    if role != "user":
                        raise _bad("invalid_request", "Media parts need role user.", "messages")
                    kind: MediaKind = _MEDIA_PART[ptype]  # type: ignore[assignment]
                    ref = _plan_media_part(part, kind, flat, mi, pi, tenant)
                    if ref is None:
                        plan.dropped_parts.append(flat)
                        drops.append((mi, pi))
                    else:
                        plan.media.append(ref)
                else:
                    raise _bad("invalid_request", "A content part type is not supported.")
                flat += 1
        elif content is None:
            if role != "assistant" or not message.get("tool_calls"):
                raise _bad("invalid_request", "A message has no content.", "messages")
        else:
            raise _bad("invalid_request", "Message content must be a string or array.")
        for extra in ("tool_calls", "name", "tool_call_id", "reasoning_content"):
            if extra in message:
                prompt_bytes += _json_size(message[extra])
    return prompt_bytes, drops


def _json_size(value: Any) -> int:
    """A cheap size estimate for non-text prompt material (tool calls, schemas)."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, dict):
        return sum(len(str(k)) + _json_size(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(_json_size(v) for v in value)
    return 8


def _check_tools(body: Mapping[str, Any]) -> bool:
    tools = body.get("tools")
    if tools is None:
        return False
    if not isinstance(tools, list):
        raise _bad("invalid_request", "tools must be an array.", "tools")
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise _bad("unsupported_field", "Only function tools are supported.", "tools")
    return bool(tools)


def _check_chat_extras(body: Mapping[str, Any]) -> None:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and (not isinstance(kwargs, dict) or set(kwargs) - _CHAT_TEMPLATE_KWARGS):
        raise _bad("unsupported_field", "chat_template_kwargs key not supported.")
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad("invalid_request", "Only n = 1 is supported.", "n")


def plan_request(
    endpoint: Endpoint, body: Any, tenant: Tenant, aliases: Mapping[str, str]
) -> RequestPlan:
    """Step 1: validate a parsed request body for a tenant (see module docstring)."""
    if not isinstance(body, dict):
        raise _bad("invalid_request", "The request body must be a JSON object.")
    _check_fields(body, CHAT_FIELDS if endpoint == "chat.completions" else COMPLETION_FIELDS)
    alias = body.get("model")
    if not isinstance(alias, str):
        raise _bad("invalid_request", "model is required.", "model")
    if alias not in aliases:
        raise GatewayError("model_not_found", param="model")
    stream, include_usage = _stream_flags(body)
    plan = RequestPlan(
        endpoint=endpoint,
        body=body,
        alias=alias,
        stream=stream,
        include_usage=include_usage,
        max_tokens=_max_tokens(body, tenant),
        prompt_bytes=0,
        tools_requested=False,
    )
    if endpoint == "chat.completions":
        _check_chat_extras(body)
        plan.tools_requested = _check_tools(body)
        prompt_bytes, drops = _plan_messages(body.get("messages"), tenant, plan)
        prompt_bytes += _json_size(body.get("tools") or [])
        if drops:
            plan.body = _without_parts(body, drops)
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise _bad("invalid_request", "prompt must be a string.", "prompt")
        if body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
            raise _bad("invalid_request", "Only one choice is supported.", "n")
        prompt_bytes = len(prompt.encode("utf-8", "surrogatepass"))
    if prompt_bytes > tenant.limits.max_prompt_bytes:
        raise _bad("prompt_too_large", "The prompt exceeds this tenant's limit.", None)
    plan.prompt_bytes = prompt_bytes
    if len(plan.media) > tenant.limits.max_media_parts:
        raise _bad("media_limit_exceeded", "Too many media parts.", "messages")
    return plan


def _without_parts(body: dict[str, Any], drops: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """Copy of body with the dropped parts removed; plan indices are remapped by render."""
    out = dict(body)
    messages = [dict(m) for m in body["messages"]]
    dropped: dict[int, set[int]] = {}
    for mi, pi in drops:
        dropped.setdefault(mi, set()).add(pi)
    for mi, parts in dropped.items():
        content = messages[mi]["content"]
        messages[mi]["content"] = [
            # A removed part leaves a marker so MediaRef positions stay valid until render.
            _DROPPED if i in parts else p
            for i, p in enumerate(content)
        ]
    out["messages"] = messages
    return out


_DROPPED: dict[str, Any] = {"type": "__dropped__"}


def decode_data_url(url: str, max_bytes: int) -> tuple[str | None, bytes]:
    """(declared media type, bytes) of a base64 ``data:`` URL, bounded before decoding."""
    compact = "".join(url.split())
    head, sep, payload = compact.partition(",")
    if not sep or not head.lower().startswith("data:") or not head.lower().endswith(";base64"):
        raise _bad("invalid_request", "Inline data must be a base64 data: URL.", "messages")
    if len(payload) > (max_bytes * 4) // 3 + 4:
        raise _bad("media_limit_exceeded", "Inline media exceeds this tenant's limit.")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _bad("invalid_request", "Inline data is not valid base64.", "messages") from exc
    mime = head[5:-7] or None
    return mime, data


def render(
    plan: RequestPlan,
    resolved: Sequence[ResolvedMedia],
    *,
    route: str,
    tenant: Tenant,
    max_request_bytes: int,
    dumps: Callable[[Any], bytes],
) -> bytes:
    """Step 3: the exact bytes forwarded to the worker."""
    pending = plan.media
    if len(resolved) != len(pending):
        raise ValueError("every pending media ref needs exactly one resolution")
    total = 0
    body = dict(plan.body)
    if plan.endpoint == "chat.completions":
        messages = [dict(m) for m in body["messages"]]
        touched: dict[int, list[Any]] = {}
        for ref, media in zip(pending, resolved, strict=True):
            if media.modality != ref.kind:
                raise _bad(
                    "modality_not_allowed",
                    f"A {ref.kind}_url part refers to {media.modality} evidence.",
                    "messages",
                )
            total += media.size
            parts = touched.setdefault(ref.message, list(messages[ref.message]["content"]))
            key = f"{ref.kind}_url"
            parts[ref.part] = {"type": key, key: {"url": media.url}}
        for mi, parts in touched.items():
            messages[mi]["content"] = parts
        for message in messages:
            content = message.get("content")
            if isinstance(content, list) and any(p is _DROPPED for p in content):
                message["content"] = [p for p in content if p is not _DROPPED]
        body["messages"] = messages
        body.pop("max_completion_tokens", None)
    if total > tenant.limits.max_media_bytes:
        raise _bad("media_limit_exceeded", "Media exceeds this tenant's byte limit.", "messages")
    body["model"] = route
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    body["max_tokens"] = plan.max_tokens
    try:
        out = dumps(body)
    except (TypeError, ValueError) as exc:
        # Values JSON cannot carry on the wire (lone surrogates, integers past 64 bits).
        raise _bad(
            "invalid_request", "The request contains values that cannot be encoded."
        ) from exc
    if len(out) > max_request_bytes:
        raise _bad("media_limit_exceeded", "The request would exceed the worker's body limit.")
    return out


def media_modalities(plan: RequestPlan) -> list[str]:
    """Media kinds that count toward the admission weight (dropped parts do not)."""
    return [m.kind for m in plan.media]
