"""``POST /v1/responses`` replies, as ``OpenResponsesStreamer`` and
``chat_response_to_response_resource`` make them (findings §5b-§5d). Pure.

Streamed: each event is ``event: <name>\\ndata: <json>\\n\\n``, the JSON
``{"type": <name>, "sequence_number": n, ...}`` (serde's tag first, then the
fields in declaration order), numbers from 0 up by one. A plain answer::

    response.created            response{status: queued, output: []}
    response.in_progress        response{status: in_progress, output: []}   } with the
    response.output_item.added  item{message msg_<uuid>, in_progress}       } first chunk
    response.content_part.added part{output_text, ""}                       }
    response.output_text.delta  one per chunk; a "" one for the final chunk unless
                                the finish is ``length`` (that chunk carries the last text)
    response.content_part.done  part{output_text, <all text>}
    response.output_item.done   item{message, completed, content: [part]}
    response.completed          response{completed_at, status, output, output_text, usage}
    data: [DONE]

A tool call (``tool_call`` knob, not ``tool_choice: "none"``) arrives whole on
the final chunk: ``response.output_item.added`` (``function_call`` item
``fc_<uuid>``, ``call_id`` ``call-<uuid>``, status completed),
``response.function_call_arguments.delta`` (all arguments),
``response.function_call_arguments.done``, ``response.output_item.done``, all
at ``output_index`` 1 (message index + 1, even with no message), then the
message's done events if it was opened, then the terminal event. In
``response.output`` the call comes before the message; the message item is
there only if its text is not empty (streamed) or its content exists
(non-streamed: also ``""``), as in the real server.

``terminal`` knob: ``completed`` (the only one the real server sends, also for
``length``); ``incomplete`` (``response.incomplete``, status and item status
``incomplete``, ``incomplete_details: {"reason": "max_output_tokens"}``, no
``completed_at``); ``failed`` (the engine's ModelError: after the text deltas
``response.failed`` with the current output, message ``in_progress``, and
``error: {"type": "model_error", "message": ...}``, no done events, no usage).
Non-streamed ``failed`` is 500 ``{"message", "partial_response"}``.

Faults (``RESPONSES_FAULTS``; "the middle" is the delta of chunk
``chunks // 2``, the final delta when ``chunks=0``): ``missing_done`` (no
``[DONE]``), ``close_mid`` (cut at the middle), ``error_json`` (``event:
error`` ``{"type":"error","sequence_number":n,"error":{"type":"internal_error",
"message":...}}`` at the middle, then ``[DONE]``), ``error_first`` (that error
right after ``response.created``), ``id_change`` (the terminal event's response
id differs), ``named_event`` (an ``agentic_tool_call_progress`` event at the
middle, stream goes on), ``after_done`` (a delta after ``[DONE]``),
``bad_usage`` (``total_tokens`` one too many), ``too_many_tokens``
(``output_tokens`` = ``max_output_tokens`` + 1), ``nul_text`` (U+0000 in the
middle delta), ``invalid_utf8`` (FF FE in it), ``seq_gap`` (the middle delta
skips a sequence number), ``hang_mid`` (silence from the middle), and the
shared envelope's (``plans.envelope``). Non-streamed, the body faults
(``bad_usage``, ``too_many_tokens``, ``nul_text``, ``invalid_utf8``) and the
envelope's apply; the stream-only ones change nothing.

Ids: ``resp_``/``msg_``/``fc_``/``call-`` + :func:`plans.sim_uuid` of the
simulator's ``id_seed``, the request's number and a fixed kind, so they look
like uuid4s, differ between simulators, and repeat for a repeated seed.
``created_at`` is the simulator's start second (like chat's ``created``);
``completed_at`` adds the knobs' whole delay, in whole seconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gateway.testing.simulator.knobs import SimKnobs
from gateway.testing.simulator.plans import (
    DONE_EVENT,
    INVALID_UTF8_MARK,
    NUL_TEXT,
    Envelope,
    Op,
    Pause,
    PlanStep,
    SseBody,
    StoreCommit,
    chunk_text,
    dump,
    envelope,
    mid_fault,
    sim_uuid,
)
from gateway.testing.simulator.responses_input import ResponsesCall
from gateway.testing.simulator.store import BackgroundTask

_ERROR = {"type": "internal_error", "message": "simulated engine error"}
_MODEL_ERROR = {"type": "model_error", "message": "simulated model error"}
_MID_FAULTS = frozenset({"close_mid", "error_json", "hang_mid", "named_event"})
_ID_CHANGED = 0x3FF


@dataclass(frozen=True, slots=True)
class Run:
    """One admitted Responses request."""

    call: ResponsesCall
    knobs: SimKnobs
    number: int
    seed: int
    created: int
    prompt_tokens: int
    #: the conversation sent: stored history, then this request's texts
    history: tuple[str, ...]
    request_id: str

    def uid(self, kind: int) -> str:
        return sim_uuid(self.seed, self.number, kind)

    @property
    def response_id(self) -> str:
        return f"resp_{self.uid(0)}"


@dataclass(frozen=True, slots=True)
class _Shape:
    count: int  # text chunks
    finish: str
    call: bool  # ends in a function call


def _shape(run: Run) -> _Shape:
    k = run.knobs
    finish = "tool_calls" if k.tool_call else k.finish
    if finish == "tool_calls" and run.call.tools_off:
        finish = "stop"
    limit = run.call.max_output_tokens
    if limit is not None and k.chunks >= limit:
        return _Shape(limit, "length", False)
    return _Shape(k.chunks, finish, finish == "tool_calls")


def total_delay(run: Run) -> float:
    k = run.knobs
    return (k.first_delay_ms + k.delay_ms * max(_shape(run).count - 1, 0)) / 1000


def _usage(run: Run, count: int) -> dict[str, int]:
    fault = run.knobs.fault
    output = count
    if fault == "too_many_tokens":
        limit = run.call.max_output_tokens
        output = (limit if limit is not None else count) + 1
    usage = {
        "input_tokens": run.prompt_tokens,
        "output_tokens": output,
        "total_tokens": run.prompt_tokens + output,
    }
    if fault == "bad_usage":
        usage["total_tokens"] += 1
    return usage


def _resource(run: Run, status: str, output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A ResponseResource: fixed keys, then the optional ones given, then the tail."""
    body: dict[str, Any] = {"id": extra.pop("id", run.response_id), "object": "response"}
    body["created_at"] = run.created
    if "completed_at" in extra:
        body["completed_at"] = extra.pop("completed_at")
    body.update(model=run.call.model, status=status, output=output)
    for key in ("output_text", "usage", "error", "incomplete_details"):
        if extra.get(key) is not None:
            body[key] = extra[key]
    body.update(run.call.tail)
    return body


def _message(run: Run, content: list[dict[str, Any]], status: str) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "message", "id": f"msg_{run.uid(1)}", "role": "assistant"}
    item.update(content=content, status=status)
    return item


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text}


def _function_call(run: Run) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{run.uid(2)}",
        "call_id": f"call-{run.uid(3)}",
        "name": run.knobs.tool_name or run.call.tool_name,
        "arguments": run.knobs.tool_arguments,
        "status": "completed",
    }


def _texts(run: Run, count: int) -> list[str]:
    """The chunks' texts; with ``chunks=0`` one more: the final chunk's (usually "")."""
    k = run.knobs
    texts = [chunk_text(k, i) for i in range(count)]
    if k.fault in ("nul_text", "invalid_utf8"):
        mark = NUL_TEXT if k.fault == "nul_text" else INVALID_UTF8_MARK
        if count:
            texts[count // 2] = mark
        else:
            texts.append(mark)
    return texts


def _terminal_status(run: Run) -> tuple[str, str]:
    """(event name, status) of the terminal event that is not a failure."""
    if run.knobs.terminal == "incomplete":
        return "response.incomplete", "incomplete"
    return "response.completed", "completed"


def _stream(run: Run) -> SseBody:
    k = run.knobs
    fault = k.fault
    shape = _shape(run)
    count = shape.count
    seq = itertools.count()

    def event(name: str, **fields: Any) -> bytes:
        data = dump({"type": name, "sequence_number": next(seq), **fields})
        return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"

    yield event("response.created", response=_resource(run, "queued", []))
    if fault == "error_first":
        yield event("error", error=_ERROR)
        yield DONE_EVENT
        yield Op.END
        return
    if k.first_delay_ms:
        yield Pause(k.first_delay_ms / 1000)
    texts = _texts(run, count)
    final_text = texts.pop() if len(texts) > count else ""
    started = opened = False

    def chunk_start(message: bool) -> Iterator[bytes]:
        nonlocal started, opened
        if not started:
            started = True
            yield event("response.in_progress", response=_resource(run, "in_progress", []))
        if message and not opened:
            opened = True
            item = _message(run, [], "in_progress")
            yield event("response.output_item.added", output_index=0, item=item)
            part = _text_part("")
            yield event("response.content_part.added", output_index=0, content_index=0, part=part)

    def delta(text: str, i: int) -> Iterator[bytes]:
        yield from chunk_start(True)
        if fault == "seq_gap" and i == middle:
            next(seq)
        yield event("response.output_text.delta", output_index=0, content_index=0, delta=text)

    middle = count // 2
    final_has_text = shape.finish == "length" and count > 0
    for i in range(count + 1):
        if i == middle and fault in _MID_FAULTS:
            yield from mid_fault(fault, lambda: event("error", error=_ERROR))
            if fault != "named_event":
                return
        if i == count:
            break
        if i and k.delay_ms:
            yield Pause(k.delay_ms / 1000)
        yield from delta(texts[i], i)
    text = "".join(texts)
    if k.delay_ms and count and not final_has_text:
        yield Pause(k.delay_ms / 1000)
    output: list[dict[str, Any]] = []
    if k.terminal == "failed":
        if text:
            output.append(_message(run, [_text_part(text)], "in_progress"))
        failed = _resource(run, "failed", output, output_text=text or None, error=_MODEL_ERROR)
        yield event("response.failed", response=failed)
    else:
        name, status = _terminal_status(run)
        if not final_has_text:
            yield from chunk_start(not shape.call)
            if shape.call:
                call = _function_call(run)
                output.append(call)
                call_id, arguments = call["call_id"], call["arguments"]
                yield event("response.output_item.added", output_index=1, item=call)
                yield event(
                    "response.function_call_arguments.delta",
                    output_index=1,
                    call_id=call_id,
                    delta=arguments,
                )
                yield event(
                    "response.function_call_arguments.done",
                    output_index=1,
                    call_id=call_id,
                    arguments=arguments,
                )
                yield event("response.output_item.done", output_index=1, item=call)
            else:
                yield from delta(final_text, count)
                text += final_text
        item_status = "completed" if status == "completed" else "incomplete"
        if opened:
            part = _text_part(text)
            yield event("response.content_part.done", output_index=0, content_index=0, part=part)
            item = _message(run, [part], item_status)
            yield event("response.output_item.done", output_index=0, item=item)
        if text:
            output.append(_message(run, [_text_part(text)], item_status))
        extra: dict[str, Any] = {"output_text": text or None, "usage": _usage(run, count)}
        if status == "completed":
            extra["completed_at"] = run.created + int(total_delay(run))
        else:
            extra["incomplete_details"] = {"reason": "max_output_tokens"}
        if fault == "id_change":
            extra["id"] = f"resp_{run.uid(_ID_CHANGED)}"
        yield event(name, response=_resource(run, status, output, **extra))
    if fault == "missing_done":
        yield Op.END
        return
    if run.call.store:
        history = (*run.history, text) if text else run.history
        yield StoreCommit(run.response_id, history, None)
    yield DONE_EVENT
    if fault == "after_done":
        yield event("response.output_text.delta", output_index=0, content_index=0, delta="late")
    yield Op.END


def _non_stream(run: Run) -> tuple[int, dict[str, Any], StoreCommit | None]:
    """(HTTP status, body, what to store) of a non-streamed run."""
    shape = _shape(run)
    text = "".join(_texts(run, shape.count)).lstrip()  # the non-stream trim_start
    content = None if shape.call and not text else text
    output: list[dict[str, Any]] = [_function_call(run)] if shape.call else []
    terminal = run.knobs.terminal
    item_status = "incomplete" if terminal == "incomplete" else "completed"
    if content is not None:
        output.append(_message(run, [_text_part(content)], item_status))
    extra: dict[str, Any] = {"output_text": content, "usage": _usage(run, shape.count)}
    if terminal != "incomplete":
        extra["completed_at"] = run.created + int(total_delay(run))
    store = run.call.store
    if terminal == "failed":
        body = _resource(run, "failed", output, error=_MODEL_ERROR, **extra)
        commit = StoreCommit(run.response_id, None, body) if store else None
        return 500, {"message": _MODEL_ERROR["message"], "partial_response": body}, commit
    status = "incomplete" if terminal == "incomplete" else "completed"
    if terminal == "incomplete":
        extra["incomplete_details"] = {"reason": "max_output_tokens"}
    body = _resource(run, status, output, **extra)
    if not store:
        return 200, body, None
    history = (*run.history, content) if content is not None else run.history
    return 200, body, StoreCommit(run.response_id, history, body)


def plan_response(run: Run) -> Iterator[PlanStep]:
    status, body, commit = _non_stream(run)

    def json_body() -> bytes:
        return dump(body)

    def sse_body() -> SseBody:
        return _stream(run)

    k = run.knobs
    return envelope(
        Envelope(
            run.call.stream,
            k,
            run.request_id,
            total_delay(run),
            json_body,
            sse_body,
            json_status=status,
            commit=commit,
        )
    )


def background(run: Run, now: float) -> tuple[dict[str, Any], BackgroundTask]:
    """The immediate ``queued`` answer and the task that finishes the run later."""
    queued = {
        "id": run.response_id,
        "object": "response",
        "created_at": run.created,
        "model": run.call.model,
        "status": "queued",
        "output": [],
        "metadata": run.call.metadata,
    }
    status, body, _ = _non_stream(run)
    if status != 200:
        keys = ("id", "object", "created_at", "model")
        final = {**{key: queued[key] for key in keys}, "status": "failed", "output": []}
        final["error"] = _MODEL_ERROR
    else:
        final = body
    text = body.get("output_text")
    history = (*run.history, text) if isinstance(text, str) else run.history
    task = BackgroundTask(queued, final, now + total_delay(run), run.call.store, history)
    return queued, task
