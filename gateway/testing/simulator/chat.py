"""The chat/completions dialect: ``/v1/chat/completions`` and
``/v1/completions`` chunks and JSON bodies, byte for byte as the reference
writes them (§3.2, §3.5, §4). Pure.

Faults (``FAULTS``), all in the middle chunk unless said otherwise:
``missing_done`` (no ``[DONE]``), ``close_mid`` (connection cut),
``error_json`` / ``error_raw`` (the HEAD / v0.9.2 in-band error, then
``[DONE]``), ``error_first`` (the error before any chunk), ``id_change`` /
``created_change`` / ``model_change`` / ``role_change`` (one chunk differs),
``two_choices``, ``nul_text`` (U+0000 in the text), ``invalid_utf8`` (bytes
FF FE in the text), ``usage_early`` (usage on the first chunk), ``bad_usage``
(total != prompt + completion), ``too_many_tokens`` (completion tokens over
``max_tokens``), ``bad_finish`` (``content_filter``), ``named_event`` (an
agentic named event), ``after_done`` (a chunk after ``[DONE]``), ``hang_mid``
(silence after half), and the envelope's (see :func:`plans.envelope`).

The ``reasoning`` knob puts that many chunks carrying ``reasoning_content``
(``content: null``) before the text chunks, as a reasoning parser streams
them (they count as completion tokens; the non-streamed message carries
them as ``reasoning_content``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.testing.simulator.knobs import SimKnobs
from gateway.testing.simulator.plans import (
    DONE_EVENT,
    INVALID_UTF8_MARK,
    NUL_TEXT,
    Envelope,
    Op,
    Pause,
    Shape,
    SseBody,
    Step,
    StoreCommit,
    chunk_text,
    dump,
    envelope,
    mid_fault,
    reasoning_text,
    shape,
    token_text,
)

_ERROR_JSON = (
    b'data: {"error":{"message":"simulated engine error","type":"server_error",'
    b'"param":null,"code":null}}\n\n'
)

_ERROR_RAW = b"data: simulated engine error\n\n"


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


def _shape(ctx: Ctx) -> Shape:
    """Hitting max_tokens wins over everything; completions stream no reasoning."""
    return shape(ctx.knobs, ctx.max_tokens, reasoning=ctx.chat)


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


def _terminal_usage(ctx: Ctx, tokens: int) -> dict[str, Any]:
    fault = ctx.knobs.fault
    if fault == "too_many_tokens":
        return _usage(ctx, (ctx.max_tokens if ctx.max_tokens is not None else tokens) + 1)
    usage = _usage(ctx, tokens)
    if fault == "bad_usage":
        usage["total_tokens"] += 1
    return usage


def _tool_calls(ctx: Ctx) -> list[dict[str, Any]]:
    call_id = f"call-{uuid.UUID(int=ctx.number)}"
    k = ctx.knobs
    function = {"name": k.tool_name or "lookup", "arguments": k.tool_arguments}
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
        value = NUL_TEXT if fault == "nul_text" else INVALID_UTF8_MARK
        if text_key:
            choice[text_key] = value
        else:
            choice["delta"]["content"] = value


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + dump(chunk) + b"\n\n"


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
    sh = _shape(ctx)
    count, finish = sh.count, sh.finish
    if fault == "bad_finish":
        finish = "content_filter"
    if fault == "error_first":
        yield _ERROR_JSON
        yield DONE_EVENT
        yield Op.END
        return
    if k.first_delay_ms:
        yield Pause(k.first_delay_ms / 1000)
    middle = count // 2
    # The length chunk carries the last text; every other finish gets its own chunk.
    finish_on_last = finish == "length" and count > 0
    # Completion chunks never carry usage; the usage faults add one to corrupt.
    with_usage = ctx.chat or fault in ("bad_usage", "too_many_tokens")
    terminal_usage = _terminal_usage(ctx, sh.tokens) if with_usage else None
    for i in range(sh.reasoning):
        if i and k.delay_ms:
            yield Pause(k.delay_ms / 1000)
        thinking = _chunk(ctx, None, None, None)
        thinking["choices"][0]["delta"]["reasoning_content"] = reasoning_text(i)
        yield _event(thinking)
    for i in range(count + 1):
        if i == middle and fault in _MID_FAULTS:
            yield from mid_fault(
                fault, lambda: _ERROR_JSON if fault == "error_json" else _ERROR_RAW
            )
            if fault != "named_event":
                return
        if i == count:
            break
        if (i or sh.reasoning) and k.delay_ms:
            yield Pause(k.delay_ms / 1000)
        last = finish_on_last and i == count - 1
        chunk = _chunk(ctx, chunk_text(k, i), finish if last else None, None)
        if last:
            chunk["usage"] = terminal_usage
        elif i == 0 and fault == "usage_early":
            chunk["usage"] = _usage(ctx, sh.tokens)
        if i == middle and fault in _CHUNK_FAULTS:
            _corrupt(ctx, chunk)
        yield _event(chunk)
    if not finish_on_last:
        if k.delay_ms and sh.tokens:
            yield Pause(k.delay_ms / 1000)
        if finish == "tool_calls" and ctx.chat:
            chunk = _chunk(ctx, None, finish, terminal_usage, _tool_calls(ctx))
        else:
            chunk = _chunk(ctx, "", finish, terminal_usage)
        if count == 0 and fault in _CHUNK_FAULTS:
            _corrupt(ctx, chunk)
        yield _event(chunk)
    if fault != "missing_done":
        yield DONE_EVENT
    if fault == "after_done":
        yield _event(_chunk(ctx, token_text(count, k.unicode), None, None))
    yield Op.END


def _json_body(ctx: Ctx) -> bytes:
    k = ctx.knobs
    sh = _shape(ctx)
    count, finish = sh.count, sh.finish
    if k.fault == "bad_finish":
        finish = "content_filter"
    text = "".join(chunk_text(k, i) for i in range(count))
    if k.fault == "nul_text":
        text = NUL_TEXT
    choice: dict[str, Any] = {"finish_reason": finish, "index": 0}
    if ctx.chat:
        tools = _tool_calls(ctx) if finish == "tool_calls" else None
        content = None if tools and not text else text
        choice["message"] = {"content": content, "role": "assistant", "tool_calls": tools}
        if sh.reasoning:
            thinking = "".join(reasoning_text(i) for i in range(sh.reasoning))
            choice["message"]["reasoning_content"] = thinking
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
        usage=_terminal_usage(ctx, sh.tokens),
    )
    data = orjson.dumps(body)
    if k.fault == "invalid_utf8":
        data = data.replace(b"sim-token-0", b"sim-\xff\xfe-bad", 1)
    return data


def _total_delay(ctx: Ctx) -> float:
    k = ctx.knobs
    return (k.first_delay_ms + k.delay_ms * max(_shape(ctx).tokens - 1, 0)) / 1000


def plan_inference(ctx: Ctx) -> Iterator[Step]:
    def json_body() -> bytes:
        return _json_body(ctx)

    def sse_body() -> SseBody:
        return _stream_body(ctx)

    env = Envelope(ctx.stream, ctx.knobs, ctx.request_id, _total_delay(ctx), json_body, sse_body)
    for step in envelope(env):
        assert not isinstance(step, StoreCommit)  # chat and completions store nothing
        yield step
