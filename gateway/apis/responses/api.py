"""``POST /v1/responses``: the OpenAI Responses API as mistral.rs serves it (spec §14).

Planning: ``input`` is a string or a list of items -- messages (``role``,
``content`` as a string or parts: ``input_text``, ``output_text``,
``refusal``, ``input_image`` whose ``image_url`` must be ``evidence:<id>``
(or the chat-style ``image_url`` part)), ``function_call`` and
``function_call_output`` items (a function-tool round trip re-sends them);
``instructions``; flat function tools. Built-in tools (every tool whose
``type`` is not ``function``) and ``background: true`` are refused
(``unsupported_field``): each would make the worker fetch, run or keep
something on the caller's behalf. ``include`` (:data:`INCLUDE_FORWARDED`):
the worker parses four values (``IncludeOption`` in its ``responses.rs``) and
acts on none (its ``IncludeConfig`` is never read), so the two that name no
built-in tool's output, ``reasoning.encrypted_content`` and
``message.input_image.image_url``, are forwarded as sent: they fetch and run
nothing. Every other entry is refused naming ``include[i]``: the outputs of
built-in tools (file search, web search, code interpreter, computer use),
which are not served, and ``message.output_text.logprobs``, which the worker
does not know (its whole request would be a 422) and could not honour (its
Responses stream carries no logprobs). The output bound is
``max_output_tokens`` (``max_tokens`` and ``max_completion_tokens`` are the
worker's aliases for it). A ``previous_response_id`` is handed to the
pipeline, which forwards the tenant's own kept conversation in its place
(``conversation.py``); the worker always gets ``store: false`` and never a
``previous_response_id`` (spec §17).

The worker's named-event stream is read by :class:`ResponsesGrammar`
(below); the caller gets the same events with ``model`` set back to the
alias, or, non-streaming, the terminal event's response object.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

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
)
from gateway.apis.chat.api import FUNCTION_TOOL
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
    map_of,
    number,
    obj,
    string,
    string_or_strings,
    text_size,
    token_id,
    unsupported,
)
from gateway.apis.media import check_count, plan_url
from gateway.apis.responses.events import ResponsesDialect
from gateway.apis.sampling import ENGINE_SAMPLING, HARMLESS_FIELDS, STREAM_OPTIONS, compiled_bytes
from gateway.config.policy import Tenant
from gateway.core.errors import GatewayError

RESPONSE_ID = re.compile(r"resp_[A-Za-z0-9-]{1,64}")
ROLES = ("user", "assistant", "system", "developer")

_REFUSED: Mapping[str, str] = {
    name: "is not supported (the worker would fetch, run or keep something for the caller)"
    for name in (
        "max_tool_calls",
        "max_tool_rounds",
        "files",
        "adapter",
        "conversation",
        "prompt",
        "web_search_options",
    )
}


_FLAT_TOOL = obj(
    {
        "type": string,
        "name": string,
        "description": string,
        "parameters": any_json,
        "strict": boolean,
    },
    required=("name",),
)
_NAMED_CHOICE = obj(
    {
        "type": enum("function"),
        "name": string,
        "function": obj({"name": string}, required=("name",)),
    },
    required=("type",),
)
_CHOICE_MODE = enum("none", "auto", "required")


def _function_tool(value: Any, path: str) -> Any:
    if isinstance(value, dict) and value.get("type") != "function":
        raise unsupported(child(path, "type"), "is not supported (only function tools are)")
    if isinstance(value, dict) and "function" in value:
        # The chat shape, which the worker also takes.
        return FUNCTION_TOOL(value, path)
    return _FLAT_TOOL(value, path)


def _tool_choice(value: Any, path: str) -> Any:
    if isinstance(value, str):
        return _CHOICE_MODE(value, path)
    return _NAMED_CHOICE(value, path)


_TEXT = obj(
    {
        "format": obj(
            {
                "type": enum("text", "json_object", "json_schema"),
                "name": string,
                "schema": any_json,
                "strict": boolean,
                "description": string,
            },
            required=("type",),
        ),
        "verbosity": harmless,
    }
)
_REASONING = obj(
    {
        "effort": enum("off", "none", "low", "medium", "high", "xhigh", "max"),
        "summary": enum("concise", "detailed", "auto"),
    }
)


#: ``include`` values forwarded to the worker (module docstring)
INCLUDE_FORWARDED = frozenset({"reasoning.encrypted_content", "message.input_image.image_url"})
_INCLUDE_REFUSED: Mapping[str, str] = {
    **{
        name: "is not supported (built-in tools are not served)"
        for name in (
            "file_search_call.results",
            "web_search_call.results",
            "web_search_call.action.sources",
            "code_interpreter_call.outputs",
            "computer_call_output.output.image_url",
        )
    },
    "message.output_text.logprobs": "is not supported (the worker returns no logprobs here)",
}


def _include(value: Any, path: str) -> Any:
    entries: list[str] = list_of(string)(value, path)
    for index, entry in enumerate(entries):
        if entry not in INCLUDE_FORWARDED:
            reason = _INCLUDE_REFUSED.get(entry, "is not a supported include value")
            raise unsupported(item(path, index), reason)
    return entries


def _background(value: Any, path: str) -> Any:
    if boolean(value, path):
        raise unsupported(path, "is not supported (background runs are not served)")
    return value


_TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal", "text": "text"}
_PARTS: dict[str, Spec] = {
    "input_text": obj({"type": string, "text": string}, required=("text",)),
    "text": obj({"type": string, "text": string}, required=("text",)),
    "output_text": obj(
        {"type": string, "text": string, "annotations": any_json, "logprobs": any_json},
        required=("text",),
    ),
    "refusal": obj({"type": string, "refusal": string}, required=("refusal",)),
    "input_image": obj(
        {"type": string, "image_url": string, "detail": enum("auto", "low", "high")},
        required=("image_url",),
    ),
    "image_url": obj(
        {
            "type": string,
            "image_url": obj(
                {"url": string, "detail": enum("auto", "low", "high")}, required=("url",)
            ),
        },
        required=("image_url",),
    ),
}


def _part(value: Any, path: str) -> Any:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise invalid(path, "is not a content part")
    spec = _PARTS.get(value["type"])
    if spec is None:
        raise unsupported(child(path, "type"), "is not a supported content part type")
    return spec(value, path)


def _content(value: Any, path: str) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return list_of(_part)(value, path)
    raise invalid(path, "must be a string or an array of parts")


_MESSAGE = obj(
    {
        "type": enum("message"),
        "role": enum(*ROLES),
        "content": _content,
        "name": string,
        "id": string,
        "status": string,
    },
    required=("role", "content"),
)
_FUNCTION_CALL = obj(
    {
        "type": string,
        "call_id": string,
        "name": string,
        "arguments": string,
        "id": string,
        "status": string,
        "namespace": string,
    },
    required=("call_id", "name", "arguments"),
)
_FUNCTION_OUTPUT = obj(
    {"type": string, "call_id": string, "output": string, "id": string, "status": string},
    required=("call_id", "output"),
)


def _input_item(value: Any, path: str) -> Any:
    if not isinstance(value, dict):
        raise invalid(path, "is not an input item")
    kind = value.get("type", "message")
    if kind == "message":
        return _MESSAGE(value, path)
    if kind == "function_call":
        return _FUNCTION_CALL(value, path)
    if kind == "function_call_output":
        return _FUNCTION_OUTPUT(value, path)
    raise unsupported(child(path, "type"), "is not a supported input item type")


def _input(value: Any, path: str) -> Any:
    if isinstance(value, str):
        return value
    return list_of(_input_item, min_items=1)(value, path)


#: OpenAI's bounds on ``metadata``: pairs, key and value characters
_METADATA_PAIRS, _METADATA_KEY, _METADATA_VALUE = 16, 64, 512


def _metadata(value: Any, path: str) -> Any:
    """String pairs within OpenAI's bounds: echoed in every response object and
    kept with it, never forwarded (the worker has no use for them)."""
    if not isinstance(value, dict):
        raise invalid(path, "must be an object")
    if len(value) > _METADATA_PAIRS:
        raise invalid(path, f"has more than {_METADATA_PAIRS} pairs")
    for key, entry in value.items():
        if len(key) > _METADATA_KEY or not isinstance(entry, str) or len(entry) > _METADATA_VALUE:
            raise invalid(path, "must map keys of at most 64 characters to strings of at most 512")
    return value


def _part_path(index: int, part_index: int) -> str:
    return item(child(item("input", index), "content"), part_index)


def plan_items(
    items: list[dict[str, Any]],
    tenant: Tenant,
    plan: Plan,
    where: Callable[[int, int], str],
    flat: int = 0,
) -> tuple[int, bool, int]:
    """Plan validated input items in place (media URLs become placeholders and
    :class:`MediaRef` entries of ``plan``): (prompt bytes, any text, the flat
    part index after them). ``where(i, j)`` is what a refusal of part ``j`` of
    item ``i`` names."""
    prompt, has_text = 0, False
    for index, entry in enumerate(items):
        if "call_id" in entry:
            prompt += json_size(entry)
            continue
        content = entry["content"]
        if isinstance(content, str):
            prompt += text_size(content)
            has_text = has_text or bool(content)
            continue
        kept = []
        for part_index, part in enumerate(content):
            kind = part["type"]
            if kind in _TEXT_PARTS:
                text = part[_TEXT_PARTS[kind]]
                prompt += text_size(text)
                has_text = has_text or bool(text)
                kept.append(part)
            else:
                part_path = where(index, part_index)
                if entry["role"] != "user":
                    raise invalid(part_path, "is a media part outside a user message")
                inner = part["image_url"]
                url = inner if isinstance(inner, str) else inner["url"]
                placeholder = plan_url(url, "image", flat, tenant, plan, part_path)
                if placeholder is not None:
                    shown = placeholder if isinstance(inner, str) else {"url": placeholder}
                    kept.append({"type": kind, "image_url": shown})
            flat += 1
        entry["content"] = kept
    return prompt, has_text, flat


FIELDS: dict[str, Spec] = {
    "model": string,
    "input": _input,
    "instructions": string,
    "previous_response_id": string,
    "stream": boolean,
    "stream_options": STREAM_OPTIONS,
    "background": _background,
    "store": boolean,
    "include": _include,
    "max_output_tokens": integer(),
    "max_tokens": integer(),
    "max_completion_tokens": integer(),
    "temperature": number(ge=0),
    "top_p": number(ge=0, le=1),
    "presence_penalty": number(),
    "frequency_penalty": number(),
    "top_logprobs": integer(ge=0, le=20),
    "tools": list_of(_function_tool, max_items=128),
    "tool_choice": _tool_choice,
    "parallel_tool_calls": boolean,
    "reasoning": _REASONING,
    "text": _TEXT,
    "truncation": enum("auto", "disabled"),
    "user": string,
    # mistral.rs's extensions (findings §5a)
    "stop": string_or_strings(max_items=64),
    "logit_bias": map_of(token_id, number()),
    "logprobs": boolean,
    "n": integer(ge=1, le=1),
    **ENGINE_SAMPLING,
    **HARMLESS_FIELDS,
    # kept to echo in the response objects (spec §24), never forwarded
    "metadata": _metadata,
}
FIELD_NAMES = frozenset(FIELDS)
BODY = obj(FIELDS, required=("model", "input"), refused=_REFUSED)
_OUTPUT_NAMES = ("max_output_tokens", "max_tokens", "max_completion_tokens")


class ResponsesApi:
    endpoint: ClassVar[Endpoint] = Endpoint(
        name="responses",
        path="/v1/responses",
        operation="chat",
        media_param="input",
        tool_loop="ungoverned",
    )

    def plan(self, body: Any, ctx: PlanContext) -> Plan:
        tenant = ctx.tenant
        clean: dict[str, Any] = BODY(require_object(body), "")
        alias = resolve_alias(clean, ctx)
        previous = clean.get("previous_response_id")
        if previous is not None and not RESPONSE_ID.fullmatch(previous):
            # Never forwarded, never looked up: it cannot be anyone's response.
            raise GatewayError("response_not_found", param="previous_response_id")
        plan = Plan(
            endpoint=self.endpoint.name,
            alias=alias,
            body=clean,
            stream=bool(clean.get("stream", False)),
            include_usage=True,
            max_tokens=output_bound(clean, tenant, _OUTPUT_NAMES),
            prompt_bytes=0,
            nonce=ctx.nonce,
            tools_requested=bool(clean.get("tools")),
            previous_response_id=previous,
        )
        value = clean["input"]
        if isinstance(value, str):
            prompt, has_text = text_size(value), bool(value)
        else:
            prompt, has_text, _ = plan_items(value, tenant, plan, _part_path)
        instructions = clean.get("instructions") or ""
        prompt += text_size(instructions)
        if has_text or instructions:
            require_text_modality(tenant, "input")
        for name in ("tools", "text", "reasoning"):
            if name in clean:
                prompt += json_size(clean[name])
        prompt += compiled_bytes(clean)
        check_prompt(prompt, tenant, "input")
        plan.prompt_bytes = prompt
        items = clean.get("input")
        plan.turns = len(items) if isinstance(items, list) else 1
        check_count(plan, tenant, "input")
        return plan

    def forward(self, plan: Plan, route: str) -> dict[str, Any]:
        body = dict(plan.body)
        for name in ("max_tokens", "max_completion_tokens", "stream_options"):
            body.pop(name, None)
        # The conversation is the gateway's (spec §17): the pipeline forwards the
        # chain as explicit items (``conversation.expand``), and the worker keeps
        # nothing of it (its in-memory store has no TTL and no bound).
        body.pop("previous_response_id", None)
        body.pop("metadata", None)
        body["store"] = False
        body["model"] = route
        body["stream"] = True
        body["max_output_tokens"] = plan.max_tokens
        return body

    def dialect(self, plan: Plan, bounds: StreamBounds, *, collect: bool) -> Dialect:
        return ResponsesDialect(plan, bounds, collect=collect)
