"""Response plans: pure generators of steps (head, bytes, pause, end, faults)
built from one request and its knobs. No I/O."""

from __future__ import annotations

import enum
import gzip
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.testing.simulator.knobs import SIMULATOR_HEADER, SimKnobs

_INVALID_UTF8_MARK = "\x1asim-invalid-utf8\x1a"

_INVALID_UTF8_JSON = orjson.dumps(_INVALID_UTF8_MARK)[1:-1]

_DONE_EVENT = b"data: [DONE]\n\n"

_ERROR_JSON = (
    b'data: {"error":{"message":"simulated engine error","type":"server_error",'
    b'"param":null,"code":null}}\n\n'
)

_ERROR_RAW = b"data: simulated engine error\n\n"

_NAMED_EVENT = (
    b"event: agentic_tool_call_progress\n"
    b'data: {"type":"agentic_tool_call_progress","round":1,"tool_name":"sim_tool",'
    b'"phase":"calling","data":{"tool_type":"custom"}}\n\n'
)

UNICODE_WORDS = ("héllo", "wörld", "✓", "日本", "🙂")

# tower-http CorsLayer with `Any` origin, as the real server answers every request.
_COMMON_HEADERS = (
    ("access-control-allow-origin", "*"),
    ("vary", "origin, access-control-request-method, access-control-request-headers"),
    ("access-control-expose-headers", "x-request-id"),
    SIMULATOR_HEADER,
)


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    headers: list[tuple[str, str]]
    length: int | None  # None: transfer-encoding chunked


@dataclass(frozen=True, slots=True)
class Pause:
    seconds: float


class Op(enum.Enum):
    END = "end"
    ABORT = "abort"
    HANG = "hang"
    ENDLESS = "endless"


Step = Head | Pause | Op | bytes


@dataclass(frozen=True, slots=True)
class Ctx:
    """One inference request, reduced to what shapes its response."""

    chat: bool
    stream: bool
    knobs: SimKnobs
    number: int
    created: int
    model: str
    max_tokens: int | None
    prompt_tokens: int
    request_id: str

    @property
    def id(self) -> str:
        return str(self.number)


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


def json_reply(status: int, obj: Any, request_id: str) -> Iterator[Step]:
    return simple_reply(status, orjson.dumps(obj), request_id, "application/json")


def text_reply(status: int, text: str, request_id: str) -> Iterator[Step]:
    return simple_reply(status, text.encode(), request_id, "text/plain; charset=utf-8")


def _token(i: int, unicode: bool, pad: int = 0) -> str:
    word = UNICODE_WORDS[i % len(UNICODE_WORDS)] if unicode else "token"
    text = f"sim-{word}-{i} "
    return text.ljust(pad, ".") if pad else text


def _shape(ctx: Ctx) -> tuple[int, str]:
    """(content chunks, finish reason). Hitting max_tokens wins over everything."""
    count = ctx.knobs.chunks
    finish = "tool_calls" if ctx.knobs.tool_call else ctx.knobs.finish
    if ctx.max_tokens is not None and count >= ctx.max_tokens:
        return ctx.max_tokens, "length"
    return count, finish


def _usage(ctx: Ctx, completion: int) -> dict[str, Any]:
    # Synthetic but self-consistent timings, derived from the knobs so that
    # identical requests give identical bytes.
    k = ctx.knobs
    prompt = ctx.prompt_tokens
    prompt_s = max(0.001, round(prompt * 0.0005, 3))
    gen_ms = k.first_delay_ms + k.delay_ms * max(completion - 1, 0) + 2.0 * completion
    compl_s = max(0.001, round(gen_ms / 1000, 3))
    total_s = round(prompt_s + compl_s, 3)
    usage: dict[str, Any] = {
        "completion_tokens": completion,
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "avg_tok_per_sec": round((prompt + completion) / total_s, 1),
        "avg_prompt_tok_per_sec": round(prompt / prompt_s, 1),
        "avg_compl_tok_per_sec": round(completion / compl_s, 1),
        "total_time_sec": total_s,
        "total_prompt_time_sec": prompt_s,
        "total_completion_time_sec": compl_s,
    }
    if k.extras:
        usage["prompt_tokens_details"] = {"cached_tokens": 0}
    return usage


def _terminal_usage(ctx: Ctx, count: int) -> dict[str, Any]:
    fault = ctx.knobs.fault
    if fault == "too_many_tokens":
        return _usage(ctx, (ctx.max_tokens if ctx.max_tokens is not None else count) + 1)
    usage = _usage(ctx, count)
    if fault == "bad_usage":
        usage["total_tokens"] += 1
    return usage


def _tool_calls(ctx: Ctx) -> list[dict[str, Any]]:
    call_id = f"call-{uuid.UUID(int=ctx.number)}"
    function = {"name": "lookup", "arguments": '{"q":1}'}
    return [{"index": 0, "id": call_id, "type": "function", "function": function}]


def _chunk(
    ctx: Ctx,
    content: str | None,
    finish: str | None,
    usage: dict[str, Any] | None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    chunk: dict[str, Any]
    if ctx.chat:
        delta = {"content": content, "role": "assistant", "tool_calls": tool_calls}
        choice = {"finish_reason": finish, "index": 0, "delta": delta, "logprobs": None}
        chunk = {"id": ctx.id, "choices": [choice], "created": ctx.created, "model": ctx.model}
        chunk.update(system_fingerprint="local", object="chat.completion.chunk", usage=usage)
    else:
        choice = {"text": content, "index": 0, "logprobs": None, "finish_reason": finish}
        chunk = {"id": ctx.id, "choices": [choice], "created": ctx.created, "model": ctx.model}
        chunk.update(system_fingerprint="local", object="text_completion")
        if usage is not None:  # completions never stream usage; only faults put it here
            chunk["usage"] = usage
    if ctx.knobs.extras and finish == "stop":
        choice["stop_sequence"] = "</sim>"
    if ctx.knobs.fault == "two_choices":
        chunk["choices"].append({**choice, "index": 1})
    return chunk


def _corrupt(ctx: Ctx, chunk: dict[str, Any]) -> None:
    """Apply a one-chunk fault to the chunk in the middle of the stream."""
    fault = ctx.knobs.fault
    choice = chunk["choices"][0]
    text_key = "text" if "text" in choice else None
    if fault == "id_change":
        chunk["id"] = str(ctx.number + 1_000_000)
    elif fault == "created_change":
        chunk["created"] = ctx.created + 1
    elif fault == "model_change":
        chunk["model"] = "sim-other-model"
    elif fault == "role_change" and ctx.chat:
        choice["delta"]["role"] = "user"
    elif fault in ("nul_text", "invalid_utf8"):
        value = "sim-\x00-nul " if fault == "nul_text" else _INVALID_UTF8_MARK
        if text_key:
            choice[text_key] = value
        else:
            choice["delta"]["content"] = value


def _event(chunk: dict[str, Any]) -> bytes:
    data = orjson.dumps(chunk)
    if _INVALID_UTF8_JSON in data:
        data = data.replace(_INVALID_UTF8_JSON, b"sim-\xff\xfe-bad ")
    return b"data: " + data + b"\n\n"


_MID_FAULTS = frozenset(
    {"close_mid", "error_json", "error_raw", "hang_mid", "named_event"}
)  # fmt: skip
_CHUNK_FAULTS = frozenset(
    {"id_change", "created_change", "model_change", "role_change", "nul_text", "invalid_utf8"}
)


def _stream_body(ctx: Ctx) -> Iterator[bytes | Pause | Op]:
    """The SSE body of a streamed chat/completion, faults included, ending in an Op."""
    k = ctx.knobs
    fault = k.fault
    count, finish = _shape(ctx)
    if fault == "bad_finish":
        finish = "content_filter"
    if fault == "error_first":
        yield _ERROR_JSON
        yield _DONE_EVENT
        yield Op.END
        return
    if k.first_delay_ms:
        yield Pause(k.first_delay_ms / 1000)
    middle = count // 2
    # The length chunk carries the last text; every other finish gets its own chunk.
    finish_on_last = finish == "length" and count > 0
    # Completion chunks never carry usage; the usage faults add one to corrupt.
    with_usage = ctx.chat or fault in ("bad_usage", "too_many_tokens")
    terminal_usage = _terminal_usage(ctx, count) if with_usage else None
    for i in range(count + 1):
        if i == middle and fault in _MID_FAULTS:
            if fault == "close_mid":
                yield Op.ABORT
                return
            if fault == "hang_mid":
                yield Op.HANG
                return
            if fault == "named_event":
                yield _NAMED_EVENT
            else:
                yield _ERROR_JSON if fault == "error_json" else _ERROR_RAW
                yield _DONE_EVENT
                yield Op.END
                return
        if i == count:
            break
        if i and k.delay_ms:
            yield Pause(k.delay_ms / 1000)
        last = finish_on_last and i == count - 1
        chunk = _chunk(ctx, _token(i, k.unicode, k.pad), finish if last else None, None)
        if last:
            chunk["usage"] = terminal_usage
        elif i == 0 and fault == "usage_early":
            chunk["usage"] = _usage(ctx, count)
        if i == middle and fault in _CHUNK_FAULTS:
            _corrupt(ctx, chunk)
        yield _event(chunk)
    if not finish_on_last:
        if k.delay_ms and count:
            yield Pause(k.delay_ms / 1000)
        if finish == "tool_calls" and ctx.chat:
            chunk = _chunk(ctx, None, finish, terminal_usage, _tool_calls(ctx))
        else:
            chunk = _chunk(ctx, "", finish, terminal_usage)
        if count == 0 and fault in _CHUNK_FAULTS:
            _corrupt(ctx, chunk)
        yield _event(chunk)
    if fault != "missing_done":
        yield _DONE_EVENT
    if fault == "after_done":
        yield _event(_chunk(ctx, _token(count, k.unicode), None, None))
    yield Op.END


def _json_body(ctx: Ctx) -> bytes:
    k = ctx.knobs
    count, finish = _shape(ctx)
    if k.fault == "bad_finish":
        finish = "content_filter"
    text = "".join(_token(i, k.unicode, k.pad) for i in range(count))
    if k.fault == "nul_text":
        text = "sim-\x00-nul "
    choice: dict[str, Any] = {"finish_reason": finish, "index": 0}
    if ctx.chat:
        tools = _tool_calls(ctx) if finish == "tool_calls" else None
        content = None if tools and not text else text
        choice["message"] = {"content": content, "role": "assistant", "tool_calls": tools}
        choice["logprobs"] = None
    else:
        choice.update(text=text, logprobs=None)
    if k.extras and finish == "stop":
        choice["stop_sequence"] = "</sim>"
    choices = [choice, {**choice, "index": 1}] if k.fault == "two_choices" else [choice]
    body: dict[str, Any] = {"id": ctx.id, "choices": choices, "created": ctx.created}
    body.update(
        model=ctx.model,
        system_fingerprint="local",
        object="chat.completion" if ctx.chat else "text_completion",
        usage=_terminal_usage(ctx, count),
    )
    data = orjson.dumps(body)
    if k.fault == "invalid_utf8":
        data = data.replace(b"sim-token-0", b"sim-\xff\xfe-bad", 1)
    return data


def _total_delay(ctx: Ctx) -> float:
    count, _ = _shape(ctx)
    k = ctx.knobs
    return (k.first_delay_ms + k.delay_ms * max(count - 1, 0)) / 1000


def plan_inference(ctx: Ctx) -> Iterator[Step]:
    k = ctx.knobs
    fault = k.fault
    base = [*_id_headers(ctx.request_id, fault), *_COMMON_HEADERS]
    if fault == "huge_headers":
        base.append(("x-sim-padding", "p" * 200 * 1024))
    if k.status is not None:
        yield from simple_reply(
            k.status, b'{"message":"simulated failure"}', ctx.request_id, "application/json"
        )
        return
    if fault == "hang_headers":
        yield Op.HANG
        return
    if fault == "redirect":
        yield Head(307, [("location", "/sim/redirected"), *base], 0)
        yield Op.END
        return
    if fault == "close_mid" and not ctx.stream:
        yield Pause(_total_delay(ctx) / 2)
        yield Op.ABORT
        return
    if not ctx.stream or fault == "json_body":
        if not ctx.stream:
            yield Pause(_total_delay(ctx))
        if fault == "hang":
            yield Op.HANG
            return
        body = _json_body(ctx)
        headers = [("content-type", "application/json"), *base]
        if fault == "gzip":
            body = gzip.compress(body, mtime=0)
            headers.append(("content-encoding", "gzip"))
        elif fault == "wrong_content_type":
            headers[0] = ("content-type", "text/plain; charset=utf-8")
        yield Head(200, headers, len(body))
        yield body
        yield Op.END
        return
    content_type = "text/plain; charset=utf-8" if fault == "wrong_content_type" else None
    headers = [("content-type", content_type or "text/event-stream")]
    headers += [("cache-control", "no-cache"), *base]
    if fault == "gzip":
        # Compressed as a whole: pauses are dropped, the bytes are what matter here.
        raw = b"".join(s for s in _stream_body(ctx) if isinstance(s, bytes))
        yield Head(200, [*headers, ("content-encoding", "gzip")], None)
        yield gzip.compress(raw, mtime=0)
        yield Op.END
        return
    yield Head(200, headers, None)
    if fault == "hang":
        yield Op.HANG
    elif fault == "endless_line":
        yield b"data: "
        yield Op.ENDLESS
    else:
        yield from _stream_body(ctx)
