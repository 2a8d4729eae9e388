"""An Anthropic message as the worker's chat completions request (spec §19). Pure.

What the worker's own ``/v1/messages`` converts a message to (reference §12):
``system`` first, each turn's text and images as content parts, an
assistant's ``tool_use`` blocks as its ``tool_calls`` (arguments as compact
JSON), each ``tool_result`` as a ``tool`` message, ``thinking`` as the
assistant's ``reasoning_content``; client tools as function tools,
``tool_choice`` ``any`` as ``required``, ``stop_sequences`` as ``stop``,
``thinking`` as ``enable_thinking``. Always streamed with usage and an
explicit ``max_tokens``.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.apis.base import Plan
from gateway.apis.sampling import ENGINE_SAMPLING


def chat_body(plan: Plan, route: str) -> dict[str, Any]:
    """The message as the worker's chat completions request (what its own
    ``/v1/messages`` converts it to): streamed, with usage, ``max_tokens``
    explicit."""
    body = plan.body
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, str):
        messages.append({"role": "system", "content": system})
    elif isinstance(system, list):
        messages.append({"role": "system", "content": "\n".join(b["text"] for b in system)})
    for message in body["messages"]:
        messages += _chat_turns(message["role"], message["content"])
    out: dict[str, Any] = {"model": route, "messages": messages}
    for name in ENGINE_SAMPLING:
        if name in body:
            out[name] = body[name]
    for name in ("temperature", "top_p"):
        if name in body:
            out[name] = body[name]
    if "stop_sequences" in body:
        out["stop"] = body["stop_sequences"]
    if body.get("tools"):
        out["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    **({"description": t["description"]} if "description" in t else {}),
                    "parameters": t["input_schema"],
                },
            }
            for t in body["tools"]
        ]
    choice = body.get("tool_choice")
    if choice is not None:
        out["tool_choice"] = _tool_choice(choice)
        if choice.get("disable_parallel_tool_use"):
            out["parallel_tool_calls"] = False
    thinking = body.get("thinking")
    if thinking is not None:
        out["enable_thinking"] = thinking["type"] == "enabled"
    out["stream"] = True
    out["stream_options"] = {"include_usage": True}
    out["max_tokens"] = plan.max_tokens
    return out


def _tool_choice(choice: dict[str, Any]) -> Any:
    kind = choice["type"]
    if kind == "tool":
        # The plan refused a tool choice without its name.
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"auto": "auto", "any": "required", "none": "none"}[kind]


def _chat_turns(role: str, content: Any) -> list[dict[str, Any]]:
    """One Anthropic turn as chat messages: tool results become ``tool``
    messages, an assistant's tool uses its ``tool_calls``."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    turns: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in content:
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": block["source"]["url"]}})
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {"name": block["name"], "arguments": _arguments(block["input"])},
                }
            )
        elif kind == "tool_result":
            text, images = _result_parts(block.get("content"))
            turns.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
            if images:
                # The worker takes media on user turns only (reference §6).
                turns.append({"role": "user", "content": images})
        elif kind == "thinking":
            reasoning.append(block["thinking"])
        # redacted_thinking: opaque to this worker, nothing to send
    if parts or calls or reasoning:
        message: dict[str, Any] = {"role": role, "content": parts}
        if role == "assistant":
            text = "".join(p["text"] for p in parts if p["type"] == "text")
            message["content"] = text if text or not calls else None
            if calls:
                message["tool_calls"] = calls
            if reasoning:
                message["reasoning_content"] = "".join(reasoning)
        turns.append(message)
    return turns


def _arguments(value: Any) -> str:
    """A tool use's input as chat's arguments string (compact JSON, as the
    worker's own conversion writes it)."""
    return orjson.dumps(value).decode()


def _result_parts(content: Any) -> tuple[str, list[dict[str, Any]]]:
    """A tool result's text, and its images as user content parts."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    text = "".join(b["text"] for b in content if b["type"] == "text")
    images = [
        {"type": "image_url", "image_url": {"url": b["source"]["url"]}}
        for b in content
        if b["type"] == "image"
    ]
    return text, images
