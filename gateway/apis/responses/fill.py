"""Responses objects and events filled to validate against the OpenAI SDK's
types (``openai.types.responses``, strict). Pure.

What the caller gets validates against the OpenAI SDK's types
(``openai.types.responses``, strict): the dialect fills what the worker leaves
out with OpenAI's documented defaults, only where the field is absent, never
changing a value the worker sent (:data:`RESPONSE_DEFAULTS`,
:func:`fill_response`, :meth:`ResponsesDialect.on_item`):

* every response object (``response.created`` … terminal, the non-streaming
  answer, the copy kept for ``GET``): ``tools: []``, ``tool_choice: "auto"``,
  ``parallel_tool_calls: true`` (the worker echoes them only when the request
  sent them); ``usage.input_tokens_details: {"cached_tokens": 0,
  "cache_write_tokens": 0}`` and ``usage.output_tokens_details:
  {"reasoning_tokens": 0}``; a failure's ``error.code: "server_error"``; the
  worker's string ``reasoning`` (a copy of the reasoning text, which the
  reasoning output item carries too) is removed, as OpenAI's ``reasoning`` is
  the request's config object;
* every ``output_text`` content part (in output items, ``part`` of
  ``response.content_part.*``): ``annotations: []``;
* every event about one output item's content (content parts, text,
  refusal, function-call arguments, reasoning): ``item_id``, the id of the
  item ``response.output_item.added`` announced at its ``output_index`` (the
  worker's function-call events name the ``call_id`` only); text deltas and
  ``response.output_text.done``: ``logprobs: []`` (the worker streams none on
  Responses).

The fill is a few dict assignments on the event the grammar already parsed,
before its one serialization; the grammar still judges the worker's bytes as
they came.
"""

from __future__ import annotations

from typing import Any

from gateway.apis.base import Plan

#: events whose OpenAI type requires ``logprobs`` (a list)
LOGPROB_EVENTS = frozenset({"response.output_text.delta", "response.output_text.done"})
#: what a response object lacks from the worker unless the request sent it, with
#: OpenAI's defaults (``tools`` gets a new list each time)
RESPONSE_DEFAULTS: dict[str, Any] = {"tool_choice": "auto", "parallel_tool_calls": True}
_USAGE_DETAILS: dict[str, dict[str, int]] = {
    "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
    "output_tokens_details": {"reasoning_tokens": 0},
}
#: a failed response's ``error.code`` when the worker names none (its
#: ``ResponseError`` has only ``type`` and ``message``): OpenAI's generic code
FAILURE_CODE = "server_error"


def fill_part(part: Any) -> None:
    """An output content part: ``output_text`` gets ``annotations: []``."""
    if isinstance(part, dict) and part.get("type") == "output_text" and "annotations" not in part:
        part["annotations"] = []


def fill_item(item: Any) -> None:
    """An output item: its message content parts (see :func:`fill_part`)."""
    if not isinstance(item, dict) or item.get("type") != "message":
        return
    content = item.get("content")
    if isinstance(content, list):
        for part in content:
            fill_part(part)


def fill_usage(usage: Any) -> None:
    if not isinstance(usage, dict):
        return
    for key, defaults in _USAGE_DETAILS.items():
        details = usage.get(key)
        if details is None:
            usage[key] = dict(defaults)
        elif isinstance(details, dict):
            for name, value in defaults.items():
                details.setdefault(name, value)


def request_echo(plan: Plan) -> dict[str, Any]:
    """What every response object says about the caller's own request (spec
    §24), whatever the worker echoed: it got neither ``previous_response_id``
    (the gateway expands the conversation), nor ``metadata``, nor the caller's
    ``store`` (always ``false``: the gateway keeps responses, not the worker).
    ``store`` is whether the gateway keeps this one."""
    body = plan.body
    return {
        "previous_response_id": plan.previous_response_id,
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata", {}),
        "user": body.get("user"),
        "truncation": body.get("truncation", "disabled"),
        "store": body.get("store", True) is not False,
    }


#: the usage counts every caller sees (spec §21); the details (cache hits) and
#: anything else the worker reports are shown as OpenAI's zero defaults
USAGE_COUNTS = ("input_tokens", "output_tokens", "total_tokens")


def fill_response(response: dict[str, Any], *, full_usage: bool = True) -> dict[str, Any]:
    """Fill a response object's fields the worker left out with OpenAI's
    defaults (module docstring); values the worker sent stay as they are,
    except usage beyond the counts unless ``full_usage`` (spec §21). Shapes
    the grammar does not check are passed on unread. Returns it."""
    usage = response.get("usage")
    if not full_usage and isinstance(usage, dict):
        response["usage"] = {k: usage[k] for k in USAGE_COUNTS if k in usage}
    if "tools" not in response:
        response["tools"] = []
    for key, value in RESPONSE_DEFAULTS.items():
        if key not in response:
            response[key] = value
    if isinstance(response.get("reasoning"), str):
        del response["reasoning"]
    output = response.get("output")
    if isinstance(output, list):
        for item in output:
            fill_item(item)
    fill_usage(response.get("usage"))
    error = response.get("error")
    if isinstance(error, dict) and error.get("code") is None:
        error["code"] = FAILURE_CODE
    return response
