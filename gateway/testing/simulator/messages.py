"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` replies, as the
worker's ``anthropic.rs`` makes them from its chat pipeline (reference §12).
Pure.

The answer is generated like chat's (``plans.shape``: ``reasoning`` chunks,
then ``chunks`` text chunks, the finish; ``max_tokens`` wins), each chat
chunk mapped to Anthropic events the way ``AnthropicStreamer`` maps it.
Streamed, each event is ``event: <name>\\ndata: <json>\\n\\n``, and the body
ends after ``message_stop`` (no ``[DONE]``)::

    message_start        message{id "<n>", content [], model <route>, usage of the first
                         chunk: {input_tokens 0, output_tokens 0} unless it is the last}
    content_block_start  {type thinking, thinking ""}       } ``reasoning=N``: a thinking
    content_block_delta  thinking_delta, one per chunk      } block (index 0)
    content_block_stop                                      }
    content_block_start  {type text, text ""}                } the text block, opened by the
    content_block_delta  text_delta, one per non-empty chunk } first text (none without text)
    content_block_stop                                       }
    content_block_start  tool_use{id call-<uuid>, name, input {}}  } ``tool_call``: the whole
    content_block_delta  input_json_delta, all the arguments       } call, on the final chunk
    content_block_stop                                             }
    message_delta        delta{stop_reason, stop_sequence null}, usage{output_tokens} only
    message_stop

``stop_reason`` from the finish: ``stop`` → ``end_turn``, ``length`` →
``max_tokens``, ``tool_calls`` → ``tool_use`` (``canceled``: ``end_turn``, the
worker's fallback). While idle the stream sends ``event: ping`` /
``{"type":"ping"}`` after ``keepalive_ms`` of quiet (the worker ticks its ping
at the keep-alive interval; its axum comments then hardly ever come). An
error is ``event: error`` ``{"type":"error","error":{"type":"api_error",
"message":…}}``, then the body ends.

Non-streamed: ``{"id","type":"message","role","content","model","stop_reason",
"stop_sequence":null,"usage":{"input_tokens","output_tokens"}}`` with blocks
``thinking`` (``{"type","thinking"}``: the worker sends no signature), ``text``
and ``tool_use`` (``input`` the parsed arguments). Refusals are Anthropic
errors: 400 ``invalid_request_error`` (an unknown model too: the worker's
``parse_request`` refuses it), the ``status`` knob's status with the type for
it. count_tokens answers ``{"input_tokens": n}``, n the prompt tokens
``/v1/messages`` reports for the same body (messages_input.py).

Faults (``MESSAGES_FAULTS``; "the middle" is before text chunk ``chunks //
2``, the final chunk when ``chunks=0``): ``missing_stop`` (no
``message_stop``), ``close_mid`` (cut), ``error_event`` (an ``error`` event,
then the end), ``error_first`` (that error as the first event),
``block_order`` (the first block's delta before its start), ``index_gap``
(block indexes from 1), ``unknown_event`` (an ``agentic_tool_call_progress``
event, the stream goes on), ``after_stop`` (a delta after ``message_stop``),
``too_many_tokens`` (``output_tokens`` = ``max_tokens`` + 1), ``nul_text`` /
``invalid_utf8`` (U+0000 / bytes FF FE in the middle text), ``hang_mid``
(silence from the middle), and the envelope's (``plans.envelope``).
Non-streamed, ``too_many_tokens``, ``nul_text``, ``invalid_utf8`` and the
envelope's apply. ``COUNT_TOKENS_FAULTS``: ``bad_body`` (the JSON cut short),
``bad_count`` (``input_tokens: -1``), ``extra_field`` (a second key), and the
envelope's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.testing.simulator.knobs import SimKnobs
from gateway.testing.simulator.messages_input import MessagesCall
from gateway.testing.simulator.plans import (
    INVALID_UTF8_MARK,
    NUL_TEXT,
    STEP_TYPES,
    Envelope,
    Op,
    Pause,
    Shape,
    SseBody,
    Step,
    chunk_text,
    dump,
    envelope,
    json_reply,
    mid_fault,
    reasoning_text,
    shape,
)

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_MID_FAULTS = frozenset({"close_mid", "error_event", "hang_mid", "unknown_event"})


def event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + dump(data) + b"\n\n"


PING_EVENT = event("ping", {"type": "ping"})
_ERROR_EVENT = event(
    "error", {"type": "error", "error": {"type": "api_error", "message": "simulated engine error"}}
)


def error_body(status: int, message: str) -> dict[str, Any]:
    """The worker's Anthropic error object for ``status``."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def refusal(status: int, message: str, request_id: str) -> Iterator[Step]:
    """A request refused before generation; the worker says 400 where axum says 415/422."""
    if status in (415, 422):
        status = 400
    return json_reply(status, error_body(status, message), request_id)


def _failure(status: int) -> bytes:
    return dump(error_body(status, "simulated failure"))


@dataclass(frozen=True, slots=True)
class Turn:
    """One admitted ``/v1/messages`` request."""

    call: MessagesCall
    knobs: SimKnobs
    number: int
    model: str  # the route's model id, as the pipeline names itself
    prompt_tokens: int
    request_id: str

    @property
    def call_id(self) -> str:
        return f"call-{uuid.UUID(int=self.number)}"


def _shape(turn: Turn) -> Shape:
    return shape(turn.knobs, turn.call.max_tokens)


def _output_tokens(turn: Turn, sh: Shape) -> int:
    if turn.knobs.fault == "too_many_tokens":
        limit = turn.call.max_tokens
        return (limit if limit is not None else sh.tokens) + 1
    return sh.tokens


def _texts(knobs: SimKnobs, count: int) -> list[str]:
    """The text chunks; with ``chunks=0`` a text fault adds the final chunk's."""
    texts = [chunk_text(knobs, i) for i in range(count)]
    if knobs.fault in ("nul_text", "invalid_utf8"):
        mark = NUL_TEXT if knobs.fault == "nul_text" else INVALID_UTF8_MARK
        if count:
            texts[count // 2] = mark
        else:
            texts.append(mark)
    return texts


class _Blocks:
    """The open content block and the next index, as ``AnthropicStreamer`` keeps them."""

    def __init__(self, fault: str | None) -> None:
        self.open: tuple[str, int] | None = None
        self.next = 1 if fault == "index_gap" else 0
        self.swap = fault == "block_order"

    def delta(self, kind: str, text: str) -> Iterator[bytes]:
        if not text:
            return  # the worker skips empty deltas (and opens nothing for them)
        key = "thinking" if kind == "thinking" else "text"
        delta = {"type": f"{key}_delta", key: text}
        if self.open is not None and self.open[0] == kind:
            yield self._delta(self.open[1], delta)
            return
        yield from self.close()
        index = self._take(kind)
        start = self._start(index, {"type": kind, key: ""})
        if self.swap:
            self.swap = False
            yield self._delta(index, delta)
            yield start
        else:
            yield start
            yield self._delta(index, delta)

    def tool_use(self, call_id: str, name: str, arguments: str) -> Iterator[bytes]:
        yield from self.close()
        index = self._take("tool_use")
        yield self._start(index, {"type": "tool_use", "id": call_id, "name": name, "input": {}})
        yield self._delta(index, {"type": "input_json_delta", "partial_json": arguments})
        yield from self.close()

    def close(self) -> Iterator[bytes]:
        if self.open is not None:
            index = self.open[1]
            self.open = None
            yield event("content_block_stop", {"type": "content_block_stop", "index": index})

    def _take(self, kind: str) -> int:
        index = self.next
        self.next += 1
        self.open = (kind, index)
        return index

    @staticmethod
    def _start(index: int, block: dict[str, Any]) -> bytes:
        return event(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": block},
        )

    @staticmethod
    def _delta(index: int, delta: dict[str, Any]) -> bytes:
        return event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )


def _tool_name(turn: Turn) -> str:
    return turn.knobs.tool_name or turn.call.tool_name


def _message_start(turn: Turn, usage: dict[str, int]) -> bytes:
    message: dict[str, Any] = {
        "id": str(turn.number),
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": turn.model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    return event("message_start", {"type": "message_start", "message": message})


def _stream(turn: Turn) -> SseBody:
    k = turn.knobs
    fault = k.fault
    sh = _shape(turn)
    count = sh.count
    if fault == "error_first":
        yield _ERROR_EVENT
        yield Op.END
        return
    if k.first_delay_ms:
        yield Pause(k.first_delay_ms / 1000)
    # The length chunk carries the last text; every other finish gets its own chunk.
    finish_on_last = sh.finish == "length" and count > 0
    usage = {"input_tokens": turn.prompt_tokens, "output_tokens": _output_tokens(turn, sh)}
    # message_start takes the first chunk's usage: none, unless that chunk is the last.
    first_is_last = sh.tokens == 0 or (finish_on_last and sh.tokens == 1)
    yield _message_start(turn, usage if first_is_last else {"input_tokens": 0, "output_tokens": 0})
    blocks = _Blocks(fault)
    for i in range(sh.reasoning):
        if i and k.delay_ms:
            yield Pause(k.delay_ms / 1000)
        yield from blocks.delta("thinking", reasoning_text(i))
    texts = _texts(k, count)
    middle = count // 2
    for i in range(count + 1):
        if i == middle and fault in _MID_FAULTS:
            yield from mid_fault(fault, lambda: _ERROR_EVENT, done=b"")
            if fault != "unknown_event":
                return
        if i == count:
            break
        if (i or sh.reasoning) and k.delay_ms:
            yield Pause(k.delay_ms / 1000)
        yield from blocks.delta("text", texts[i])
    if not finish_on_last:
        if k.delay_ms and sh.tokens:
            yield Pause(k.delay_ms / 1000)
        if len(texts) > count:
            yield from blocks.delta("text", texts[count])
        if sh.finish == "tool_calls":
            yield from blocks.tool_use(turn.call_id, _tool_name(turn), k.tool_arguments)
    yield from blocks.close()
    delta = {"stop_reason": _STOP_REASONS.get(sh.finish, "end_turn"), "stop_sequence": None}
    output = {"output_tokens": usage["output_tokens"]}
    yield event("message_delta", {"type": "message_delta", "delta": delta, "usage": output})
    if fault == "missing_stop":
        yield Op.END
        return
    yield event("message_stop", {"type": "message_stop"})
    if fault == "after_stop":
        late = {"type": "text_delta", "text": "late"}
        body = {"type": "content_block_delta", "index": 0, "delta": late}
        yield event("content_block_delta", body)
    yield Op.END


def _answer(turn: Turn) -> dict[str, Any]:
    sh = _shape(turn)
    content: list[dict[str, Any]] = []
    if sh.reasoning:
        thinking = "".join(reasoning_text(i) for i in range(sh.reasoning))
        content.append({"type": "thinking", "thinking": thinking})
    text = "".join(_texts(turn.knobs, sh.count))
    if text:
        content.append({"type": "text", "text": text})
    if sh.finish == "tool_calls":
        call = {"type": "tool_use", "id": turn.call_id, "name": _tool_name(turn)}
        content.append({**call, "input": orjson.loads(turn.knobs.tool_arguments)})
    return {
        "id": str(turn.number),
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": turn.model,
        "stop_reason": _STOP_REASONS.get(sh.finish, "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": turn.prompt_tokens, "output_tokens": _output_tokens(turn, sh)},
    }


def _total_delay(turn: Turn) -> float:
    k = turn.knobs
    return (k.first_delay_ms + k.delay_ms * max(_shape(turn).tokens - 1, 0)) / 1000


def _steps(env: Envelope) -> Iterator[Step]:
    for step in envelope(env):
        assert isinstance(step, STEP_TYPES)  # nothing here is stored
        yield step


def plan_message(turn: Turn) -> Iterator[Step]:
    def json_body() -> bytes:
        return dump(_answer(turn))

    def sse_body() -> SseBody:
        return _stream(turn)

    return _steps(
        Envelope(
            turn.call.stream,
            turn.knobs,
            turn.request_id,
            _total_delay(turn),
            json_body,
            sse_body,
            idle=PING_EVENT,
            failure=_failure,
        )
    )


def plan_count(knobs: SimKnobs, tokens: int, request_id: str) -> Iterator[Step]:
    """``{"input_tokens": n}``; a token count generates nothing, so it takes no time."""

    def json_body() -> bytes:
        if knobs.fault == "bad_body":
            return b'{"input_tokens":'  # cut short
        if knobs.fault == "bad_count":
            return dump({"input_tokens": -1})
        if knobs.fault == "extra_field":
            return dump({"input_tokens": tokens, "output_tokens": 0})
        return dump({"input_tokens": tokens})

    return _steps(Envelope(False, knobs, request_id, 0.0, json_body, failure=_failure))
