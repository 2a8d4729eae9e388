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

Memory (:class:`EmbeddingsBody`): an answer is bounded by what the request
can produce, ``inputs * (vector bound + 256) + 64 KiB`` (the vector bound is
:data:`MAX_DIMENSIONS` floats of at most :data:`FLOAT_TEXT_BYTES` each, or
their base64, ``4·⌈4·dims/3⌉``), and by ``max_stream_bytes``; past either it
is refused (``upstream_protocol_error``) as the bytes arrive, and nothing
more is kept. The answer is held once, as the worker's bytes, and never
parsed whole: one scan finds the envelope (its small values parsed), the
``data`` array and each entry's vector; each vector is then parsed and
checked alone, and dropped. The ``data`` array goes back to the caller as
the worker's bytes (an ``orjson.Fragment``; moved to the buffer's start in
place, not copied); only the envelope is written anew, ``model`` replaced,
and the reply sends the array as those bytes, in pieces
(:class:`~gateway.core.replies.Spliced`), not copied into one payload.
What is not a vector (keys, ``index``, ``usage``, unknown fields) is bounded
at 64 KiB + 1 KiB per input, and one vector at its bound, so a worker cannot
make the scan slow or a parse large either. Stricter than parsing whole: a
key repeated in one object, a key over 256 bytes and a vector of more than
:data:`MAX_DIMENSIONS` values are refused too.
"""

from __future__ import annotations

import array
import base64
import binascii
import math
import sys
from typing import Any, ClassVar

import orjson

from gateway.apis.base import (
    Dialect,
    Endpoint,
    OneCall,
    Plan,
    PlanContext,
    Report,
    StreamBounds,
    check_prompt,
    require_object,
    require_text_modality,
    resolve_alias,
)
from gateway.apis.embeddings.scan import (
    _DATA,
    _ENTRY_BUDGET,
    _ENVELOPE_BYTES,
    _NUMBERS,
    MAX_DIMENSIONS,
    EmbeddingsAnswer,
    answer_bound,
    scan_answer,
    vector_bound,
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
from gateway.apis.held import HeldBody
from gateway.apis.usage import counts_only
from gateway.core.errors import GatewayError
from gateway.core.replies import Spliced
from gateway.core.sse import violation

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
    endpoint: ClassVar[Endpoint] = Endpoint(
        name="embeddings",
        path="/v1/embeddings",
        operation="embeddings",
        media_param="input",
        exchange="json",
        # A chat route also embeds: every config before route kinds did (spec §23 deviation).
        route_kinds=frozenset({"embeddings", "chat"}),
    )

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
            endpoint=self.endpoint.name,
            alias=alias,
            body=clean,
            stream=False,
            include_usage=True,
            max_tokens=None,
            prompt_bytes=prompt,
            nonce=ctx.nonce,
            turns=len(inputs),
        )

    def forward(self, plan: Plan, route: str) -> dict[str, Any]:
        return {**plan.body, "model": route}

    def dialect(self, plan: Plan, bounds: StreamBounds, *, collect: bool) -> Dialect:
        return EmbeddingsDialect(plan, bounds)


class EmbeddingsBody(HeldBody):
    """The worker's embeddings answer as a sans-I/O source (:class:`JsonBody`'s
    states): bytes in, bounded at ``max_bytes`` (refused as they arrive,
    nothing more kept), held once; at the end, one :class:`EmbeddingsAnswer`
    whose ``data`` is the worker's own bytes, then
    :class:`~gateway.core.sse.Done`."""

    def __init__(self, max_bytes: int, *, entries: int, budget: int, vector_bytes: int) -> None:
        super().__init__(max_bytes)
        self._entries = entries
        self._budget = budget
        self._vector_bytes = vector_bytes

    def _result(self) -> EmbeddingsAnswer:
        buf = self._held
        assert buf is not None
        view = buf.getbuffer()
        try:
            answer, start, end = scan_answer(
                view, entries=self._entries, budget=self._budget, vector_bytes=self._vector_bytes
            )
            if answer.entries is not None:
                # The data array to the buffer's start (a memmove) and the rest cut
                # off: its bytes become the answer's without a copy.
                view[: end - start] = view[start:end]
        finally:
            view.release()
        if answer.entries is not None:
            buf.truncate(end - start)
            answer.data = buf.getvalue()
            for entry in answer.entries:  # where the vectors now are
                if entry.vector is not None:
                    entry.vector = (entry.vector[0] - start, entry.vector[1] - start)
        return answer


class EmbeddingsDialect(OneCall):
    """The worker's embeddings JSON, checked (module docstring), alias put back."""

    terminal_frame = b""
    usage_source = "reported"

    def __init__(self, plan: Plan, bounds: StreamBounds) -> None:
        self.alias = plan.alias
        self.full_usage = plan.full_usage
        self.max_prompt_tokens = bounds.max_prompt_tokens
        self.expected = len(inputs_of(plan.body["input"]))
        self.base64 = plan.body.get("encoding_format") == "base64"
        self.max_bytes = min(
            bounds.framing.max_stream_bytes,
            answer_bound(self.expected, base64_vectors=self.base64),
        )
        self._source = EmbeddingsBody(
            self.max_bytes,
            entries=self.expected,
            budget=_ENVELOPE_BYTES + _ENTRY_BUDGET * self.expected,
            vector_bytes=vector_bound(base64_vectors=self.base64),
        )
        self.has_content = False
        self._answer: dict[str, Any] | None = None
        self._usage: dict[str, Any] | None = None

    @property
    def source(self) -> EmbeddingsBody:
        return self._source

    def on_item(self, answer: Any) -> bytes | None:
        self._answer = self._check(answer)
        self.has_content = True
        return None

    def _check(self, answer: EmbeddingsAnswer) -> dict[str, Any]:
        fields = dict(answer.fields)
        if fields.get("object") != "list":
            raise violation("Upstream embeddings answer is not a list object.")
        entries, data = answer.entries, answer.data
        if entries is None or data is None or len(entries) != self.expected:
            raise violation("Upstream embeddings answer has the wrong number of entries.")
        width: int | None = None
        with memoryview(data) as view:
            for index, entry in enumerate(entries):
                if entry.fields.get("object") != "embedding" or entry.vector is None:
                    raise violation("Upstream embedding entry is malformed.")
                position = entry.fields.get("index")
                if type(position) is not int or position != index:
                    raise violation("Upstream embedding entries are not indexed in order.")
                size = self._width(view, *entry.vector)
                if size > MAX_DIMENSIONS:
                    raise violation("Upstream embedding is wider than any model's.")
                if width is not None and size != width:
                    raise violation("Upstream embeddings differ in dimension.")
                width = size
        usage = fields.get("usage")
        if not isinstance(usage, dict):
            raise violation("Upstream embeddings answer carries no usage.")
        prompt, total = usage.get("prompt_tokens"), usage.get("total_tokens")
        # An embedding generates nothing: every token counted is a prompt token.
        if type(prompt) is not int or type(total) is not int or not 0 <= prompt == total:
            raise violation("Upstream embeddings usage is malformed.")
        if self.max_prompt_tokens is not None and prompt > self.max_prompt_tokens:
            raise violation("Upstream usage claims more prompt tokens than were sent.")
        self._usage = dict(usage)
        # The worker's order and values, its data array as its bytes, the alias in `model`.
        # Spliced: the reply sends `data` as these bytes, never copied into one payload.
        out = Spliced("data", data)
        for key, value in answer.fields:
            out[key] = orjson.Fragment(data) if value is _DATA else value
        out["model"] = self.alias
        if not self.full_usage:
            # The counts only (spec §21): cache hits tell of other tenants' prompts.
            out["usage"] = counts_only(usage)
        return out

    def _width(self, view: memoryview, start: int, end: int) -> int:
        """The vector's length, checked; parsed alone and dropped."""
        if self.base64:
            try:
                vector = orjson.loads(view[start:end])
            except ValueError:
                raise violation("Upstream embedding is not base64.") from None
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
            if not all(map(math.isfinite, values)):
                raise violation("Upstream embedding has a value that is not finite.")
            return len(values)
        # Only number characters, then orjson's grammar: numbers, every one (no
        # string, literal or container); orjson refuses one out of float range.
        if _NUMBERS.fullmatch(view, start, end) is None:
            raise violation("Upstream embedding is not a list of numbers.")
        try:
            numbers = orjson.loads(view[start:end])
        except ValueError:  # not the grammar, or out of float range
            raise violation("Upstream embedding is not a list of finite numbers.") from None
        if not numbers:
            raise violation("Upstream embedding is not a list of numbers.")
        if not (math.isfinite(min(numbers)) and math.isfinite(max(numbers))):
            raise violation("Upstream embedding has a value that is not finite.")
        return len(numbers)

    def error_frame(self, exc: GatewayError) -> bytes:
        raise AssertionError("an embeddings answer is never streamed")

    def report(self) -> Report:
        usage = self._usage
        counts = None
        if usage is not None:
            counts = (usage["prompt_tokens"], 0, usage["total_tokens"])
        return Report(finish_reason=None, usage=usage, counts=counts, outcome="complete")

    def answer(self, usage: dict[str, Any]) -> dict[str, Any]:
        """The answer, handed over (asked once): the dialect keeps no reference, so
        the worker's bytes go as soon as the reply is written."""
        answer, self._answer = self._answer, None
        assert answer is not None
        return answer
