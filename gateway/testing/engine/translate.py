"""Request JSON → the SDK's request objects, as ``mistralrs serve`` reads its body.

Unknown fields are ignored (the server has no ``deny_unknown_fields``); a known
field of the wrong type is a :class:`BodyError` (axum's 422 "Failed to
deserialize the JSON body into the target type").

Agentic fields (:func:`agentic`): ``web_search_options`` (context size and the
tool descriptions; the binding has no ``filters`` or ``user_location`` text
fields for the engine, see ``agents.py``), ``max_tool_rounds``,
``session_id``, ``agent_permission`` (``code_execution_permission`` is its
alias) and a ``code_interpreter`` tool (``enable_code_execution``: the wheel
has no code execution, so the engine answers it as a plain chat). A request
is agentic, as the engine's gate decides, when it has ``web_search_options``
or ``max_tool_rounds``. ``files``, ``tool_dispatch_url`` and shell are not
passed on.
"""

from __future__ import annotations

import json
from typing import Any

import mistralrs


class BodyError(ValueError):
    """The body does not deserialize into the server's request type (422)."""


PERMISSIONS = ("auto", "ask", "deny")


def agentic(body: dict[str, Any]) -> bool:
    """Whether the engine runs this chat request through its agentic loop."""
    return body.get("web_search_options") is not None or body.get("max_tool_rounds") is not None


def permission(body: dict[str, Any]) -> str:
    """The request's agent permission (``auto`` unless it says; the strictest of
    ``agent_permission`` and its alias ``code_execution_permission``)."""
    found = "auto"
    for name in ("agent_permission", "code_execution_permission"):
        value = body.get(name)
        if value is None:
            continue
        if value not in PERMISSIONS:
            raise BodyError(f"{name}: unknown variant, expected one of auto, ask, deny")
        if PERMISSIONS.index(value) > PERMISSIONS.index(found):
            found = value
    return found


def chat_request(body: dict[str, Any], approval: Any = None) -> mistralrs.ChatCompletionRequest:
    """The SDK request for a ``/v1/chat/completions`` body; an agentic one runs
    with ``Ask`` and ``approval`` as its approval callback (``agents.py``)."""
    messages = _messages(body.get("messages", _MISSING))
    common = _sampling(body)
    tools = _optional(body, "tools", list)
    code = False
    if tools is not None:
        code = any(_is_code_tool(t) for t in tools)
        tools = [t for t in tools if not _is_code_tool(t)] or None
    tool_choice = body.get("tool_choice")
    response_format = _optional(body, "response_format", dict)
    grammar, grammar_type = _grammar(_optional(body, "grammar", dict), response_format)
    return mistralrs.ChatCompletionRequest(
        messages=messages,
        model=_model(body),
        stream=_flag(body, "stream"),
        logprobs=_flag(body, "logprobs"),
        top_logprobs=_optional(body, "top_logprobs", int),
        tool_schemas=None if tools is None else [json.dumps(tool) for tool in tools],
        tool_choice=_tool_choice(tool_choice) if tools else None,
        grammar=grammar,
        grammar_type=grammar_type,
        enable_thinking=_optional(body, "enable_thinking", bool),
        reasoning_effort=_optional(body, "reasoning_effort", str),
        **_agentic_fields(body, approval, code),
        **common,
    )


def _is_code_tool(tool: Any) -> bool:
    return isinstance(tool, dict) and tool.get("type") == "code_interpreter"


def _agentic_fields(body: dict[str, Any], approval: Any, code: bool) -> dict[str, Any]:
    options = _optional(body, "web_search_options", dict)
    fields: dict[str, Any] = {
        "web_search_options": None if options is None else _web_search(options),
        "max_tool_rounds": _optional(body, "max_tool_rounds", int),
        "session_id": _optional(body, "session_id", str),
        "enable_code_execution": code,
    }
    permission(body)  # checked
    if agentic(body):
        fields["agent_permission"] = mistralrs.AgentPermission.Ask
        fields["agent_approval_callback"] = approval
    return fields


def _web_search(options: dict[str, Any]) -> mistralrs.WebSearchOptions:
    size = options.get("search_context_size")
    sizes = {
        "low": mistralrs.SearchContextSize.Low,
        "medium": mistralrs.SearchContextSize.Medium,
        "high": mistralrs.SearchContextSize.High,
    }
    if size is not None and size not in sizes:
        raise BodyError("web_search_options.search_context_size: unknown variant")
    return mistralrs.WebSearchOptions(
        search_context_size=None if size is None else sizes[size],
        search_description=_optional(options, "search_description", str),
        extract_description=_optional(options, "extract_description", str),
    )


def completion_request(body: dict[str, Any]) -> mistralrs.CompletionRequest:
    """The SDK request for a ``/v1/completions`` body (``prompt`` a string only)."""
    prompt = body.get("prompt", _MISSING)
    if prompt is _MISSING:
        raise BodyError("missing field `prompt`")
    if not isinstance(prompt, str):
        raise BodyError("prompt: invalid type: expected a string")
    grammar, grammar_type = _grammar(_optional(body, "grammar", dict), None)
    return mistralrs.CompletionRequest(
        prompt=prompt,
        model=_model(body),
        echo_prompt=_flag(body, "echo"),
        best_of=_optional(body, "best_of", int) or 1,
        suffix=_optional(body, "suffix", str),
        grammar=grammar,
        grammar_type=grammar_type,
        **_sampling(body),
    )


def wants_stream(body: dict[str, Any]) -> bool:
    """Whether the body asks for a stream (``stream`` must be a bool)."""
    return _flag(body, "stream")


def requested_model(body: dict[str, Any]) -> str:
    """The ``model`` field (``default`` when absent)."""
    return _model(body)


# -- internals

_MISSING: Any = object()


def _model(body: dict[str, Any]) -> str:
    return _optional(body, "model", str) or "default"


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    max_tokens = _optional(body, "max_tokens", int)
    if max_tokens is None:
        max_tokens = _optional(body, "max_completion_tokens", int)
    stop = body.get("stop")
    if isinstance(stop, str):
        stop_seqs: list[str] | None = [stop]
    elif stop is None:
        stop_seqs = None
    elif isinstance(stop, list) and all(isinstance(item, str) for item in stop):
        stop_seqs = stop
    else:
        raise BodyError("stop: expected a string or a list of strings")
    return {
        "max_tokens": max_tokens,
        "n_choices": _optional(body, "n", int) or 1,
        "temperature": _number(body, "temperature"),
        "top_p": _number(body, "top_p"),
        "top_k": _optional(body, "top_k", int),
        "min_p": _number(body, "min_p"),
        "presence_penalty": _number(body, "presence_penalty"),
        "frequency_penalty": _number(body, "frequency_penalty"),
        "repetition_penalty": _number(body, "repetition_penalty"),
        "logit_bias": _logit_bias(body.get("logit_bias")),
        "stop_seqs": stop_seqs,
        "dry_multiplier": _number(body, "dry_multiplier"),
        "dry_base": _number(body, "dry_base"),
        "dry_allowed_length": _optional(body, "dry_allowed_length", int),
        "dry_sequence_breakers": _optional(body, "dry_sequence_breakers", list),
        "truncate_sequence": _flag(body, "truncate_sequence"),
        "ignore_eos": _flag(body, "ignore_eos"),
    }


def _messages(raw: Any) -> list[dict[str, Any]] | str:
    if raw is _MISSING:
        raise BodyError("missing field `messages`")
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, list):
        raise BodyError("messages: expected a sequence or a string")
    messages: list[dict[str, Any]] = []
    for index, message in enumerate(raw):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BodyError(f"messages[{index}]: expected an object with a string `role`")
        content = message.get("content")
        if content is None:
            content = ""  # allowed with tool_calls; the SDK needs a string
        if not isinstance(content, str | list):
            raise BodyError(f"messages[{index}].content: expected a string or parts")
        # The SDK reads only role and content (tool_calls, name… are not passed on).
        messages.append({"role": message["role"], "content": content})
    return messages


def _grammar(
    grammar: dict[str, Any] | None, response_format: dict[str, Any] | None
) -> tuple[str | None, str | None]:
    if grammar is not None:
        kind, value = grammar.get("type"), grammar.get("value")
        if not isinstance(kind, str):
            raise BodyError("grammar.type: expected a string")
        return (value if isinstance(value, str) else json.dumps(value)), kind
    if response_format is None or response_format.get("type") in (None, "text"):
        return None, None
    if response_format.get("type") == "json_object":
        return json.dumps({"type": "object"}), "json_schema"
    schema = response_format.get("json_schema")
    if response_format.get("type") == "json_schema" and isinstance(schema, dict):
        return json.dumps(schema.get("schema", {})), "json_schema"
    raise BodyError("response_format: unknown variant")


def _tool_choice(raw: Any) -> mistralrs.ToolChoice:
    if raw == "none":
        return mistralrs.ToolChoice.NoTools
    return mistralrs.ToolChoice.Auto


def _logit_bias(raw: Any) -> dict[int, float] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise BodyError("logit_bias: expected a map")
    bias: dict[int, float] = {}
    for key, value in raw.items():
        try:
            token = int(key)
        except ValueError:
            raise BodyError(f"logit_bias: key {key!r} is not a token id") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BodyError(f"logit_bias.{key}: expected a number")
        bias[token] = float(value)
    return bias


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BodyError(f"{name}: invalid type: expected a boolean")
    return value


def _number(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BodyError(f"{name}: invalid type: expected a number")
    return float(value)


def _optional(body: dict[str, Any], name: str, kind: type[Any]) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise BodyError(f"{name}: invalid type: expected an unsigned integer")
    if not isinstance(value, kind):
        raise BodyError(f"{name}: invalid type: expected {kind.__name__}")
    return value
