"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` (spec §19): the
Anthropic Messages API for Anthropic SDKs and tools that take
``ANTHROPIC_BASE_URL``. Pure.

Every level of the body is allowlisted like chat's. Planning walks the
messages once: roles (``user``/``assistant``), blocks (``text``, ``image``,
``tool_use``, ``tool_result``, ``thinking``, ``redacted_thinking``), image
sources into media placeholders (``evidence:<id>`` URLs are evidence,
``base64`` sources inline data under ``media.inline_data``, any other URL a
caller URL under ``media.caller_urls``: the worker never fetches one), and the
bytes the worker will tokenize. Server tools, ``container``, ``mcp_servers``
and the worker's agentic extensions are refused naming their ``param``;
``metadata``, ``service_tier`` and ``cache_control`` are dropped.

The message is forwarded to the worker's **chat completions** endpoint,
which the worker's own ``/v1/messages`` converts to anyway (reference §12,
same template, tools and media): its stream is validated by chat's grammar
and reports real usage (the worker's own Anthropic stream reports
``input_tokens: 0``). ``apis/messages/events.py`` turns the validated chunks
into Anthropic events or the Anthropic answer. ``count_tokens`` forwards the
same validated message, in Anthropic form, to the worker's own
``/v1/messages/count_tokens``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from gateway.apis.agents.rewrite import rewrite_messages
from gateway.apis.base import (
    Dialect,
    Endpoint,
    Plan,
    PlanContext,
    StreamBounds,
    check_prompt,
    require_object,
    require_text_modality,
    resolve_alias,
)
from gateway.apis.chat.agentic import AgentDialect, agent_events_asked, plan_agent
from gateway.apis.fields import (
    DROP,
    Spec,
    any_json,
    boolean,
    child,
    enum,
    harmless,
    integer,
    invalid,
    item,
    json_size,
    list_of,
    number,
    obj,
    string,
    text_size,
    unsupported,
)
from gateway.apis.media import check_count, plan_url
from gateway.apis.messages.events import CountTokensDialect, MessagesDialect
from gateway.apis.messages.to_chat import chat_body
from gateway.apis.sampling import ENGINE_SAMPLING, compiled_bytes
from gateway.core.errors import GatewayError

_AGENTIC = "is not supported (agentic and server-side tool features are not served)"
#: top-level names refused outright (server tools' kin and the worker's agentic extensions)
REFUSED: dict[str, str] = {
    name: _AGENTIC
    for name in (
        "container",
        "mcp_servers",
        "session_id",
        "web_search_options",
        "enable_code_execution",
        "agent_permission",
        "code_execution_permission",
        "files",
        "max_tool_rounds",
        "truncate_sequence",
    )
}
_VERSION = re.compile(rb"\d{4}-\d{2}-\d{2}")
_MAX_BETA_BYTES = 1024

_CACHE = {"cache_control": harmless}
_TEXT = obj({"type": string, "text": string, **_CACHE}, required=("text",))
_SOURCE = obj(
    {"type": enum("base64", "url"), "media_type": string, "data": string, "url": string},
    required=("type",),
)
_IMAGE = obj({"type": string, "source": _SOURCE, **_CACHE}, required=("source",))
_TOOL_USE = obj(
    {"type": string, "id": string, "name": string, "input": any_json, **_CACHE},
    required=("id", "name", "input"),
)
_THINKING = obj({"type": string, "thinking": string, "signature": string}, required=("thinking",))
_REDACTED = obj({"type": string, "data": string}, required=("data",))


def _result_content(value: Any, path: str) -> Any:
    if isinstance(value, str):
        return value
    return list_of(_block_of({"text": _TEXT, "image": _IMAGE}))(value, path)


_TOOL_RESULT = obj(
    {
        "type": string,
        "tool_use_id": string,
        "content": _result_content,
        "is_error": boolean,
        **_CACHE,
    },
    required=("tool_use_id",),
)

_BLOCKS: dict[str, Spec] = {
    "text": _TEXT,
    "image": _IMAGE,
    "tool_use": _TOOL_USE,
    "tool_result": _TOOL_RESULT,
    "thinking": _THINKING,
    "redacted_thinking": _REDACTED,
}


def _block_of(specs: dict[str, Spec]) -> Spec:
    def block(value: Any, path: str) -> Any:
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):
            raise invalid(path, "is not a content block")
        spec = specs.get(value["type"])
        if spec is None:
            raise unsupported(child(path, "type"), "is not a supported content block type")
        return spec(value, path)

    return block


def _content(value: Any, path: str) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return list_of(_block_of(_BLOCKS))(value, path)
    raise invalid(path, "must be a string or an array of content blocks")


_MESSAGE = obj(
    {"role": enum("user", "assistant"), "content": _content}, required=("role", "content")
)


def _system(value: Any, path: str) -> Any:
    if isinstance(value, str):
        return value
    return list_of(_TEXT)(value, path)


def _tool(value: Any, path: str) -> Any:
    if isinstance(value, dict) and value.get("type") not in (None, "custom"):
        # web_search_*, code_execution_*, bash_*, text_editor_*, computer_*, mcp: the
        # worker would run them itself.
        raise unsupported(child(path, "type"), "is not supported (only client tools are)")
    spec = obj(
        {
            "type": string,
            "name": string,
            "description": string,
            "input_schema": any_json,
            **_CACHE,
        },
        required=("name", "input_schema"),
    )
    return spec(value, path)


_TOOL_CHOICE_FIELDS = obj(
    {
        "type": enum("auto", "any", "tool", "none"),
        "name": string,
        "disable_parallel_tool_use": boolean,
    },
    required=("type",),
)


def _TOOL_CHOICE(value: Any, path: str) -> dict[str, Any]:
    """A ``tool`` choice names its tool: refused with the plan, before any cost."""
    checked: dict[str, Any] = _TOOL_CHOICE_FIELDS(value, path)
    if checked["type"] == "tool" and "name" not in checked:
        raise invalid(child(path, "name"), "is required")
    return checked


_THINKING_CONFIG = obj(
    {"type": enum("enabled", "disabled"), "budget_tokens": integer(ge=0)}, required=("type",)
)


def _fields(with_max_tokens: bool) -> dict[str, Spec]:
    fields: dict[str, Spec] = {
        **ENGINE_SAMPLING,
        "model": string,
        "messages": list_of(_MESSAGE, min_items=1),
        "system": _system,
        "stop_sequences": list_of(string, max_items=64),
        "temperature": number(ge=0),
        "top_p": number(ge=0, le=1),
        "stream": boolean,
        "tools": list_of(_tool, max_items=128),
        "tool_choice": _TOOL_CHOICE,
        "thinking": _THINKING_CONFIG,
        "metadata": harmless,
        "service_tier": harmless,
        "cache_control": harmless,
    }
    if with_max_tokens:
        fields["max_tokens"] = integer(ge=1)
    return fields


def _body(with_max_tokens: bool) -> Spec:
    required = ("model", "messages", "max_tokens") if with_max_tokens else ("model", "messages")
    return obj(_fields(with_max_tokens), required=required, refused=REFUSED)


_MESSAGES_BODY = _body(True)
_COUNT_BODY = _body(False)


def check_headers(headers: tuple[tuple[bytes, bytes], ...]) -> None:
    """``anthropic-version`` and ``anthropic-beta`` are accepted, never forwarded."""
    for name, value in headers:
        if name == b"anthropic-version":
            if not _VERSION.fullmatch(value):
                raise GatewayError(
                    "invalid_request",
                    "anthropic-version must be a date (YYYY-MM-DD).",
                    param="anthropic-version",
                )
        elif name == b"anthropic-beta" and len(value) > _MAX_BETA_BYTES:
            raise GatewayError(
                "invalid_request", "anthropic-beta is too long.", param="anthropic-beta"
            )


class _Planner:
    """The messages' blocks, checked and measured once; media into placeholders."""

    def __init__(self, ctx: PlanContext, plan: Plan) -> None:
        self.ctx, self.plan = ctx, plan
        self.prompt = 0
        self.flat = 0
        self.has_text = False

    def text(self, value: str) -> None:
        self.prompt += text_size(value)
        self.has_text = self.has_text or bool(value)

    def image(self, block: dict[str, Any], path: str, role: str) -> dict[str, Any] | None:
        """The block with its source as a placeholder URL, or None (dropped by policy)."""
        if role != "user":
            raise invalid(path, "is an image outside a user message")
        source = block["source"]
        where = child(path, "source")
        if source["type"] == "url":
            if "url" not in source:
                raise invalid(child(where, "url"), "is required")
            url = source["url"]
        else:
            if "data" not in source or "media_type" not in source:
                raise invalid(where, "needs media_type and data")
            url = f"data:{source['media_type']};base64,{source['data']}"
        tenant = self.ctx.tenant
        placed = plan_url(url, "image", self.flat, tenant, self.plan, where)
        self.flat += 1
        if placed is None:
            return None
        return {"type": "image", "source": {"type": "url", "url": placed}}

    def blocks(self, blocks: list[dict[str, Any]], path: str, role: str) -> list[dict[str, Any]]:
        kept: list[dict[str, Any]] = []
        for bi, block in enumerate(blocks):
            where = item(path, bi)
            kind = block["type"]
            block = {k: v for k, v in block.items() if v is not DROP}
            if kind == "text":
                self.text(block["text"])
                self.flat += 1
            elif kind == "image":
                placed = self.image(block, where, role)
                if placed is None:
                    continue
                block = placed
            elif kind == "tool_result":
                if role != "user":
                    raise invalid(where, "is a tool result outside a user message")
                content = block.get("content")
                if isinstance(content, list):
                    block["content"] = self.blocks(content, child(where, "content"), role)
                elif isinstance(content, str):
                    self.text(content)
            elif kind == "tool_use":
                if role != "assistant":
                    raise invalid(where, "is a tool use outside an assistant message")
                self.prompt += json_size(block["input"]) + text_size(block["name"])
            elif kind == "thinking":
                self.prompt += text_size(block["thinking"])
            kept.append(block)
        return kept


def plan_message(body: Any, ctx: PlanContext, endpoint: str, *, counting: bool) -> Plan:
    check_headers(ctx.headers)
    tenant = ctx.tenant
    raw = require_object(body)
    agent = None if counting else plan_agent(raw, ctx, rewrite_messages)
    if agent is not None:
        raw = agent.strip(raw)
    clean: dict[str, Any] = (_COUNT_BODY if counting else _MESSAGES_BODY)(raw, "")
    alias = resolve_alias(clean, ctx)
    max_tokens = None
    if not counting:
        max_tokens = clean["max_tokens"]
        if max_tokens > tenant.limits.max_output_tokens:
            raise GatewayError(
                "output_tokens_exceeded",
                "max_tokens exceeds this tenant's limit.",
                param="max_tokens",
            )
    stream = bool(clean.get("stream")) and not counting
    plan = Plan(
        endpoint=endpoint,
        alias=alias,
        body=clean,
        stream=stream,
        include_usage=True,
        max_tokens=max_tokens,
        prompt_bytes=0,
        nonce=ctx.nonce,
        tools_requested=bool(clean.get("tools")),
        bills_tokens=not counting,
        agent=agent,
        agent_events=agent is not None and agent_events_asked(require_object(body), ctx),
    )
    planner = _Planner(ctx, plan)
    system = clean.get("system")
    if isinstance(system, str):
        planner.text(system)
    elif isinstance(system, list):
        clean["system"] = [{"type": "text", "text": b["text"]} for b in system]
        for block in system:
            planner.text(block["text"])
    system_bytes = planner.prompt
    for mi, message in enumerate(clean["messages"]):
        where = child(item("messages", mi), "content")
        content = message["content"]
        if isinstance(content, str):
            planner.text(content)
        else:
            message["content"] = planner.blocks(content, where, message["role"])
    prompt = planner.prompt
    for name in ("tools", "stop_sequences"):
        if name in clean:
            clean[name] = _without_cache(clean[name])
            prompt += json_size(clean[name])
    prompt += compiled_bytes(clean)
    # The refusal names what to shorten: the system prompt when it is most of it.
    check_prompt(prompt, tenant, "system" if system_bytes * 2 > prompt else "messages")
    if planner.has_text:
        require_text_modality(tenant, "messages")
    plan.prompt_bytes = prompt
    plan.turns = len(clean["messages"]) + (1 if system else 0)
    check_count(plan, tenant, "messages")
    return plan


def _without_cache(value: Any) -> Any:
    if isinstance(value, list):
        return [
            {k: v for k, v in x.items() if k != "cache_control"} if isinstance(x, dict) else x
            for x in value
        ]
    return value


class MessagesApi:
    endpoint: ClassVar[Endpoint] = Endpoint(
        name="messages",
        path="/v1/messages",
        operation="chat",
        media_param="messages",
        upstream_path="/v1/chat/completions",
        error_shape="anthropic",
        tool_loop="governed",
    )

    def plan(self, body: Any, ctx: PlanContext) -> Plan:
        return plan_message(body, ctx, self.endpoint.name, counting=False)

    def forward(self, plan: Plan, route: str) -> dict[str, Any]:
        body = chat_body(plan, route)
        return body if plan.agent is None else plan.agent.apply(body)

    def dialect(self, plan: Plan, bounds: StreamBounds, *, collect: bool) -> Dialect:
        dialect = MessagesDialect(plan, bounds, collect=collect)
        return dialect if bounds.agent is None else AgentDialect(dialect, plan, collect=collect)


class CountTokensApi:
    endpoint: ClassVar[Endpoint] = Endpoint(
        name="messages.count_tokens",
        path="/v1/messages/count_tokens",
        operation="count_tokens",
        media_param="messages",
        policy_endpoint="messages",
        error_shape="anthropic",
        exchange="json",
    )

    def plan(self, body: Any, ctx: PlanContext) -> Plan:
        return plan_message(body, ctx, self.endpoint.name, counting=True)

    def forward(self, plan: Plan, route: str) -> dict[str, Any]:
        body = {k: v for k, v in plan.body.items() if k not in ("metadata", "service_tier")}
        body["model"] = route
        return body

    def dialect(self, plan: Plan, bounds: StreamBounds, *, collect: bool) -> Dialect:
        return CountTokensDialect(plan, bounds)
