"""SDK response objects → the JSON bytes ``mistralrs serve`` would write (pure).

Theory of operation: the SDK hands out the engine's own Rust response structs
(pyo3 classes with one read-only attribute per field, no dict or JSON form).
The server serializes those same structs with serde, so the wire form follows
from the struct:

- **Key order** is the struct's declaration order. The SDK's ``repr`` is the
  derived Rust ``Debug`` output, which prints fields in declaration order, so
  the order is read from it once per class (a field the engine gains later
  lands in its place without a change here). The few classes the SDK gives no
  ``repr`` have their order in :data:`DECLARED_ORDER`, from the Rust source; an
  attribute not listed there is still written, after the listed ones.
- **Absent fields**: ``None`` is ``null`` except for the fields the structs
  mark ``skip_serializing_if = "Option::is_none"`` (:data:`OMIT_IF_NONE`).
- **Bytes**: a ``Vec<u8>`` reaches Python as ``bytes``; serde writes it as an
  array of numbers.
- **Renames**: ``ToolCallResponse.tp`` is ``type``; unit enums are snake_case.
- **Numbers**: every float in these structs is an ``f32``; serde_json writes
  the shortest text that round-trips the f32 (ryu), not the widened f64;
  non-finite floats are ``null``.
- **Strings**: compact JSON, non-ASCII kept, control characters escaped the
  way serde_json does (``\\n``, ``\\u0000``…).
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

import numpy as np

# (struct, field) pairs serialized only when set, from mistralrs-core's response
# structs. ``stop_sequence`` and ``prompt_tokens_details`` are 0.9.5 fields not
# in the reference's source; they are omitted when unset as observed.
OMIT_IF_NONE: frozenset[tuple[str, str]] = frozenset(
    {
        ("ResponseMessage", "reasoning_content"),
        ("Delta", "reasoning_content"),
        ("Choice", "stop_sequence"),
        ("ChunkChoice", "stop_sequence"),
        ("Usage", "prompt_tokens_details"),
        ("ChatCompletionResponse", "adapter_generation"),
        ("ChatCompletionResponse", "agentic_tool_calls"),
        ("ChatCompletionResponse", "files"),
        ("ChatCompletionResponse", "session_id"),
        ("ChatCompletionChunkResponse", "adapter_generation"),
        ("ChatCompletionChunkResponse", "session_id"),
        ("CompletionResponse", "adapter_generation"),
        ("CompletionChunkResponse", "adapter_generation"),
    }
)
RENAMES: dict[tuple[str, str], str] = {("ToolCallResponse", "tp"): "type"}
# Structs whose pyo3 class has no Debug ``repr``: their declaration order.
DECLARED_ORDER: dict[str, tuple[str, ...]] = {
    "TopLogprob": ("token", "logprob", "bytes"),  # mistralrs-core sampler.rs
    "ToolCallResponse": ("index", "id", "tp", "function"),  # mistralrs-core tools/response.rs
    "CalledFunction": ("name", "arguments"),  # mistralrs-mcp tools.rs
    "PromptTokensDetails": ("cached_tokens",),  # 0.9.5 (its only serde field name)
}

_FIELD_LINE = re.compile(r"^    ([a-z_][a-z0-9_]*): ", re.MULTILINE)
_orders: dict[type, tuple[str, ...]] = {}


def field_order(obj: object) -> tuple[str, ...]:
    """The fields of the SDK object's struct, in declaration (= serialization) order."""
    cls = type(obj)
    order = _orders.get(cls)
    if order is None:
        text = repr(obj)
        if text.startswith(cls.__name__ + " {"):
            order = tuple(_FIELD_LINE.findall(text))
        elif cls.__name__ in DECLARED_ORDER:
            declared = DECLARED_ORDER[cls.__name__]
            order = declared + tuple(sorted(set(_attributes(cls)) - set(declared)))
        else:
            raise TypeError(f"{cls.__name__} has no Rust Debug repr to read its fields from")
        _orders[cls] = order
    return order


def _attributes(cls: type) -> list[str]:
    """The pyo3 class's field getters."""
    return [
        name
        for name, member in vars(cls).items()
        if type(member).__name__ == "getset_descriptor" and not name.startswith("_")
    ]


def to_wire(value: Any) -> Any:
    """A JSON-ready tree (dicts in the server's key order) for an SDK value."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return F32(value) if math.isfinite(value) else None
    if isinstance(value, bytes):  # pyo3's form of a Vec<u8>, which serde writes as numbers
        return list(value)
    if isinstance(value, list | tuple):
        return [to_wire(item) for item in value]
    if isinstance(value, dict):
        return {str(key): to_wire(item) for key, item in value.items()}
    name = type(value).__name__
    text = repr(value)
    if text.startswith(name + ".") and " " not in text:  # a pyo3 unit enum: "ToolCallType.Function"
        return _snake(text[len(name) + 1 :])
    out: dict[str, Any] = {}
    for field in field_order(value):
        item = getattr(value, field)
        if item is None and (name, field) in OMIT_IF_NONE:
            continue
        out[RENAMES.get((name, field), field)] = to_wire(item)
    return out


class F32(float):
    """A float that came from an f32: written with the f32's shortest round-trip digits."""


def dumps(value: Any) -> bytes:
    """Compact JSON as serde_json writes it (see the module docstring)."""
    parts: list[str] = []
    _emit(value, parts)
    return "".join(parts).encode("utf-8")


def f32_text(value: float) -> str:
    """serde_json's (ryu's) text for ``value`` narrowed to an f32."""
    digits_text = str(np.float32(value))
    sign = "-" if digits_text.startswith("-") else ""
    exponent_form = Decimal(digits_text.lstrip("-")).normalize().as_tuple()
    digits = "".join(str(d) for d in exponent_form.digits)
    exp = int(exponent_form.exponent)
    if digits == "0":
        return sign + "0.0"
    return sign + _ryu_pretty(digits, exp)


def _ryu_pretty(digits: str, exp: int) -> str:
    # ryu 1.0.22 ``format32``: value = digits * 10**exp; kk = where the point goes.
    length = len(digits)
    kk = length + exp
    if exp >= 0 and kk <= 13:
        return digits + "0" * exp + ".0"
    if 0 < kk <= 13:
        return digits[:kk] + "." + digits[kk:]
    if -6 < kk <= 0:
        return "0." + "0" * -kk + digits
    if length == 1:
        return f"{digits}e{kk - 1}"
    return f"{digits[0]}.{digits[1:]}e{kk - 1}"


def _emit(value: Any, parts: list[str]) -> None:
    if value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif isinstance(value, F32):
        parts.append(f32_text(value))
    elif isinstance(value, int):
        parts.append(str(value))
    elif isinstance(value, float):
        parts.append(repr(value) if math.isfinite(value) else "null")
    elif isinstance(value, str):
        parts.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, dict):
        parts.append("{")
        for index, (key, item) in enumerate(value.items()):
            if index:
                parts.append(",")
            parts.append(json.dumps(key, ensure_ascii=False))
            parts.append(":")
            _emit(item, parts)
        parts.append("}")
    elif isinstance(value, list):
        parts.append("[")
        for index, item in enumerate(value):
            if index:
                parts.append(",")
            _emit(item, parts)
        parts.append("]")
    else:
        raise TypeError(f"cannot serialize {type(value).__name__}")


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
