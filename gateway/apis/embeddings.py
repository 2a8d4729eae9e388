"""``POST /v1/embeddings`` (spec §14): one JSON exchange, validated before it is returned.

Planning: ``input`` is a string, a list of strings, a list of token ids or a
list of token-id lists; at most ``limits.max_embedding_inputs`` inputs
(``invalid_request``, ``param: "input"``) and ``max_prompt_bytes`` over all of
them (a token id counts as four bytes, so the token estimate is exact for
token inputs). ``dimensions`` is refused (the worker refuses any value);
``stream`` is not a field here. The weight is ``cost.base`` and rate limits
count the prompt estimate.

The answer (:class:`EmbeddingsDialect`) must be ``object: list`` with one
``embedding`` entry per input, ``index`` 0…n-1 in order, each embedding a
list of finite numbers or (``encoding_format: base64``) base64 of
little-endian float32, all of one dimension, and ``usage.prompt_tokens`` =
``usage.total_tokens``; the alias is put back in ``model``.
"""

from __future__ import annotations

import array
import base64
import binascii
import json
import math
import sys
from collections.abc import Callable
from typing import Any, Literal

import orjson

from gateway.apis.base import (
    Dialect,
    Plan,
    PlanContext,
    Report,
    StreamBounds,
    check_prompt,
    require_object,
    require_text_modality,
    resolve_alias,
)
from gateway.apis.fields import (
    Spec,
    boolean,
    enum,
    harmless,
    integer,
    invalid,
    list_of,
    obj,
    string,
    text_size,
    unsupported,
)
from gateway.core.errors import GatewayError
from gateway.core.sse import NEED_DATA, Done, NeedData, violation

_TOKEN = integer(ge=0, le=2**32 - 1)


def _input(value: Any, path: str) -> Any:
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise invalid(path, "must be a string or a non-empty array")
    first = value[0]
    if isinstance(first, str):
        return list_of(string)(value, path)
    if isinstance(first, list):
        return list_of(list_of(_TOKEN, min_items=1))(value, path)
    return list_of(_TOKEN)(value, path)


def _dimensions(value: Any, path: str) -> Any:
    raise unsupported(path, "is not supported (the worker serves its model's dimensions)")


FIELDS: dict[str, Spec] = {
    "model": string,
    "input": _input,
    "encoding_format": enum("float", "base64"),
    "dimensions": _dimensions,
    "user": string,
    "truncate_sequence": boolean,
    "metadata": harmless,
    "safety_identifier": harmless,
}
FIELD_NAMES = frozenset(FIELDS)
BODY = obj(FIELDS, required=("model", "input"))


def inputs_of(value: Any) -> list[Any]:
    """The inputs, one entry each: a string, or a list of token ids."""
    if isinstance(value, str):
        return [value]
    if value and isinstance(value[0], int):
        return [value]
    return list(value)


class EmbeddingsApi:
    name = "embeddings"
    path = "/v1/embeddings"
    upstream_path = path
    policy_endpoint = name
    error_shape: Literal["openai", "anthropic"] = "openai"
    scope = "inference"
    operation = "embeddings"
    exchange: Literal["sse", "json"] = "json"
    #: the field a media refusal names (``param``)
    media_param = "input"

    def plan(self, body: Any, ctx: PlanContext) -> Plan:
        tenant = ctx.tenant
        clean: dict[str, Any] = BODY(require_object(body), "")
        alias = resolve_alias(clean, ctx)
        inputs = inputs_of(clean["input"])
        if len(inputs) > tenant.limits.max_embedding_inputs:
            raise GatewayError(
                "invalid_request",
                f"input has more than {tenant.limits.max_embedding_inputs} entries.",
                param="input",
            )
        prompt = sum(text_size(i) if isinstance(i, str) else 4 * len(i) for i in inputs)
        if prompt:
            require_text_modality(tenant, "input")
        check_prompt(prompt, tenant, "input")
        return Plan(
            endpoint=self.name,
            alias=alias,
            body=clean,
            stream=False,
            include_usage=True,
            max_tokens=None,
            prompt_bytes=prompt,
            nonce=ctx.nonce,
        )

    def forward(self, plan: Plan, route: str) -> dict[str, Any]:
        return {**plan.body, "model": route}

    def dialect(self, plan: Plan, bounds: StreamBounds, *, collect: bool) -> Dialect:
        return EmbeddingsDialect(plan, bounds)


class JsonBody:
    """A worker's one JSON answer as a sans-I/O source: bytes in (bounded), the
    parsed object out once the body ended, then :class:`~gateway.core.sse.Done`."""

    def __init__(self, max_bytes: int, loads: Callable[[bytes | str], Any] = json.loads) -> None:
        self._max = max_bytes
        self._loads = loads
        self._buf = bytearray()
        self._eof = False
        self._parsed = False
        self._error: GatewayError | None = None
        self.bytes_received = 0

    def receive_data(self, data: bytes) -> None:
        if not data:
            self._eof = True
            return
        self.bytes_received += len(data)
        if self.bytes_received <= self._max:
            self._buf += data

    def next_event(self) -> Any | Done | NeedData:
        if self._error is not None:
            raise self._error.with_traceback(None)
        if self._parsed:
            return Done()
        if self.bytes_received > self._max:
            self._error = violation("Upstream answer exceeded the size limit.")
            raise self._error
        if not self._eof:
            return NEED_DATA
        try:
            parsed = self._loads(bytes(self._buf))
        except (ValueError, RecursionError):
            self._error = violation("Upstream answer is not valid JSON.")
            raise self._error from None
        self._buf.clear()
        self._parsed = True
        return parsed


class EmbeddingsDialect:
    """The worker's embeddings JSON, checked (module docstring), alias put back."""

    terminal_frame = b""
    usage_source = "reported"

    def __init__(self, plan: Plan, bounds: StreamBounds) -> None:
        self._source = JsonBody(bounds.framing.max_stream_bytes, orjson.loads)
        self.alias = plan.alias
        self.expected = len(inputs_of(plan.body["input"]))
        self.base64 = plan.body.get("encoding_format") == "base64"
        self.has_content = False
        self._answer: dict[str, Any] | None = None
        self._usage: dict[str, Any] | None = None

    @property
    def source(self) -> JsonBody:
        return self._source

    def on_item(self, answer: Any) -> bytes | None:
        self._answer = self._check(answer)
        self.has_content = True
        return None

    def _check(self, answer: Any) -> dict[str, Any]:
        if not isinstance(answer, dict) or answer.get("object") != "list":
            raise violation("Upstream embeddings answer is not a list object.")
        data = answer.get("data")
        if not isinstance(data, list) or len(data) != self.expected:
            raise violation("Upstream embeddings answer has the wrong number of entries.")
        width: int | None = None
        for index, entry in enumerate(data):
            if not isinstance(entry, dict) or entry.get("object") != "embedding":
                raise violation("Upstream embedding entry is malformed.")
            if type(entry.get("index")) is not int or entry["index"] != index:
                raise violation("Upstream embedding entries are not indexed in order.")
            size = self._width(entry.get("embedding"))
            if width is not None and size != width:
                raise violation("Upstream embeddings differ in dimension.")
            width = size
        usage = answer.get("usage")
        if not isinstance(usage, dict):
            raise violation("Upstream embeddings answer carries no usage.")
        prompt, total = usage.get("prompt_tokens"), usage.get("total_tokens")
        # An embedding generates nothing: every token counted is a prompt token.
        if type(prompt) is not int or type(total) is not int or not 0 <= prompt == total:
            raise violation("Upstream embeddings usage is malformed.")
        self._usage = dict(usage)
        answer["model"] = self.alias
        return answer

    def _width(self, vector: Any) -> int:
        if self.base64:
            if not isinstance(vector, str):
                raise violation("Upstream embedding is not base64.")
            try:
                raw = base64.b64decode(vector, validate=True)
            except (binascii.Error, ValueError):
                raise violation("Upstream embedding is not base64.") from None
            if not raw or len(raw) % 4:
                raise violation("Upstream embedding is not float32 data.")
            values = array.array("f", raw)
            if sys.byteorder != "little":  # pragma: no cover - the wire is little-endian
                values.byteswap()
            if not all(math.isfinite(v) for v in values):
                raise violation("Upstream embedding has a value that is not finite.")
            return len(values)
        if not isinstance(vector, list) or not vector:
            raise violation("Upstream embedding is not a list of numbers.")
        for value in vector:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise violation("Upstream embedding is not a list of numbers.")
            if not math.isfinite(value):
                raise violation("Upstream embedding has a value that is not finite.")
        return len(vector)

    def error_frame(self, exc: GatewayError) -> bytes:
        raise AssertionError("an embeddings answer is never streamed")

    def report(self) -> Report:
        usage = self._usage
        counts = None
        if usage is not None:
            counts = (usage["prompt_tokens"], 0, usage["total_tokens"])
        return Report(finish_reason=None, usage=usage, counts=counts, outcome="complete")

    def answer(self, usage: dict[str, Any]) -> dict[str, Any]:
        assert self._answer is not None
        return self._answer
