"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` request bodies, read
as the worker's ``anthropic.rs`` reads them (reference §12). Pure.

The simulator refuses what the worker refuses before it generates anything
(each a 400 ``invalid_request_error``; the handler shapes the reply): a body
that is not a JSON object, ``messages`` that is not a non-empty array of
``user``/``assistant`` turns whose ``content`` is a string or an array of
typed blocks, a ``model`` or ``stream`` of the wrong type, and on
``/v1/messages`` a missing or zero ``max_tokens`` (count_tokens takes none).

What it measures is the chat conversation the worker converts the message
to: the system prompt (when not empty), each turn's text (its text blocks
joined by spaces, as chat's simulator joins text parts), and each tool result
as a message of its own. So the prompt tokens of ``/v1/messages`` and the
count of ``count_tokens`` are the rough estimate chat uses
(``plans.rough_tokens``, four per message), the same for the same body.
Directives are read from the last user turn that has text, as on chat (a turn
of tool results only becomes ``tool`` messages there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.testing.simulator.plans import Reject

#: the tool name of a simulated call when the request names no tool
DEFAULT_TOOL = "lookup"


@dataclass(frozen=True, slots=True)
class MessagesCall:
    """One Anthropic request, reduced to what shapes its reply."""

    model: str
    stream: bool
    max_tokens: int | None
    #: one text per chat message of the worker's conversion
    texts: tuple[str, ...]
    directive_text: str
    #: the first client tool's name (what a simulated tool call calls)
    tool_name: str


def _refuse(message: str) -> Reject:
    return Reject(400, message, as_json=True)


def _block_text(block: dict[str, Any]) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _refuse(f"Anthropic `{block['type']}` content block requires `text`.")
    return text


def _result_text(content: Any) -> str:
    """A tool result's content as the worker's ``content_value_to_text`` makes it."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for item in content:
            if isinstance(item, dict) and item.get("type") == "text":
                text = item.get("text")
                texts.append(text if isinstance(text, str) else "")
            elif isinstance(item, dict) and item.get("type") == "image":
                texts.append("[image]")
            else:
                texts.append(orjson.dumps(item).decode())
        return "\n".join(t for t in texts if t)
    return orjson.dumps(content).decode()


def _turn(index: int, message: Any) -> tuple[str, list[str], str | None]:
    """(role, the texts of the chat messages it becomes, its directive text or None)."""
    if not isinstance(message, dict):
        raise _refuse(f"`messages.{index}` must be an object.")
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise _refuse(f"`messages.{index}.role` must be either `user` or `assistant`.")
    content = message.get("content")
    if isinstance(content, str):
        return role, [content], content
    if not isinstance(content, list):
        raise _refuse(f"`messages.{index}.content` must be a string or an array of blocks.")
    texts: list[str] = []
    results: list[str] = []
    other = False
    where = f"messages.{index}.content"
    for block in content:
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _refuse(f"`{where}` holds a block without a `type`.")
        kind = block["type"]
        if kind == "text":
            texts.append(_block_text(block))
        elif kind == "tool_result":
            results.append(_result_text(block.get("content")))
        else:
            other = True  # image, tool_use, thinking, redacted_thinking, …
    turns = list(results)
    said = " ".join(texts)
    if texts or other:
        turns.append(said)
    return role, turns, said if texts else None


def parse_messages(req: Any, *, counting: bool) -> MessagesCall:
    """The request, checked as the worker checks it; :class:`Reject` (400) if not."""
    if not isinstance(req, dict):
        raise _refuse("The request body must be a JSON object.")
    model = req.get("model", "default")
    stream = req.get("stream")
    if not isinstance(model, str) or not (stream is None or isinstance(stream, bool)):
        raise _refuse("`model` must be a string and `stream` a boolean.")
    messages = req.get("messages")
    if not isinstance(messages, list):
        raise _refuse("`messages` is required and must be an array.")
    if not messages:
        raise _refuse("`messages` must contain at least one message.")
    max_tokens = req.get("max_tokens")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 0):
        raise _refuse("`max_tokens` must be a non-negative integer.")
    if not counting:
        if max_tokens is None:
            raise _refuse("`max_tokens` is required.")
        if max_tokens == 0:
            raise _refuse("`max_tokens` must be greater than 0.")
    texts: list[str] = []
    system = req.get("system")
    if isinstance(system, str):
        if system:
            texts.append(system)
    elif isinstance(system, list):
        blocks = [b for b in system if isinstance(b, dict) and b.get("type") == "text"]
        if len(blocks) != len(system):
            raise _refuse("Anthropic system blocks only support `text` content.")
        joined = "\n".join(_block_text(b) for b in blocks)
        if joined:
            texts.append(joined)
    elif system is not None:
        raise _refuse("`system` must be a string or an array of text blocks.")
    directive = ""
    for index, message in enumerate(messages):
        role, turns, said = _turn(index, message)
        texts += turns
        if role == "user" and said is not None:
            directive = said
    return MessagesCall(
        model=model,
        stream=bool(stream),
        max_tokens=None if counting else max_tokens,
        texts=tuple(texts),
        directive_text=directive,
        tool_name=_tool_name(req.get("tools")),
    )


def _tool_name(tools: Any) -> str:
    if isinstance(tools, list) and tools and isinstance(tools[0], dict):
        name = tools[0].get("name")
        if isinstance(name, str) and name:
            return name
    return DEFAULT_TOOL
