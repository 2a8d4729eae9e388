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
class Spent:
    """What the earlier generations of an agentic run used, summed (agents.py): the
    final chunk's usage aggregates them with its own, as the worker's loop does."""

    generations: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_s: float = 0.0
    completion_s: float = 0.0

    def add(self, prompt: int, completion: int, seconds: tuple[float, float]) -> Spent:
        return Spent(
            self.generations + 1,
            self.prompt_tokens + prompt,
            self.completion_tokens + completion,
            self.prompt_s + seconds[0],
            self.completion_s + seconds[1],
        )


@dataclass(frozen=True, slots=True)
class Ctx:
    """One inference request, reduced to what shapes its response.

    ``session_id`` (an agentic run's) goes on the chunk that carries the
    finish, after ``usage``; ``spent`` is added into the terminal usage.
    """

    chat: bool
    stream: bool
    knobs: SimKnobs
    number: int
    created: int
    model: str
    max_tokens: int | None
    prompt_tokens: int
    request_id: str
    session_id: str | None = None
    spent: Spent = Spent()

    @property
    def id(self) -> str:
        return str(self.number)


def _shape(ctx: Ctx) -> Shape:
    """Hitting max_tokens wins over everything; completions stream no reasoning."""
    return shape(ctx.knobs, ctx.max_tokens, reasoning=ctx.chat)


def seconds(knobs: SimKnobs, prompt: int, completion: int) -> tuple[float, float]:
    """(prompt, completion) seconds of one generation: synthetic but self-consistent,
    derived from the knobs so that identical requests give identical bytes."""
    prompt_s = max(0.001, round(prompt * 0.0005, 3))
    gen_ms = knobs.first_delay_ms + knobs.delay_ms * max(completion - 1, 0) + 2.0 * completion
    return prompt_s, max(0.001, round(gen_ms / 1000, 3))


def _usage(ctx: Ctx, completion: int) -> dict[str, Any]:
    k = ctx.knobs
    spent = ctx.spent
    prompt_s, compl_s = seconds(k, ctx.prompt_tokens, completion)
    prompt = ctx.prompt_tokens + spent.prompt_tokens
    completion += spent.completion_tokens
    prompt_s = round(prompt_s + spent.prompt_s, 3)
    compl_s = round(compl_s + spent.completion_s, 3)
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
        # one over max_tokens a generation (an agentic run's bound: per round and the answer)
        limit = ctx.max_tokens if ctx.max_tokens is not None else tokens
        spent = ctx.spent
        return _usage(ctx, limit * (spent.generations + 1) + 1 - spent.completion_tokens)
    usage = _usage(ctx, tokens)
    if fault == "bad_usage":
        usage["total_tokens"] += 1
    return usage


def _tool_calls(ctx: Ctx) -> list[dict[str, Any]]:
    call_id = f"call-{uuid.UUID(int=ctx.number)}"
    k = ctx.knobs
    function = {"name": k.tool_name or "lookup", "arguments": k.tool_arguments}
    return [{"index": 0, "id": call_id, "type": "function", "function": function}]


def make_chunk(
    ctx: Ctx,
    content: str | None,
    finish: str | None,
    usage: dict[str, Any] | None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any]
    if ctx.chat:
        delta = {"content": content, "role": "assistant", "tool_calls": tool_calls}
        choice = {"finish_reason": finish, "index": 0, "delta": delta, "logprobs": None}
        body = {"id": ctx.id, "choices": [choice], "created": ctx.created, "model": ctx.model}
        body.update(system_fingerprint="local", object="chat.completion.chunk", usage=usage)
    else:
        choice = {"text": content, "index": 0, "logprobs": None, "finish_reason": finish}
        body = {"id": ctx.id, "choices": [choice], "created": ctx.created, "model": ctx.model}
        body.update(system_fingerprint="local", object="text_completion")
        if usage is not None:  # completions never stream usage; only faults put it here
            body["usage"] = usage
    if ctx.knobs.extras and finish == "stop":
        choice["stop_sequence"] = "</sim>"
    if ctx.knobs.fault == "two_choices":
        body["choices"].append({**choice, "index": 1})
    if finish is not None and ctx.session_id is not None:
        body["session_id"] = ctx.session_id
    return body


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


def sse_chunk(chunk: dict[str, Any]) -> bytes:
    return b"data: " + dump(chunk) + b"\n\n"


_MID_FAULTS = frozenset(
    {"close_mid", "error_json", "error_raw", "hang_mid", "named_event"}
)  # fmt: skip
_CHUNK_FAULTS = frozenset(
    {"id_change", "created_change", "model_change", "role_change", "nul_text", "invalid_utf8"}
)


def stream_body(ctx: Ctx) -> Iterator[bytes | Pause | Op]:
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
        thinking = make_chunk(ctx, None, None, None)
        thinking["choices"][0]["delta"]["reasoning_content"] = reasoning_text(i)
        yield sse_chunk(thinking)
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
        chunk = make_chunk(ctx, chunk_text(k, i), finish if last else None, None)
        if last:
            chunk["usage"] = terminal_usage
        elif i == 0 and fault == "usage_early":
            chunk["usage"] = _usage(ctx, sh.tokens)
        if i == middle and fault in _CHUNK_FAULTS:
            _corrupt(ctx, chunk)
        yield sse_chunk(chunk)
    if not finish_on_last:
        if k.delay_ms and sh.tokens:
            yield Pause(k.delay_ms / 1000)
        if finish == "tool_calls" and ctx.chat:
            chunk = make_chunk(ctx, None, finish, terminal_usage, _tool_calls(ctx))
        else:
            chunk = make_chunk(ctx, "", finish, terminal_usage)
        if count == 0 and fault in _CHUNK_FAULTS:
            _corrupt(ctx, chunk)
        yield sse_chunk(chunk)
    if fault != "missing_done":
        yield DONE_EVENT
    if fault == "after_done":
        yield sse_chunk(make_chunk(ctx, token_text(count, k.unicode), None, None))
    yield Op.END


def json_dict(ctx: Ctx) -> dict[str, Any]:
    """The non-streamed answer (before the ``invalid_utf8`` fault's bytes)."""
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
    return body


def json_bytes(ctx: Ctx, body: dict[str, Any]) -> bytes:
    data = orjson.dumps(body)
    if ctx.knobs.fault == "invalid_utf8":
        data = data.replace(b"sim-token-0", b"sim-\xff\xfe-bad", 1)
    return data


def total_delay(ctx: Ctx) -> float:
    """The whole generation time of one answer (a non-streamed reply waits for it)."""
    k = ctx.knobs
    return (k.first_delay_ms + k.delay_ms * max(_shape(ctx).tokens - 1, 0)) / 1000


def plan_inference(ctx: Ctx) -> Iterator[Step]:
    def json_body() -> bytes:
        return json_bytes(ctx, json_dict(ctx))

    def sse_body() -> SseBody:
        return stream_body(ctx)

    env = Envelope(ctx.stream, ctx.knobs, ctx.request_id, total_delay(ctx), json_body, sse_body)
    for step in envelope(env):
        assert isinstance(step, STEP_TYPES)  # chat and completions store nothing
        yield step
