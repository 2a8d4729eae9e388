"""``POST /v1/responses`` request bodies, read as mistral.rs reads them
(``OpenResponsesCreateRequest``, findings §5a). Pure: a JSON value in, a
:class:`ResponsesCall` out, or :class:`Reject` with the real server's status.

* No ``deny_unknown_fields``: unknown keys are ignored. Only ``input`` is
  required; a string is one ``user`` message, a list holds items (``message``
  with or without ``type``, ``function_call``, ``function_call_output`` whose
  ``output`` must be a string; ``reasoning`` and ``item_reference`` are
  dropped). Shape errors are axum's 422 text.
* ``max_output_tokens`` has the aliases ``max_tokens`` and
  ``max_completion_tokens``; 0 is the handler's 500. ``max_tool_calls`` is
  always 500. ``include`` accepts only the four documented values.
* ``tools``: function tools, flat (``{type, name, ...}``) or nested
  (``{type, function: {name, ...}}``). The hosted tool types the real server
  knows (web search, code interpreter, shell, namespace) answer 400
  ``simulator: ...``: the simulator has nothing to play for them, and the
  gateway refuses them before they reach a worker.
* Echoed parameters (``metadata``, ``tools``, ``tool_choice``, ...) are
  echoed only when sent (not null), in ``ResponseResource`` order, as sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.testing.simulator.plans import Reject

_INCLUDE = frozenset(
    {
        "file_search_call.results",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "reasoning.encrypted_content",
    }
)
_HOSTED_TOOLS = frozenset(
    {"web_search", "web_search_preview", "code_interpreter", "shell", "namespace"}
)
# ResponseResource's echoed request parameters, in declaration order (after metadata).
_ECHOED = (
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "top_logprobs",
    "max_output_tokens",
    "max_tool_calls",
    "store",
    "background",
)
_MAX_ALIASES = ("max_output_tokens", "max_tokens", "max_completion_tokens")
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
DEFAULT_TOOL = "lookup"


@dataclass(frozen=True, slots=True)
class ResponsesCall:
    """One create request, reduced to what shapes its reply."""

    model: str
    stream: bool
    background: bool
    store: bool
    max_output_tokens: int | None
    #: this request's messages as text, ``instructions`` first (what history keeps)
    texts: tuple[str, ...]
    #: the text that may hold ``[[sim ...]]``: the string input or the last user item
    directive_text: str
    previous_response_id: str | None
    #: ``metadata`` and the echoed parameters, in ResponseResource order
    tail: dict[str, Any]
    #: metadata as sent (None when absent or null)
    metadata: Any
    #: the function a simulated call names: the forced one, else the first tool's
    tool_name: str
    #: ``tool_choice: "none"``: the simulated model never calls a tool
    tools_off: bool


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Reject.shape(f"invalid type: {where}.content")
    texts: list[str] = []
    for part in content:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise Reject.shape(f"invalid type: {where}.content part")
        if part["type"] in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif part["type"] == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
    return "\n\n".join(texts)  # TEXT_PART_JOINER


def _item_text(item: Any, index: int) -> tuple[str | None, str | None]:
    """(text the item adds to the prompt or None if dropped, its role if a message)."""
    where = f"input[{index}]"
    if not isinstance(item, dict):
        raise Reject.shape(f"invalid type: {where}")
    kind = item.get("type")
    if kind in ("reasoning", "item_reference"):
        return None, None
    if kind == "function_call":
        fields = ("call_id", "name", "arguments")
        if not all(isinstance(item.get(f), str) for f in fields):
            raise Reject.shape(f"missing field in {where} (function_call)")
        return f"{item['name']}({item['arguments']})", "assistant"
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"), str):
            raise Reject.shape(f"invalid type: {where}.output, expected a string")
        return item["output"], "tool"
    if kind not in (None, "message") or not isinstance(item.get("role"), str):
        raise Reject.shape(f"{where}: data did not match any variant of untagged enum InputItem")
    if "content" not in item:
        raise Reject.shape(f"missing field `content` in {where}")
    return _content_text(item["content"], where), item["role"]


def _input_texts(value: Any) -> tuple[list[str], str]:
    if isinstance(value, str):
        return [value], value
    if not isinstance(value, list):
        raise Reject.shape("missing field `input`" if value is None else "invalid type: input")
    texts: list[str] = []
    last_user = ""
    for index, item in enumerate(value):
        text, role = _item_text(item, index)
        if text is None:
            continue
        texts.append(text)
        if role == "user":
            last_user = text
    return texts, last_user


def _function_name(tool: dict[str, Any]) -> str | None:
    inner = tool.get("function")
    name = inner.get("name") if isinstance(inner, dict) else tool.get("name")
    return name if isinstance(name, str) else None


def _tools(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise Reject.shape("invalid type: tools")
    names: list[str] = []
    for index, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in _HOSTED_TOOLS:
            raise Reject(400, f"simulator: tool type {kind!r} is not simulated", as_json=False)
        name = _function_name(tool) if kind == "function" and isinstance(tool, dict) else None
        if name is None:
            raise Reject.shape(
                f"tools[{index}]: data did not match any variant of untagged enum OpenAiTool"
            )
        names.append(name)
    return names


def _tool_choice(value: Any) -> tuple[str | None, bool]:
    """(the forced function name, tool_choice is "none")."""
    if value is None or value in ("auto", "required"):
        return None, False
    if value == "none":
        return None, True
    if isinstance(value, dict):
        if value.get("type") == "allowed_tools" and isinstance(value.get("tools"), list):
            if value.get("mode") in ("auto", "required"):
                return None, False
        elif value.get("type") == "function":
            name = _function_name(value)
            if name is not None:
                return name, False
    raise Reject.shape("tool_choice: data did not match any variant of untagged enum ToolChoice")


def _max_output_tokens(req: dict[str, Any]) -> int | None:
    present = [key for key in _MAX_ALIASES if key in req]
    if len(present) > 1:
        raise Reject.shape("duplicate field `max_output_tokens`")
    value = req.get(present[0]) if present else None
    if value is not None and (not _is_int(value) or value < 0):
        raise Reject.shape("invalid type: max_output_tokens, expected usize")
    return value


def _check_types(req: dict[str, Any]) -> None:
    checks = (
        ("model", lambda v: isinstance(v, str)),
        ("instructions", lambda v: isinstance(v, str)),
        ("previous_response_id", lambda v: isinstance(v, str)),
        ("stream", lambda v: isinstance(v, bool)),
        ("background", lambda v: isinstance(v, bool)),
        ("store", lambda v: isinstance(v, bool)),
        ("parallel_tool_calls", lambda v: isinstance(v, bool)),
        ("temperature", _is_number),
        ("top_p", _is_number),
        ("presence_penalty", _is_number),
        ("frequency_penalty", _is_number),
        ("top_logprobs", lambda v: _is_int(v) and v >= 0),
        ("max_tool_calls", lambda v: _is_int(v) and v >= 0),
        ("text", lambda v: isinstance(v, dict)),
        ("include", lambda v: isinstance(v, list) and all(i in _INCLUDE for i in v)),
    )
    for key, ok in checks:
        value = req.get(key)
        if value is not None and not ok(value):
            raise Reject.shape(f"invalid type or unknown variant: {key}")


def parse_create(req: Any) -> ResponsesCall:
    """Read a create request; raise :class:`Reject` where the real server refuses it."""
    if not isinstance(req, dict):
        raise Reject.shape("invalid type: expected a JSON object")
    if "input" not in req:
        raise Reject.shape("missing field `input`")
    _check_types(req)
    model = req.get("model", "default")  # serde's default applies only when absent
    if not isinstance(model, str):
        raise Reject.shape("invalid type: model, expected a string")
    texts, directive_text = _input_texts(req["input"])
    max_output_tokens = _max_output_tokens(req)
    tool_names = _tools(req.get("tools"))
    forced, tools_off = _tool_choice(req.get("tool_choice"))
    if req.get("max_tool_calls") is not None:
        raise Reject.handler(
            500,
            "max_tool_calls is not supported. "
            "mistral.rs does not currently support limiting the number of tool calls.",
        )
    if max_output_tokens == 0:
        raise Reject.handler(500, "max_output_tokens must be at least 1.")
    instructions = req.get("instructions")
    if instructions is not None:
        texts.insert(0, instructions)
    tail: dict[str, Any] = {}
    if req.get("metadata") is not None:
        tail["metadata"] = req["metadata"]
    for key in _ECHOED:
        value = max_output_tokens if key == "max_output_tokens" else req.get(key)
        if value is not None:
            tail[key] = value
    return ResponsesCall(
        model=model,
        stream=bool(req.get("stream")),
        background=bool(req.get("background")),
        store=req.get("store") is not False,
        max_output_tokens=max_output_tokens,
        texts=tuple(texts),
        directive_text=directive_text,
        previous_response_id=req.get("previous_response_id"),
        tail=tail,
        metadata=req.get("metadata"),
        tool_name=forced or (tool_names[0] if tool_names else DEFAULT_TOOL),
        tools_off=tools_off,
    )
