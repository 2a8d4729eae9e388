"""Response plans: pure generators of steps (head, bytes, pause, end, faults)
built from one request and its knobs. No I/O.

This module holds the step types, the replies every route shares, the
shared HTTP envelope of inference replies (:func:`envelope`, the faults every
dialect shares) and helpers of the dialects: chat.py (chat and completions),
responses.py (``/v1/responses``), embeddings.py (``/v1/embeddings``).
"""

from __future__ import annotations

import enum
import gzip
import uuid
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.testing.simulator.agent_notes import AgentNote
from gateway.testing.simulator.knobs import SIMULATOR_HEADER, SimKnobs

_INVALID_UTF8_MARK = "\x1asim-invalid-utf8\x1a"
INVALID_UTF8_MARK = _INVALID_UTF8_MARK
NUL_TEXT = "sim-\x00-nul "

_INVALID_UTF8_JSON = orjson.dumps(_INVALID_UTF8_MARK)[1:-1]

_DONE_EVENT = b"data: [DONE]\n\n"
DONE_EVENT = _DONE_EVENT

UNICODE_WORDS = ("héllo", "wörld", "✓", "日本", "🙂")

#: an agentic named event, as the engine can put one in any dialect's stream
NAMED_EVENT = (
    b"event: agentic_tool_call_progress\n"
    b'data: {"type":"agentic_tool_call_progress","round":1,"tool_name":"sim_tool",'
    b'"phase":"calling","data":{"tool_type":"custom"}}\n\n'
)

# tower-http CorsLayer with `Any` origin, as the real server answers every request.
_COMMON_HEADERS = (
    ("access-control-allow-origin", "*"),
    ("vary", "origin, access-control-request-method, access-control-request-headers"),
    ("access-control-expose-headers", "x-request-id"),
    SIMULATOR_HEADER,
)


#: what an idle SSE stream sends after ``keepalive_ms`` of quiet (axum's comment)
KEEPALIVE_EVENT = b":\n\n"
_FAILURE = b'{"message":"simulated failure"}'


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    headers: list[tuple[str, str]]
    length: int | None  # None: transfer-encoding chunked
    #: the event a chunked (SSE) body sends while idle (``keepalive_ms``)
    idle: bytes = KEEPALIVE_EVENT


@dataclass(frozen=True, slots=True)
class Pause:
    seconds: float


@dataclass(frozen=True, slots=True)
class Wait:
    """Await ``until()`` before the next step (keep-alives go on meanwhile). Only the
    core makes these, from a plan's question (agent_notes.AwaitDecision): a plan
    itself never awaits anything."""

    until: Callable[[], Coroutine[Any, Any, None]]


class Op(enum.Enum):
    END = "end"
    ABORT = "abort"
    HANG = "hang"
    ENDLESS = "endless"


Step = Head | Pause | Wait | Op | bytes
STEP_TYPES = (Head, Pause, Wait, Op, bytes)

DESERIALIZE = "Failed to deserialize the JSON body into the target type: "


class Reject(Exception):
    """A request the (simulated) server refuses before generating anything."""

    def __init__(self, status: int, message: str, *, as_json: bool) -> None:
        super().__init__(message)
        self.status, self.message, self.as_json = status, message, as_json

    @classmethod
    def shape(cls, problem: str) -> Reject:
        """axum's JSON rejection: 422 text/plain."""
        return cls(422, DESERIALIZE + problem, as_json=False)

    @classmethod
    def handler(cls, status: int, message: str) -> Reject:
        """The handler's own refusal: ``{"message": ...}``."""
        return cls(status, message, as_json=True)

    def reply(self, request_id: str) -> Iterator[Step]:
        if self.as_json:
            return json_reply(self.status, {"message": self.message}, request_id)
        return text_reply(self.status, self.message, request_id)


@dataclass(frozen=True, slots=True)
class Shape:
    """What one generated answer holds: reasoning chunks, then text chunks, then the finish."""

    reasoning: int
    count: int
    finish: str

    @property
    def tokens(self) -> int:
        """Completion tokens: each chunk is one "token", reasoning included."""
        return self.reasoning + self.count


def shape(knobs: SimKnobs, max_tokens: int | None, *, reasoning: bool = True) -> Shape:
    """The answer's shape. Hitting ``max_tokens`` wins over everything (``length``);
    reasoning (none unless ``reasoning``) comes first, so the text gets what is
    left of the bound."""
    finish = "tool_calls" if knobs.tool_call else knobs.finish
    count = knobs.chunks
    thinking = knobs.reasoning if reasoning else 0
    if max_tokens is not None and thinking + count >= max_tokens:
        thinking = min(thinking, max_tokens)
        return Shape(thinking, max_tokens - thinking, "length")
    return Shape(thinking, count, finish)


def reasoning_text(i: int) -> str:
    return f"sim-thinking-{i} "


def rough_tokens(texts: Iterable[str], per_text: int) -> int:
    """About four characters a token, plus a few for each message's template."""
    total = sum((len(t) + 3) // 4 + per_text for t in texts)
    return max(1, total)


def sim_uuid(seed: int, number: int, kind: int) -> str:
    """A uuid4-shaped id made from the simulator's seed, a request number and a kind.

    Ids look like the real server's ``Uuid::new_v4()`` but are reproducible:
    the same seed, request order and kind give the same id.
    """
    mask48, mask64 = (1 << 48) - 1, (1 << 64) - 1
    value = ((seed & mask64) << 64) | ((kind & 0x3FFF) << 48) | (number & mask48)
    return str(uuid.UUID(int=value, version=4))


def mid_fault(
    fault: str, error: Callable[[], bytes], *, done: bytes = DONE_EVENT
) -> Iterator[bytes | Op]:
    """What a fault in the middle of a stream sends there: the cut, the silence,
    or the dialect's in-band ``error()`` then its terminator ``done`` (``[DONE]``;
    none on an Anthropic stream), each the stream's end; ``named_event`` /
    ``unknown_event`` only add the agentic event and the stream goes on.
    ``error`` is called only when sent (a Responses event takes a sequence
    number)."""
    if fault == "close_mid":
        yield Op.ABORT
    elif fault == "hang_mid":
        yield Op.HANG
    elif fault in ("named_event", "unknown_event"):
        yield NAMED_EVENT
    else:
        yield error()
        if done:
            yield done
        yield Op.END


def dump(obj: Any) -> bytes:
    """Compact JSON (serde's bytes for these shapes); the invalid-UTF-8 mark becomes FF FE."""
    data = orjson.dumps(obj)
    if _INVALID_UTF8_JSON in data:
        data = data.replace(_INVALID_UTF8_JSON, b"sim-\xff\xfe-bad ")
    return data


def token_text(i: int, unicode: bool, pad: int = 0) -> str:
    word = UNICODE_WORDS[i % len(UNICODE_WORDS)] if unicode else "token"
    text = f"sim-{word}-{i} "
    return text.ljust(pad, ".") if pad else text


def chunk_text(knobs: SimKnobs, i: int) -> str:
    """Chunk ``i``'s text: the labelled filler, or piece ``i`` of the ``text`` knob
    cut into ``knobs.chunks`` pieces (the last ones empty when it is short)."""
    if knobs.text is None:
        return token_text(i, knobs.unicode, knobs.pad)
    size = -(-len(knobs.text) // max(knobs.chunks, 1))
    return knobs.text[i * size : (i + 1) * size]


def _id_headers(request_id: str, fault: str | None) -> list[tuple[str, str]]:
    if fault == "no_request_id":
        return []
    if fault == "wrong_request_id":
        return [("x-request-id", "req_" + uuid.uuid4().hex)]
    return [("x-request-id", request_id)]


def simple_reply(
    status: int, body: bytes, request_id: str, content_type: str | None = None
) -> Iterator[Step]:
    headers = [("content-type", content_type)] if content_type else []
    headers += [("x-request-id", request_id), *_COMMON_HEADERS]
    yield Head(status, headers, len(body))
    yield body
    yield Op.END


def sse_error_reply(request_id: str, message: str) -> Iterator[Step]:
    """A stream the engine refused once the head was sent: the in-band error, ``[DONE]``."""
    error = {"message": message, "type": "server_error", "param": None, "code": None}
    headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
    yield Head(200, [*headers, ("x-request-id", request_id), *_COMMON_HEADERS], None)
    yield b"data: " + orjson.dumps({"error": error}) + b"\n\n"
    yield _DONE_EVENT
    yield Op.END


def json_reply(status: int, obj: Any, request_id: str) -> Iterator[Step]:
    return simple_reply(status, orjson.dumps(obj), request_id, "application/json")


def text_reply(status: int, text: str, request_id: str) -> Iterator[Step]:
    return simple_reply(status, text.encode(), request_id, "text/plain; charset=utf-8")


@dataclass(frozen=True, slots=True)
class StoreCommit:
    """A plan's note to the core: remember a Responses run at this point of the reply.

    Never written: the core takes these out of a plan before the transport sees
    it (a plan stays a pure value). ``history`` is the conversation as the real
    server stores it for ``previous_response_id``; ``resource`` (when not None)
    is also kept for ``GET /v1/responses/{id}``.
    """

    response_id: str
    history: tuple[str, ...] | None
    resource: dict[str, Any] | None


PlanStep = Step | StoreCommit | AgentNote
SseBody = Iterator[bytes | Pause | Op | StoreCommit | AgentNote]


@dataclass(frozen=True, slots=True)
class Envelope:
    """What a dialect hands to :func:`envelope`, which adds the HTTP-level faults.

    ``json_body`` makes the non-streamed body (also a streamed request's under
    ``json_body``), sent after ``delay_s`` (the whole generation time) with
    ``json_status``; ``sse_body`` the streamed one (None: never streamed);
    ``commit`` is yielded just before a JSON body. ``idle`` is what the stream
    sends while idle, ``failure`` the body of a ``status`` knob's answer
    (``failure(status)``; None: ``{"message":"simulated failure"}``).
    """

    stream: bool
    knobs: SimKnobs
    request_id: str
    delay_s: float
    json_body: Callable[[], bytes]
    sse_body: Callable[[], SseBody] | None = None
    json_status: int = 200
    commit: StoreCommit | None = None
    idle: bytes = KEEPALIVE_EVENT
    failure: Callable[[int], bytes] | None = None
    #: a body that is not JSON (speech), used instead of ``json_body``
    raw: RawBody | None = None
    #: ``close_mid`` cuts the body half-way, after the head (media), instead of
    #: cutting the connection half-way through the generation
    cut_body: bool = False


@dataclass(frozen=True, slots=True)
class RawBody:
    """A non-JSON body: its type, its length, and its bytes in blocks, made as they
    are written (a large body is never held whole)."""

    content_type: str
    length: int
    blocks: Callable[[], Iterator[bytes]]


def _first(blocks: Iterator[bytes], size: int) -> Iterator[bytes]:
    """The first ``size`` bytes of ``blocks``."""
    for block in blocks:
        if size <= 0:
            return
        yield block[:size]
        size -= len(block)


def _json_raw(body: bytes) -> RawBody:
    return RawBody("application/json", len(body), lambda: iter([body]))


def envelope(env: Envelope) -> Iterator[PlanStep]:
    """The HTTP-level part of every inference reply: status, headers, the shared faults.

    ``status`` (knob) answers ``{"message":"simulated failure"}`` with that
    status; ``hang_headers`` never answers; ``redirect`` is a 307 to
    ``/sim/redirected``; ``huge_headers`` adds a 200 KiB header;
    ``wrong_request_id``/``no_request_id`` change ``x-request-id``;
    ``close_mid`` (not streamed) cuts the connection half-way through the
    generation (``cut_body``: half-way through the body); ``hang`` sends the
    head only (not streamed: nothing); ``gzip`` compresses the whole body
    (``content-encoding: gzip``); ``wrong_content_type`` says ``text/plain``;
    ``json_body`` answers a streamed request with the JSON body;
    ``endless_line`` streams one line that never ends.
    """
    k = env.knobs
    fault = k.fault
    base = [*_id_headers(env.request_id, fault), *_COMMON_HEADERS]
    if fault == "huge_headers":
        base.append(("x-sim-padding", "p" * 200 * 1024))
    if k.status is not None:
        failure = _FAILURE if env.failure is None else env.failure(k.status)
        yield from simple_reply(k.status, failure, env.request_id, "application/json")
        return
    if fault == "hang_headers":
        yield Op.HANG
        return
    if fault == "redirect":
        yield Head(307, [("location", "/sim/redirected"), *base], 0)
        yield Op.END
        return
    if fault == "close_mid" and not env.stream and not env.cut_body:
        yield Pause(env.delay_s / 2)
        yield Op.ABORT
        return
    if not env.stream or fault == "json_body" or env.sse_body is None:
        if not env.stream:
            yield Pause(env.delay_s)
        if fault == "hang":
            yield Op.HANG
            return
        raw = env.raw or _json_raw(env.json_body())
        headers = [("content-type", raw.content_type), *base]
        length, blocks = raw.length, raw.blocks()
        if fault == "gzip":
            body = gzip.compress(b"".join(blocks), mtime=0)
            length, blocks = len(body), iter([body])
            headers.append(("content-encoding", "gzip"))
        elif fault == "wrong_content_type":
            headers[0] = ("content-type", "text/plain; charset=utf-8")
        if env.commit is not None:
            yield env.commit
        yield Head(env.json_status, headers, length)
        if fault == "close_mid":
            yield from _first(blocks, length // 2)
            yield Op.ABORT
            return
        yield from blocks
        yield Op.END
        return
    content_type = "text/plain; charset=utf-8" if fault == "wrong_content_type" else None
    headers = [("content-type", content_type or "text/event-stream")]
    headers += [("cache-control", "no-cache"), *base]
    if fault == "gzip":
        # Compressed as a whole: pauses are dropped, the bytes are what matter here.
        steps = list(env.sse_body())
        yield from (s for s in steps if isinstance(s, StoreCommit))
        whole = b"".join(s for s in steps if isinstance(s, bytes))
        yield Head(200, [*headers, ("content-encoding", "gzip")], None)
        yield gzip.compress(whole, mtime=0)
        yield Op.END
        return
    yield Head(200, headers, None, env.idle)
    if fault == "hang":
        yield Op.HANG
    elif fault == "endless_line":
        yield b"data: "
        yield Op.ENDLESS
    else:
        yield from env.sse_body()
