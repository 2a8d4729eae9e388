"""Responses conversations are the gateway's (spec §17). Pure.

The worker keeps a conversation in its process memory only (reference §12),
so the gateway keeps each relayed response's items and forwards a
``previous_response_id`` as the explicit conversation:

- **Kept input items** (:func:`kept_input`): this request's own ``input``, as
  the caller sent it, in the shapes of the OpenAI SDK's ``ResponseItem``
  types (what ``GET /v1/responses/{id}/input_items`` lists): a string input
  is one ``user`` message; message content is a list of parts (``input_text``
  and ``input_image`` for user, system and developer messages;
  ``output_text`` and ``refusal`` for assistant ones); every item has an
  ``id`` (``msg_``/``fc_``/``fco_`` + 96 random bits when the caller gave
  none) and ``status: completed``. Media keep the reference the caller wrote
  (``evidence:<id>``, or the inline ``data:`` URL), never the gateway's
  placeholder: a follow-up leases, checks and stages them again, as for new
  input. ``instructions`` are not input and are not carried over.
- **Kept output items**: the terminal response's ``output`` as relayed.
- **Expansion** (:func:`expand`): the chain, oldest first -- each response's
  input items, then its output items -- then the new input, all in the
  worker's input-item forms (``TaggedInputItem`` in its ``responses_types``):
  ``message`` (role and content parts: ``input_text``, ``output_text``,
  ``refusal``, ``input_image``), ``function_call`` (``call_id``, ``name``,
  ``arguments``), ``function_call_output``. Output ``reasoning`` items are not
  replayed: the worker does not feed them back to the model. The expanded
  conversation is planned like new input (media placeholders, prompt bytes,
  one turn per item) and counts against ``max_prompt_bytes`` and the media
  limits; what the history adds is refused naming ``previous_response_id``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from gateway.apis.base import Plan, check_prompt, require_text_modality
from gateway.apis.media import check_count
from gateway.apis.responses.api import plan_items
from gateway.config.policy import Tenant
from gateway.core.body import placeholder
from gateway.core.errors import GatewayError

#: responses a conversation is read back through, at most
MAX_LINKS = 1024
#: what a refusal caused by the history names
PARAM = "previous_response_id"
_ID_PREFIXES = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_"}
_LIMIT = re.compile(r"[0-9]{1,3}")


def _history_path(index: int, part_index: int) -> str:
    return PARAM


# -- what is kept -------------------------------------------------------------


def kept_input(plan: Plan) -> list[dict[str, Any]]:
    """This request's own input items as kept (module docstring)."""
    value = plan.body["input"]
    if isinstance(value, str):
        return [_kept_message({"role": "user", "content": value}, {})]
    # Placeholders back to what the caller wrote (the plan's media, by slot).
    written: dict[str, str] = {}
    for ref in plan.media:
        original = f"evidence:{ref.evidence_id}" if ref.source == "evidence" else ref.data_url
        if original is not None:
            written[placeholder(plan.nonce, ref.slot)] = original
    kept = []
    for entry in value:
        kind = entry.get("type", "message")
        if kind == "message":
            kept.append(_kept_message(entry, written))
            continue
        fields: tuple[str, ...] = ("call_id", "name", "arguments", "namespace")
        if kind == "function_call_output":
            fields = ("call_id", "output")
        item = {"id": _id_of(entry, kind), "type": kind}
        item.update({name: entry[name] for name in fields if name in entry})
        item["status"] = "completed"
        kept.append(item)
    return kept


def _id_of(entry: Mapping[str, Any], kind: str) -> str:
    given = entry.get("id")
    return given if isinstance(given, str) else _ID_PREFIXES[kind] + os.urandom(12).hex()


def _kept_message(entry: Mapping[str, Any], written: Mapping[str, str]) -> dict[str, Any]:
    role = entry["role"]
    content = entry["content"]
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    item: dict[str, Any] = {"id": _id_of(entry, "message"), "type": "message", "role": role}
    item["content"] = [_kept_part(part, role, written) for part in parts]
    item["status"] = "completed"
    if isinstance(entry.get("name"), str):
        item["name"] = entry["name"]
    return item


def _kept_part(part: Mapping[str, Any], role: str, written: Mapping[str, str]) -> dict[str, Any]:
    kind = part["type"]
    if kind in ("input_image", "image_url"):
        inner = part["image_url"]
        url = inner if isinstance(inner, str) else inner["url"]
        return {"type": "input_image", "image_url": written.get(url, url), "detail": "auto"}
    text = part["refusal"] if kind == "refusal" else part["text"]
    if role != "assistant":
        return {"type": "input_text", "text": text}
    if kind == "refusal":
        return {"type": "refusal", "refusal": text}
    return {"type": "output_text", "text": text, "annotations": []}


# -- what is forwarded --------------------------------------------------------


def history(links: Sequence[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    """The conversation of (input items, output items) links, oldest first, as
    the worker takes input items."""
    items: list[dict[str, Any]] = []
    for input_items, output_items in links:
        items.extend(_forwarded(entry) for entry in _array(input_items))
        for entry in _array(output_items):
            replayed = _replayed(entry)
            if replayed is not None:
                items.append(replayed)
    return items


def _array(raw: bytes) -> list[Any]:
    value = orjson.loads(raw)
    return value if isinstance(value, list) else []


def _forwarded(item: Mapping[str, Any]) -> dict[str, Any]:
    """A kept input item without what only callers read (ids, status, annotations)."""
    kind = item["type"]
    if kind == "function_call":
        names: tuple[str, ...] = ("call_id", "name", "arguments", "namespace")
    elif kind == "function_call_output":
        names = ("call_id", "output")
    else:
        out: dict[str, Any] = {"type": "message", "role": item["role"]}
        out["content"] = [_forwarded_part(part) for part in item["content"]]
        if "name" in item:
            out["name"] = item["name"]
        return out
    return {"type": kind, **{name: item[name] for name in names if name in item}}


def _forwarded_part(part: Mapping[str, Any]) -> dict[str, Any]:
    kind = part["type"]
    if kind == "input_image":
        return {"type": kind, "image_url": part["image_url"]}
    if kind == "refusal":
        return {"type": kind, "refusal": part["refusal"]}
    return {"type": kind, "text": part["text"]}


def _replayed(item: Any) -> dict[str, Any] | None:
    """An output item as the input item that re-sends it; None for what the
    worker does not replay (reasoning) or no item of a known shape."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind == "function_call":
        names = ("call_id", "name", "arguments")
        if not all(isinstance(item.get(name), str) for name in names):
            return None
        out = {"type": kind, **{name: item[name] for name in names}}
        if isinstance(item.get("namespace"), str):
            out["namespace"] = item["namespace"]
        return out
    if kind != "message" or not isinstance(item.get("content"), list):
        return None
    parts: list[dict[str, Any]] = []
    for part in item["content"]:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "output_text" and isinstance(part.get("text"), str):
            parts.append({"type": "output_text", "text": part["text"]})
        elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "refusal", "refusal": part["refusal"]})
    return {"type": "message", "role": "assistant", "content": parts}


def expand(
    forward: dict[str, Any], plan: Plan, links: Sequence[tuple[bytes, bytes]], tenant: Tenant
) -> None:
    """Put the conversation of ``links`` before the new input of ``forward``,
    counted into ``plan`` and bounded by the tenant's limits (module docstring)."""
    items = history(links)
    own = forward["input"]
    own_items = (
        [{"type": "message", "role": "user", "content": own}] if isinstance(own, str) else own
    )
    flat = sum(len(e["content"]) for e in own_items if isinstance(e.get("content"), list))
    prompt, has_text, _ = plan_items(items, tenant, plan, _history_path, flat)
    if has_text:
        require_text_modality(tenant, PARAM)
    plan.prompt_bytes += prompt
    plan.turns += len(items)
    check_prompt(plan.prompt_bytes, tenant, PARAM)
    check_count(plan, tenant, PARAM)
    forward["input"] = [*items, *own_items]


# -- GET /v1/responses/{id}/input_items ---------------------------------------


def input_items_page(items: Sequence[dict[str, Any]], query: Mapping[str, str]) -> dict[str, Any]:
    """One page of a kept response's input items, as the OpenAI SDK's
    ``responses.input_items.list`` reads it (``order`` asc|desc, default desc;
    ``limit`` 1-100, default 20; ``after`` an item id of the listing)."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise GatewayError("invalid_request", "order must be asc or desc.", param="order")
    text = query.get("limit", "20")
    limit = int(text) if _LIMIT.fullmatch(text) else 0
    if not 1 <= limit <= 100:
        raise GatewayError("invalid_request", "limit must be from 1 to 100.", param="limit")
    ordered = list(items) if order == "asc" else list(reversed(items))
    start = 0
    after = query.get("after")
    if after is not None:
        ids = [entry.get("id") for entry in ordered]
        if after not in ids:
            raise GatewayError("invalid_request", "after names no item of it.", param="after")
        start = ids.index(after) + 1
    page = ordered[start : start + limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + limit < len(ordered),
    }
