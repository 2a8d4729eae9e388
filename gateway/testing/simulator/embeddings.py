"""``POST /v1/embeddings`` as mistral.rs answers it (findings §6). Pure.

Request (``EmbeddingRequest``): ``model`` (default ``"default"``), ``input``
required: a string, a list of strings, a list of token ids (u32) or a list of
such lists (``[]`` is an empty string list); ``encoding_format`` ``float``
(default) | ``base64`` | null; ``dimensions`` not null → 422; ``user`` and
``truncate_sequence`` accepted. Unknown keys are ignored; shape errors are
axum's 422 text. Checks in the handler's order: the model (unknown → 422,
unlike chat's 500), ``dimensions`` (422), an empty input list (422), then the
engine: an empty prompt answers 500 ``Received an empty prompt.``. Error
bodies are ``{"message": ...}``.

Answer, in serde's key order::

    {"object":"list","data":[{"object":"embedding","embedding":[f32...]|"<base64>","index":i}...],
     "model":<the request's model string>,"usage":{"prompt_tokens":n,"total_tokens":n}}

Vectors are ``dims`` (knob, default 8) values k/128 (k in -128..127, exact in
f32 and f64, so float and base64 agree) taken from SHAKE-256 of the input,
so equal inputs get equal vectors. base64 is little-endian f32 bytes,
standard alphabet with padding. ``prompt_tokens`` per input: about four
characters a token for text, the count for token ids; summed. The ``extras``
knob adds ``usage.prompt_tokens_details: {"cached_tokens": 0}``.

Directives: ``[[sim ...]]`` in any string input (later ones win).

Faults (``EMBEDDINGS_FAULTS``): ``wrong_count`` (the last entry missing),
``bad_index`` (the first two entries swapped, so indices are out of order; one
input gets index 1), ``bad_usage`` (``total_tokens`` one too many),
``non_finite`` (the first value is ``1e999``, which parses to infinity; with
base64 the first value's bytes are a NaN), plus the envelope's
``close_mid``, ``hang``, ``hang_headers``, ``wrong_content_type``, ``gzip``,
``redirect``, ``wrong_request_id``, ``no_request_id``, ``huge_headers``; and
the ``status`` knob. The reply comes after ``first_delay_ms + delay_ms``.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gateway.testing.simulator.knobs import SimKnobs
from gateway.testing.simulator.plans import Envelope, PlanStep, Reject, dump, envelope

_U32 = 1 << 32
_NOT_FINITE = "sim-non-finite"  # a string inside a float list: replaced by 1e999
_NAN_F32 = struct.pack("<I", 0x7FC00000)


@dataclass(frozen=True, slots=True)
class EmbedCall:
    model: str
    inputs: tuple[str | tuple[int, ...], ...]
    base64: bool
    dimensions: int | None

    @property
    def directive_text(self) -> str:
        return "\n".join(i for i in self.inputs if isinstance(i, str))


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _U32


def _inputs(value: Any) -> tuple[str | tuple[int, ...], ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return tuple(value)
        if all(_is_token(v) for v in value):
            return (tuple(value),)
        if all(isinstance(v, list) and all(_is_token(t) for t in v) for v in value):
            return tuple(tuple(v) for v in value)
    if value is None:
        raise Reject.shape("missing field `input`")
    raise Reject.shape("input: data did not match any variant of untagged enum EmbeddingInput")


def parse_embeddings(req: Any) -> EmbedCall:
    """Read the body (axum's part); the handler's checks are in :func:`check`."""
    if not isinstance(req, dict):
        raise Reject.shape("invalid type: expected a JSON object")
    model = req.get("model", "default")
    if not isinstance(model, str):
        raise Reject.shape("invalid type: model, expected a string")
    inputs = _inputs(req.get("input"))
    encoding = req.get("encoding_format")
    if encoding not in (None, "float", "base64"):
        raise Reject.shape("encoding_format: unknown variant, expected `float` or `base64`")
    dimensions = req.get("dimensions")
    if dimensions is not None and not _is_token(dimensions):
        raise Reject.shape("invalid type: dimensions, expected usize")
    if req.get("user") is not None and not isinstance(req["user"], str):
        raise Reject.shape("invalid type: user, expected a string")
    if req.get("truncate_sequence") is not None and not isinstance(req["truncate_sequence"], bool):
        raise Reject.shape("invalid type: truncate_sequence, expected a boolean")
    return EmbedCall(model, inputs, encoding == "base64", dimensions)


def check(call: EmbedCall) -> None:
    """The handler's checks after the model's: dimensions, empty input, empty prompts."""
    if call.dimensions is not None:
        message = f"Custom embedding dimensions ({call.dimensions}) are not supported."
        raise Reject.handler(422, message)
    if not call.inputs:
        raise Reject.handler(422, "input must contain at least one entry.")
    if any(len(i) == 0 for i in call.inputs):
        raise Reject.handler(500, "Received an empty prompt.")


def _tokens(item: str | tuple[int, ...]) -> int:
    return len(item) if isinstance(item, tuple) else max(1, (len(item) + 3) // 4)


def vector(item: str | tuple[int, ...], dims: int) -> list[float]:
    """The simulated embedding of one input."""
    key = (
        item.encode()
        if isinstance(item, str)
        else b"tokens:" + struct.pack(f"<{len(item)}I", *item)
    )
    digest = hashlib.shake_256(key).digest(dims)
    return [(b - 128) / 128 for b in digest]


def _encode(values: list[float], as_base64: bool, non_finite: bool) -> list[Any] | str:
    if not as_base64:
        return [_NOT_FINITE, *values[1:]] if non_finite else list(values)
    raw = struct.pack(f"<{len(values)}f", *values)
    if non_finite:
        raw = _NAN_F32 + raw[4:]
    return base64.b64encode(raw).decode("ascii")


def _body(call: EmbedCall, knobs: SimKnobs) -> bytes:
    fault = knobs.fault
    data: list[dict[str, Any]] = []
    for index, item in enumerate(call.inputs):
        values = vector(item, knobs.dims)
        embedding = _encode(values, call.base64, fault == "non_finite" and index == 0)
        data.append({"object": "embedding", "embedding": embedding, "index": index})
    if fault == "wrong_count":
        data.pop()
    elif fault == "bad_index":
        if len(data) > 1:
            data[0]["index"], data[1]["index"] = data[1]["index"], data[0]["index"]
        else:
            data[0]["index"] = 1
    prompt = sum(_tokens(i) for i in call.inputs)
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + (fault == "bad_usage"),
    }
    if knobs.extras:
        # what newer releases add (a cache hit count, spec §21)
        usage["prompt_tokens_details"] = {"cached_tokens": 0}
    body = dump({"object": "list", "data": data, "model": call.model, "usage": usage})
    return body.replace(b'"' + _NOT_FINITE.encode() + b'"', b"1e999")


def plan_embeddings(call: EmbedCall, knobs: SimKnobs, request_id: str) -> Iterator[PlanStep]:
    def json_body() -> bytes:
        return _body(call, knobs)

    delay = (knobs.first_delay_ms + knobs.delay_ms) / 1000
    return envelope(Envelope(False, knobs, request_id, delay, json_body))
