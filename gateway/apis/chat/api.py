"""``POST /v1/chat/completions``: allowlist, planning, forwarded body, dialect.

Planning walks every message once: roles, content (a string, parts, or null
for an assistant turn with tool calls), media parts (user turns only) into
placeholders (``apis/media.py``), the bytes the worker will read (message
text and names, tool calls, tool definitions, ``response_format`` and
``grammar`` schemas, stop strings, ``logit_bias``, DRY breakers) and the
``text`` modality. The forwarded body always asks for a stream with usage and
carries ``max_tokens`` explicitly; the worker's chunks are read by
``apis/chat/dialect.py``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from gateway.apis.agents.rewrite import rewrite_chat
from gateway.apis.base import (
    Dialect,
    Endpoint,
    Plan,
    PlanContext,
    StreamBounds,
    check_prompt,
    output_bound,
    require_object,
    require_text_modality,
    resolve_alias,
    stream_flags,
)
from gateway.apis.chat.agentic import AgentDialect, agent_events_asked, plan_agent
from gateway.apis.chat.dialect import ChunkDialect
from gateway.apis.fields import (
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
    null_only,
    obj,
    string,
    text_size,
    unsupported,
)
from gateway.apis.media import check_count, plan_url
from gateway.apis.sampling import REFUSED_FIELDS, SAMPLING, check_single_choice, compiled_bytes

ROLES = ("system", "developer", "user", "assistant", "tool")
MEDIA_PARTS: dict[str, Literal["image", "audio", "video"]] = {
    "image_url": "image",
    "audio_url": "audio",
    "video_url": "video",
}

_FUNCTION = obj(
    {"name": string, "description": string, "parameters": any_json, "strict": boolean},
    required=("name",),
)
#: a function tool as chat completions send it (Responses takes this shape too)
FUNCTION_TOOL = obj({"type": string, "function": _FUNCTION}, required=("function",))


def _tool(value: Any, path: str) -> Any:
    if isinstance(value, dict) and value.get("type") != "function":
        raise unsupported(child(path, "type"), "is not supported (only function tools are)")
    return FUNCTION_TOOL(value, path)


def _tool_choice(value: Any, path: str) -> Any:
    if isinstance(value, str):
        return enum("none", "auto", "required")(value, path)
    named = obj(
        {"type": enum("function"), "function": obj({"name": string}, required=("name",))},
        required=("type", "function"),
    )
    return named(value, path)


_TOOL_CALL = obj(
    {
        "id": string,
        "type": enum("function"),
        "index": integer(ge=0),
        "function": obj({"name": string, "arguments": string}, required=("name",)),
    },
    required=("function",),
)

_RESPONSE_FORMAT = obj(
    {
        "type": enum("text", "json_object", "json_schema"),
        "json_schema": obj(
            {
                "name": string,
                "description": string,
                "schema": any_json,
                "strict": boolean,
            }
        ),
    },
    required=("type",),
)


def _media_part(kind: str) -> Spec:
    fields: dict[str, Spec] = {"url": string}
    if kind == "image_url":
        fields["detail"] = enum("auto", "low", "high")
    return obj({"type": string, kind: obj(fields, required=("url",))}, required=(kind,))


_PARTS: dict[str, Spec] = {
    "text": obj({"type": string, "text": string}, required=("text",)),
    **{kind: _media_part(kind) for kind in MEDIA_PARTS},
}


def _part(value: Any, path: str) -> Any:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise invalid(path, "is not a content part")
    spec = _PARTS.get(value["type"])
    if spec is None:
        raise invalid(child(path, "type"), "is not a supported content part type")
    return spec(value, path)


_PART_LIST = list_of(_part)


def _content(value: Any, path: str) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        return _PART_LIST(value, path)
    raise invalid(path, "must be a string, an array of parts or null")


_MESSAGE = obj(
    {
        "role": enum(*ROLES),
        "content": _content,
        "name": string,
        "tool_calls": list_of(_TOOL_CALL),
        "tool_call_id": string,
        "reasoning_content": string,
        # what an SDK's message.model_dump() adds to an assistant turn (spec §14)
        "refusal": null_only,
        "annotations": null_only,
        "audio": null_only,
        "function_call": null_only,
    },
    required=("role",),
    # an assistant turn's null content beside its tool calls, as OpenAI shows it
    keep_null=("content",),
)

FIELDS: dict[str, Spec] = {
    **SAMPLING,
    "messages": list_of(_MESSAGE, min_items=1),
    "max_completion_tokens": integer(),
    "logprobs": boolean,
    "top_logprobs": integer(ge=0, le=20),
    "tools": list_of(_tool, max_items=128),
    "tool_choice": _tool_choice,
    "parallel_tool_calls": boolean,
    "response_format": _RESPONSE_FORMAT,
    "enable_thinking": boolean,
    "reasoning_effort": enum("none", "off", "low", "medium", "high", "xhigh"),
    "chat_template_kwargs": obj({"enable_thinking": boolean, "reasoning_effort": string}),
    "store": harmless,
}
#: the names a request body may carry (spec §5: the allowlist)
FIELD_NAMES = frozenset(FIELDS)

BODY = obj(
    FIELDS,
    required=("model", "messages"),
    refused=REFUSED_FIELDS,
)


class ChatApi:
    endpoint: ClassVar[Endpoint] = Endpoint(
        name="chat.completions",
        path="/v1/chat/completions",
        operation="chat",
        media_param="messages",
        tool_loop="governed",
    )

    def plan(self, body: Any, ctx: PlanContext) -> Plan:
        tenant = ctx.tenant
        raw = require_object(body)
        agent = plan_agent(raw, ctx, rewrite_chat)
        clean: dict[str, Any] = BODY(raw if agent is None else agent.strip(raw), "")
        alias = resolve_alias(clean, ctx)
        check_single_choice(clean)
        stream, include_usage = stream_flags(clean)
        plan = Plan(
            endpoint=self.endpoint.name,
            alias=alias,
            body=clean,
            stream=stream,
            include_usage=include_usage,
            max_tokens=output_bound(clean, tenant, ("max_tokens", "max_completion_tokens")),
            prompt_bytes=0,
            nonce=ctx.nonce,
            tools_requested=bool(clean.get("tools")),
            agent=agent,
            agent_events=agent is not None and agent_events_asked(raw, ctx),
        )
        prompt = self._plan_messages(clean["messages"], ctx, plan)
        for name in ("tools", "response_format"):
            if name in clean:
                prompt += json_size(clean[name])
        prompt += compiled_bytes(clean)
        check_prompt(prompt, tenant, "messages")
        plan.prompt_bytes = prompt
        plan.turns = len(clean["messages"])
        check_count(plan, tenant, "messages")
        return plan

    def _plan_messages(self, messages: list[dict[str, Any]], ctx: PlanContext, plan: Plan) -> int:
        tenant = ctx.tenant
        prompt = 0
        flat = 0
        has_text = False
        for mi, message in enumerate(messages):
            where = item("messages", mi)
            role = message["role"]
            content = message.get("content")
            if isinstance(content, str):
                prompt += text_size(content)
                has_text = has_text or bool(content)
            elif isinstance(content, list):
                parts = []
                for pi, part in enumerate(content):
                    part_path = item(child(where, "content"), pi)
                    ptype = part["type"]
                    kind = MEDIA_PARTS.get(ptype)
                    if kind is None:
                        prompt += text_size(part["text"])
                        has_text = has_text or bool(part["text"])
                        parts.append(part)
                    else:
                        if role != "user":
                            raise invalid(part_path, "is a media part outside a user message")
                        url = plan_url(part[ptype]["url"], kind, flat, tenant, plan, part_path)
                        if url is not None:
                            parts.append({"type": ptype, ptype: {"url": url}})
                    flat += 1
                message["content"] = parts
            elif role != "assistant" or not message.get("tool_calls"):
                raise invalid(child(where, "content"), "is required")
            for extra in ("tool_calls", "name", "tool_call_id", "reasoning_content"):
                if message.get(extra) is not None:
                    prompt += json_size(message[extra])
        if has_text:
            require_text_modality(tenant, "messages")
        return prompt

    def forward(self, plan: Plan, route: str) -> dict[str, Any]:
        body = dict(plan.body)
        body.pop("max_completion_tokens", None)
        body["model"] = route
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        body["max_tokens"] = plan.max_tokens
        return body if plan.agent is None else plan.agent.apply(body)

    def dialect(self, plan: Plan, bounds: StreamBounds, *, collect: bool) -> Dialect:
        dialect = ChunkDialect("chat", plan, bounds, collect=collect)
        return dialect if bounds.agent is None else AgentDialect(dialect, plan, collect=collect)
