"""mistral.rs protocol SIMULATOR: test and demo equipment, never inference.

Everything it "generates" is labelled text (``"sim-token-3 "``); every response
carries ``x-simulator: mistralrs-protocol-simulator``. It speaks the wire
protocol of ``mistralrs serve`` as written down in the project's reference
(``mistralrs-http.md``): routes, `/v1/models`, SSE chunk bytes (key order,
nulls, usage on the terminal chunk only, ``[DONE]``), keep-alive comments,
error bodies and ``x-request-id``.

Theory of operation
-------------------
* One ``asyncio.Protocol`` per TCP connection, parsed by ``httptools``. Reading
  never pauses while a response is being written, so a client's FIN or RST
  reaches ``connection_lost`` at once; that cancels the response task of a
  streamed request (mistral.rs stops a stream when its receiver goes) but not
  of a non-streamed one (mistral.rs keeps generating those).
* A response is a *plan*: a pure generator of steps (head, data, pause, end,
  abort, hang, endless) built from the request and its knobs. One executor
  plays plans: chunked framing, keep-alive comments during pauses, ``split``,
  flow control. Faults are only different plans.
* Knobs come from constructor defaults, overridden per request by a
  ``[[sim key=value ...]]`` directive in the last user message (or the
  completion ``prompt``) unless ``directives=False``. Unknown keys or bad
  values answer 400 ``simulator: ...`` so a typo never passes silently.
* All shared state sits on one ``_State`` behind one lock, because tests read
  it from another thread. Nothing is module-level mutable.
* Deterministic: text, ids (a per-simulator counter), ``created`` (the
  simulator's start second), timings (derived from the knobs) and tool-call
  ids depend only on the request order and knobs. Generated request ids are
  random, as the real server's are.
* Bounds: request head 64 KiB, body 50 MiB (413 like the real server), 32
  pipelined requests, a hang lasts at most 300 s, ``endless_line`` 512 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import enum
import gzip
import http
import ipaddress
import re
import signal
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, cast

import httptools
import orjson

__all__ = ["DEFAULT_MODEL_ID", "FAULTS", "SimKnobs", "SimRequest", "Simulator", "main"]

DEFAULT_MODEL_ID = "/srv/mosaic-models/" + "0" * 64
SIMULATOR_HEADER = ("x-simulator", "mistralrs-protocol-simulator")
MAX_BODY_BYTES = 50 * 1024 * 1024
FINISHES = frozenset({"stop", "length", "tool_calls", "canceled"})
FAULTS = frozenset(
    {
        "missing_done", "close_mid", "error_json", "error_raw", "error_first", "id_change",
        "created_change", "model_change", "two_choices", "role_change", "nul_text",
        "usage_early", "bad_usage", "too_many_tokens", "bad_finish", "named_event",
        "after_done", "hang", "hang_headers", "hang_mid", "json_body", "wrong_content_type",
        "huge_headers", "endless_line", "gzip", "redirect", "wrong_request_id",
        "no_request_id", "invalid_utf8",
    }
)  # fmt: skip
MODELS_FAULTS = frozenset({"bad_body", "hang"})
MODEL_STATUSES = frozenset({"loaded", "unloaded", "reloading"})

_MAX_HEAD_BYTES = 64 * 1024
_MAX_PIPELINE = 32
_FLUSH_BYTES = 64 * 1024
_HANG_LIMIT_S = 300.0
_ENDLESS_LIMIT = 512 * 1024 * 1024
_ENDLESS_BLOCK = 64 * 1024
_READY_TIMEOUT_S = 10.0
_INVALID_UTF8_MARK = "\x1asim-invalid-utf8\x1a"
_INVALID_UTF8_JSON = orjson.dumps(_INVALID_UTF8_MARK)[1:-1]

_DONE = b"data: [DONE]\n\n"
_KEEPALIVE = b":\n\n"
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
_UNICODE_WORDS = ("héllo", "wörld", "✓", "日本", "🙂")
# tower-http CorsLayer with `Any` origin, as the real server answers every request.
_COMMON_HEADERS = (
    ("access-control-allow-origin", "*"),
    ("vary", "origin, access-control-request-method, access-control-request-headers"),
    ("access-control-expose-headers", "x-request-id"),
    SIMULATOR_HEADER,
)
_DIRECTIVE = re.compile(r"\[\[sim(\s[^\]]*)?\]\]")
_VISIBLE_ASCII = re.compile(r"[\x20-\x7e]+")


# --------------------------------------------------------------------- knobs


@dataclass(frozen=True, slots=True)
class SimKnobs:
    """How one response is shaped. Constructor defaults, then per-request directives."""

    chunks: int = 8
    delay_ms: float = 0.0
    first_delay_ms: float = 0.0
    keepalive_ms: float = 10_000.0  # 0 disables keep-alive comments
    split: int = 0  # 0: write whole; N: pieces of at most N bytes, each flushed alone
    unicode: bool = False
    finish: str = "stop"
    tool_call: bool = False
    status: int | None = None
    extras: bool = False
    fault: str | None = None
    pad: int = 0  # pad each content token's text to this many bytes (large streams)

    def __post_init__(self) -> None:
        checks = (
            (0 <= self.chunks <= 100_000, "chunks must be 0..100000"),
            (0 <= self.delay_ms <= 600_000, "delay_ms must be 0..600000"),
            (0 <= self.first_delay_ms <= 600_000, "first_delay_ms must be 0..600000"),
            (0 <= self.keepalive_ms <= 600_000, "keepalive_ms must be 0..600000"),
            (0 <= self.split <= 1 << 20, "split must be 0..1048576"),
            (self.finish in FINISHES, f"finish must be one of {sorted(FINISHES)}"),
            (self.status is None or 100 <= self.status <= 599, "status must be 100..599"),
            (self.fault is None or self.fault in FAULTS, "unknown fault"),
            (0 <= self.pad <= 65_536, "pad must be 0..65536"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def _flag(raw: str) -> bool:
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 0 or 1")


_KNOB_TYPES: dict[str, Callable[[str], Any]] = {
    "chunks": int,
    "delay_ms": float,
    "first_delay_ms": float,
    "keepalive_ms": float,
    "split": int,
    "unicode": _flag,
    "finish": str,
    "tool_call": _flag,
    "status": int,
    "extras": _flag,
    "fault": str,
    "pad": int,
}


class DirectiveError(ValueError):
    """A ``[[sim ...]]`` directive the simulator cannot honour."""


def apply_directives(text: str, base: SimKnobs) -> SimKnobs:
    """Override ``base`` with every ``[[sim key=value ...]]`` in ``text`` (later wins)."""
    updates: dict[str, Any] = {}
    for match in _DIRECTIVE.finditer(text):
        for item in (match.group(1) or "").split():
            key, sep, raw = item.partition("=")
            convert = _KNOB_TYPES.get(key)
            if convert is None or not sep:
                raise DirectiveError(f"simulator: unknown directive {item!r}")
            try:
                updates[key] = convert(raw)
            except ValueError as exc:
                raise DirectiveError(f"simulator: bad value in {item!r}") from exc
    if not updates:
        return base
    try:
        return dataclasses.replace(base, **updates)
    except ValueError as exc:
        raise DirectiveError(f"simulator: {exc}") from exc


# ------------------------------------------------------------- observations


@dataclass
class SimRequest:
    """One request as the simulator received it.

    ``headers`` has lower-cased names; repeated headers are joined with ``", "``.
    ``completed`` means the simulator played its whole scripted response (a
    fault's script included) to a connected client; it stays False when the
    client went away first or the simulator stopped. ``disconnected_at`` is set
    when the client went away while its response was still being played (for a
    non-streamed request the script then runs on, as the engine's generation
    does, so ``finished_at`` comes later).
    """

    seq: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any | None
    received_at: float
    finished_at: float | None = None
    disconnected_at: float | None = None
    completed: bool = False
    query: str = ""
    #: response bytes handed to the kernel so far (read live: backpressure tests)
    bytes_sent: int = 0


class _State:
    """Everything shared between the event-loop thread and test threads."""

    def __init__(self, model_id: str, knobs: SimKnobs, directives: bool) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.model_id = model_id
        self.knobs = self.initial_knobs = knobs
        self.directives = directives
        self.created = int(time.time())
        self.requests: list[SimRequest] = []
        self.next_seq = 1
        self.next_completion = 1
        self.active = 0
        self.max_active = 0
        self.model_status: str | None = "loaded"
        self.model_entries = 1
        self.models_fault: str | None = None

    def record(self, req: SimRequest) -> None:
        with self.cond:
            req.seq = self.next_seq
            self.next_seq += 1
            self.requests.append(req)
            self.cond.notify_all()

    def update(self, req: SimRequest, **changes: Any) -> None:
        with self.cond:
            for name, value in changes.items():
                setattr(req, name, value)
            self.cond.notify_all()

    def enter(self) -> int:
        with self.cond:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            number = self.next_completion
            self.next_completion += 1
            self.cond.notify_all()
            return number

    def leave(self) -> None:
        with self.cond:
            self.active -= 1
            self.cond.notify_all()


# ------------------------------------------------------------------- plans


@dataclass(frozen=True, slots=True)
class _Head:
    status: int
    headers: list[tuple[str, str]]
    length: int | None  # None: transfer-encoding chunked


@dataclass(frozen=True, slots=True)
class _Pause:
    seconds: float


class _Op(enum.Enum):
    END = "end"
    ABORT = "abort"
    HANG = "hang"
    ENDLESS = "endless"


_Step = _Head | _Pause | _Op | bytes


@dataclass(frozen=True, slots=True)
class _Ctx:
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


def _simple(
    status: int, body: bytes, request_id: str, content_type: str | None = None
) -> Iterator[_Step]:
    headers = [("content-type", content_type)] if content_type else []
    headers += [("x-request-id", request_id), *_COMMON_HEADERS]
    yield _Head(status, headers, len(body))
    yield body
    yield _Op.END


def _json_reply(status: int, obj: Any, request_id: str) -> Iterator[_Step]:
    return _simple(status, orjson.dumps(obj), request_id, "application/json")


def _text_reply(status: int, text: str, request_id: str) -> Iterator[_Step]:
    return _simple(status, text.encode(), request_id, "text/plain; charset=utf-8")


def _token(i: int, unicode: bool, pad: int = 0) -> str:
    word = _UNICODE_WORDS[i % len(_UNICODE_WORDS)] if unicode else "token"
    text = f"sim-{word}-{i} "
    return text.ljust(pad, ".") if pad else text


def _shape(ctx: _Ctx) -> tuple[int, str]:
    """(content chunks, finish reason). Hitting max_tokens wins over everything."""
    count = ctx.knobs.chunks
    finish = "tool_calls" if ctx.knobs.tool_call else ctx.knobs.finish
    if ctx.max_tokens is not None and count >= ctx.max_tokens:
        return ctx.max_tokens, "length"
    return count, finish


def _usage(ctx: _Ctx, completion: int) -> dict[str, Any]:
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


def _terminal_usage(ctx: _Ctx, count: int) -> dict[str, Any]:
    fault = ctx.knobs.fault
    if fault == "too_many_tokens":
        return _usage(ctx, (ctx.max_tokens if ctx.max_tokens is not None else count) + 1)
    usage = _usage(ctx, count)
    if fault == "bad_usage":
        usage["total_tokens"] += 1
    return usage


def _tool_calls(ctx: _Ctx) -> list[dict[str, Any]]:
    call_id = f"call-{uuid.UUID(int=ctx.number)}"
    function = {"name": "lookup", "arguments": '{"q":1}'}
    return [{"index": 0, "id": call_id, "type": "function", "function": function}]


def _chunk(
    ctx: _Ctx,
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


def _corrupt(ctx: _Ctx, chunk: dict[str, Any]) -> None:
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


def _stream_body(ctx: _Ctx) -> Iterator[bytes | _Pause | _Op]:
    """The SSE body of a streamed chat/completion, faults included, ending in an _Op."""
    k = ctx.knobs
    fault = k.fault
    count, finish = _shape(ctx)
    if fault == "bad_finish":
        finish = "content_filter"
    if fault == "error_first":
        yield _ERROR_JSON
        yield _DONE
        yield _Op.END
        return
    if k.first_delay_ms:
        yield _Pause(k.first_delay_ms / 1000)
    middle = count // 2
    # The length chunk carries the last text; every other finish gets its own chunk.
    finish_on_last = finish == "length" and count > 0
    # Completion chunks never carry usage; the usage faults add one to corrupt.
    with_usage = ctx.chat or fault in ("bad_usage", "too_many_tokens")
    terminal_usage = _terminal_usage(ctx, count) if with_usage else None
    for i in range(count + 1):
        if i == middle and fault in _MID_FAULTS:
            if fault == "close_mid":
                yield _Op.ABORT
                return
            if fault == "hang_mid":
                yield _Op.HANG
                return
            if fault == "named_event":
                yield _NAMED_EVENT
            else:
                yield _ERROR_JSON if fault == "error_json" else _ERROR_RAW
                yield _DONE
                yield _Op.END
                return
        if i == count:
            break
        if i and k.delay_ms:
            yield _Pause(k.delay_ms / 1000)
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
            yield _Pause(k.delay_ms / 1000)
        if finish == "tool_calls" and ctx.chat:
            chunk = _chunk(ctx, None, finish, terminal_usage, _tool_calls(ctx))
        else:
            chunk = _chunk(ctx, "", finish, terminal_usage)
        if count == 0 and fault in _CHUNK_FAULTS:
            _corrupt(ctx, chunk)
        yield _event(chunk)
    if fault != "missing_done":
        yield _DONE
    if fault == "after_done":
        yield _event(_chunk(ctx, _token(count, k.unicode), None, None))
    yield _Op.END


def _json_body(ctx: _Ctx) -> bytes:
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


def _total_delay(ctx: _Ctx) -> float:
    count, _ = _shape(ctx)
    k = ctx.knobs
    return (k.first_delay_ms + k.delay_ms * max(count - 1, 0)) / 1000


def _plan_inference(ctx: _Ctx) -> Iterator[_Step]:
    k = ctx.knobs
    fault = k.fault
    base = [*_id_headers(ctx.request_id, fault), *_COMMON_HEADERS]
    if fault == "huge_headers":
        base.append(("x-sim-padding", "p" * 200 * 1024))
    if k.status is not None:
        yield from _simple(
            k.status, b'{"message":"simulated failure"}', ctx.request_id, "application/json"
        )
        return
    if fault == "hang_headers":
        yield _Op.HANG
        return
    if fault == "redirect":
        yield _Head(307, [("location", "/sim/redirected"), *base], 0)
        yield _Op.END
        return
    if fault == "close_mid" and not ctx.stream:
        yield _Pause(_total_delay(ctx) / 2)
        yield _Op.ABORT
        return
    if not ctx.stream or fault == "json_body":
        if not ctx.stream:
            yield _Pause(_total_delay(ctx))
        if fault == "hang":
            yield _Op.HANG
            return
        body = _json_body(ctx)
        headers = [("content-type", "application/json"), *base]
        if fault == "gzip":
            body = gzip.compress(body, mtime=0)
            headers.append(("content-encoding", "gzip"))
        elif fault == "wrong_content_type":
            headers[0] = ("content-type", "text/plain; charset=utf-8")
        yield _Head(200, headers, len(body))
        yield body
        yield _Op.END
        return
    content_type = "text/plain; charset=utf-8" if fault == "wrong_content_type" else None
    headers = [("content-type", content_type or "text/event-stream")]
    headers += [("cache-control", "no-cache"), *base]
    if fault == "gzip":
        # Compressed as a whole: pauses are dropped, the bytes are what matter here.
        raw = b"".join(s for s in _stream_body(ctx) if isinstance(s, bytes))
        yield _Head(200, [*headers, ("content-encoding", "gzip")], None)
        yield gzip.compress(raw, mtime=0)
        yield _Op.END
        return
    yield _Head(200, headers, None)
    if fault == "hang":
        yield _Op.HANG
    elif fault == "endless_line":
        yield b"data: "
        yield _Op.ENDLESS
    else:
        yield from _stream_body(ctx)


# ---------------------------------------------------------------- requests


@dataclass(slots=True)
class _Incoming:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    keep_alive: bool
    refusal: tuple[int, str] | None = None


def _request_id(headers: dict[str, str]) -> str:
    value = headers.get("x-request-id", "")
    if value.strip() and _VISIBLE_ASCII.fullmatch(value):
        return value
    return "req_" + uuid.uuid4().hex


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        return " ".join(p for p in parts if isinstance(p, str))
    return ""


def _rough_tokens(texts: Iterable[str], per_text: int) -> int:
    """About four characters a token, plus a few for each message's template."""
    total = sum((len(t) + 3) // 4 + per_text for t in texts)
    return max(1, total)


def _is_json_type(headers: dict[str, str]) -> bool:
    mime = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return mime == "application/json" or (
        mime.startswith("application/") and mime.endswith("+json")
    )


def _extract(req: Any, chat: bool) -> tuple[list[str], str, str | None]:
    """(all prompt texts, text that may hold directives, deserialization problem)."""
    if not isinstance(req, dict):
        return [], "", "invalid type: expected a JSON object"
    if not chat:
        prompt = req.get("prompt")
        if not isinstance(prompt, str):
            return [], "", "missing field `prompt`" if prompt is None else "invalid type: prompt"
        return [prompt], prompt, None
    messages = req.get("messages")
    if isinstance(messages, str):  # a bare string is one user message
        return [messages], messages, None
    if not isinstance(messages, list):
        return [], "", "missing field `messages`" if messages is None else "invalid type: messages"
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        return [], "", "invalid type: message"
    texts = [_text_of(m.get("content")) for m in messages]
    users = [t for m, t in zip(messages, texts, strict=True) if m["role"] == "user"]
    return texts, users[-1] if users else "", None


_DESERIALIZE = "Failed to deserialize the JSON body into the target type: "
_ADMIN_METHODS: dict[str, str] = {
    "/v1/models/status": "POST",
    "/v1/models/unload": "POST",
    "/v1/models/reload": "POST",
    "/v1/models/tune": "POST",
    "/v1/system/info": "GET",
    "/v1/system/doctor": "POST",
    "/v1/embeddings": "POST",
    "/v1/lora_adapters": "GET",
    "/metrics": "GET",
    "/re_isq": "POST",
    "/calibration/start": "POST",
    "/calibration/apply": "POST",
    "/calibration/status": "GET",
}


class _Core:
    """Routing and per-request logic; runs on the simulator's event loop only."""

    def __init__(self, state: _State) -> None:
        self.state = state
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._date = (0, "")

    def date(self) -> str:
        now = int(time.time())
        if now != self._date[0]:
            self._date = (now, formatdate(now, usegmt=True))
        return self._date[1]

    async def respond(self, conn: _Connection, inc: _Incoming) -> bool:
        """Record, route and play one request; True if the connection may be reused."""
        path, _, query = inc.target.partition("?")
        headers: dict[str, str] = {}
        for name, value in inc.headers:
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        parsed: Any | None = None
        with contextlib.suppress(ValueError):
            parsed = orjson.loads(inc.body) if inc.body else None
        req = SimRequest(0, inc.method, path, headers, inc.body, parsed, time.monotonic())
        req.query = query
        self.state.record(req)
        rid = _request_id(headers)
        completed = False
        try:
            reply: Iterator[_Step] | _Ctx
            if inc.refusal is not None:
                reply = _text_reply(*inc.refusal, rid)
            else:
                reply = self._route(inc.method, path, inc.body, headers, rid)
            if isinstance(reply, _Ctx):
                keep = await self._infer(conn, req, reply, inc.keep_alive)
            else:
                conn.begin(req, cancel_on_lost=True)
                try:
                    keep = await conn.play(reply, None, inc.keep_alive)
                finally:
                    conn.end()
            completed = True
            return keep and inc.refusal is None
        finally:
            # A client that left (a non-streamed request keeps running after that,
            # like the engine) did not get the response, whatever the script did.
            completed = completed and req.disconnected_at is None
            self.state.update(req, finished_at=time.monotonic(), completed=completed)

    async def _infer(self, conn: _Connection, req: SimRequest, ctx: _Ctx, keep: bool) -> bool:
        # The id counter advances only for admitted inference, like the engine's.
        ctx = dataclasses.replace(ctx, number=self.state.enter())
        conn.begin(req, cancel_on_lost=ctx.stream)
        try:
            return await conn.play(_plan_inference(ctx), ctx.knobs, keep)
        finally:
            conn.end()
            self.state.leave()

    def _route(
        self, method: str, path: str, body: bytes, headers: dict[str, str], rid: str
    ) -> Iterator[_Step] | _Ctx:
        if path in ("/v1/chat/completions", "/v1/completions"):
            if method != "POST":
                return _simple(405, b"", rid)
            return self._inference(path == "/v1/chat/completions", body, headers, rid)
        if path in ("/v1/models", "/health", "/"):
            if method != "GET":
                return _simple(405, b"", rid)
            return self._models(rid) if path == "/v1/models" else _text_reply(200, "OK", rid)
        allowed = _ADMIN_METHODS.get(path)
        if allowed is None:
            return _simple(404, b"", rid)
        if method != allowed:
            return _simple(405, b"", rid)
        return self._admin(path, body, rid)

    def _models(self, rid: str) -> Iterator[_Step]:
        st = self.state
        with st.cond:
            status, entries, fault = st.model_status, st.model_entries, st.models_fault
        if fault == "hang":
            return iter([_Op.HANG])
        if fault == "bad_body":
            return _simple(200, b'{"object":"list","data":[{"id":', rid, "application/json")
        data: list[dict[str, Any]] = [
            {
                "id": "default",
                "object": "model",
                "created": st.created,
                "owned_by": "local",
                "root": "default",
            }
        ]
        for _ in range(entries if status is not None else 0):
            data.append(
                {
                    "id": st.model_id,
                    "object": "model",
                    "created": st.created,
                    "owned_by": "local",
                    "root": st.model_id,
                    "status": status,
                }
            )
        return _json_reply(200, {"object": "list", "data": data}, rid)

    def _admin(self, path: str, body: bytes, rid: str) -> Iterator[_Step]:
        st = self.state
        if path == "/metrics":
            with st.cond:
                active = st.active
            text = f"# mistralrs protocol simulator\nmistralrs_sequences_running {active}\n"
            return _text_reply(200, text, rid)
        if path == "/v1/lora_adapters":
            error = {"message": "LoRA runtime is not available", "type": "invalid_request_error"}
            return _json_reply(409, {"error": {**error, "code": "lora_runtime_unavailable"}}, rid)
        if path in ("/re_isq", "/calibration/start", "/calibration/apply"):
            # These handlers answer in text/plain, errors included (reference §5).
            return _text_reply(200, f"simulated: {path} accepted", rid)
        if path not in ("/v1/models/status", "/v1/models/unload", "/v1/models/reload"):
            return _json_reply(200, {"simulator": True, "route": path}, rid)
        try:
            parsed = orjson.loads(body)
        except ValueError:
            return _text_reply(400, _DESERIALIZE + "expected value at line 1 column 1", rid)
        model_id = parsed.get("model_id") if isinstance(parsed, dict) else None
        if not isinstance(model_id, str):
            return _text_reply(422, _DESERIALIZE + "missing field `model_id`", rid)
        with st.cond:
            if st.model_status is None or model_id not in (st.model_id, "default"):
                status = "not_found"
            else:
                if path == "/v1/models/unload":
                    st.model_status = "unloaded"
                elif path == "/v1/models/reload":
                    st.model_status = "loaded"
                status = st.model_status
        return _json_reply(200, {"model_id": model_id, "status": status}, rid)

    def _inference(
        self, chat: bool, body: bytes, headers: dict[str, str], rid: str
    ) -> Iterator[_Step] | _Ctx:
        # Checks in the real server's order: body limit, content type, JSON
        # syntax, JSON shape (axum), then the handler's own parsing.
        if len(body) > MAX_BODY_BYTES:
            return _text_reply(413, "request body too large", rid)
        if not _is_json_type(headers):
            return _text_reply(415, "Expected request with `Content-Type: application/json`", rid)
        try:
            req = orjson.loads(body)
        except ValueError:
            return _text_reply(400, _DESERIALIZE + "expected value at line 1 column 1", rid)
        texts, directive_text, problem = _extract(req, chat)
        model = req.get("model", "default") if problem is None else None
        stream = req.get("stream", False) if problem is None else None
        max_tokens = (
            req.get("max_tokens", req.get("max_completion_tokens")) if problem is None else None
        )
        if problem is None and not (isinstance(model, str) and isinstance(stream, bool)):
            problem = "invalid type: model or stream"
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0
        ):
            problem = "invalid type: max_tokens"
        if problem is not None:
            return _text_reply(422, _DESERIALIZE + problem, rid)
        assert isinstance(model, str) and isinstance(stream, bool)
        st = self.state
        with st.cond:
            present = st.model_status is not None
            available = present and model in (st.model_id, "default")
            if available and st.model_status == "unloaded":
                st.model_status = "loaded"  # mistral.rs reloads on demand inside the request
            knobs, use_directives = st.knobs, st.directives
        if not available:
            names = st.model_id if present else ""
            message = (
                f"Requested model '{model}' is not available. Available models: {names}. "
                "Use 'default' to use the default model."
            )
            return _json_reply(500, {"message": message}, rid)
        if max_tokens == 0:
            return _json_reply(500, {"message": "`max_tokens` must be at least 1"}, rid)
        if use_directives:
            try:
                knobs = apply_directives(directive_text, knobs)
            except DirectiveError as exc:
                return _text_reply(400, str(exc), rid)
        prompt_tokens = _rough_tokens(texts, 4 if chat else 0)
        return _Ctx(chat, stream, knobs, 0, st.created, st.model_id, max_tokens, prompt_tokens, rid)


# --------------------------------------------------------------- transport


def _frame(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class _Connection(asyncio.Protocol):
    """One client connection: httptools parsing, a request queue, a plan player."""

    def __init__(self, core: _Core) -> None:
        self._core = core
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._queue: deque[_Incoming] = deque()
        self._task: asyncio.Task[None] | None = None
        self._lost = False
        self._gone: asyncio.Future[None] = self._loop.create_future()
        self._broken = False
        self._reading_paused = False
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._current: SimRequest | None = None
        self._cancel_on_lost = True
        self._url = bytearray()
        self._headers: list[tuple[str, str]] = []
        self._head_bytes = 0
        self._body = bytearray()
        self._method = ""
        self._refusal: tuple[int, str] | None = None

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._core.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self._broken:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._broken = True
            status, text = self._refusal or (400, "Bad Request")
            target = self._url.decode("latin-1")
            refusal = _Incoming(
                self._method or "?", target, self._headers, b"", False, (status, text)
            )
            self._enqueue(refusal)

    def eof_received(self) -> bool:
        return False  # a half-close is a goodbye: close, and let connection_lost report it

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if not self._gone.done():
            self._gone.set_result(None)
        self._core.connections.discard(self)
        if self._current is not None:
            self._core.state.update(self._current, disconnected_at=time.monotonic())
        self._wake_writer()
        if self._task is not None and self._cancel_on_lost:
            self._task.cancel()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writer()

    # -- httptools callbacks

    def on_message_begin(self) -> None:
        self._url.clear()
        self._headers = []
        self._head_bytes = 0
        self._body.clear()
        self._method = ""

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._grow_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))
        self._grow_head(len(name) + len(value))

    def on_headers_complete(self) -> None:
        self._method = self._parser.get_method().decode("latin-1")

    def on_body(self, body: bytes) -> None:
        if len(self._body) + len(body) > MAX_BODY_BYTES:
            self._refusal = (413, "request body too large")
            raise ValueError("body over limit")
        self._body += body

    def on_message_complete(self) -> None:
        keep = bool(self._parser.should_keep_alive())
        target = self._url.decode("latin-1")
        self._enqueue(_Incoming(self._method, target, self._headers, bytes(self._body), keep))

    def _grow_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > _MAX_HEAD_BYTES:
            self._refusal = (431, "request header fields too large")
            raise ValueError("head over limit")

    # -- request queue

    def _enqueue(self, inc: _Incoming) -> None:
        self._queue.append(inc)
        if len(self._queue) >= _MAX_PIPELINE and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()
        if self._task is None and not self._lost:
            self._task = self._loop.create_task(self._work())
            self._core.tasks.add(self._task)
            self._task.add_done_callback(self._core.tasks.discard)

    async def _work(self) -> None:
        transport = self._transport
        assert transport is not None
        try:
            while self._queue and not self._lost:
                inc = self._queue.popleft()
                if self._reading_paused and len(self._queue) < _MAX_PIPELINE // 2:
                    self._reading_paused = False
                    transport.resume_reading()
                if not await self._core.respond(self, inc) or not inc.keep_alive:
                    transport.close()  # flushes what is buffered first
                    return
        except Exception as exc:  # a simulator bug: make it loud, drop the connection
            self._loop.call_exception_handler(
                {"message": "simulator response failed", "exception": exc}
            )
            transport.abort()
        finally:
            self._task = None

    def begin(self, req: SimRequest, *, cancel_on_lost: bool) -> None:
        self._current = req
        self._cancel_on_lost = cancel_on_lost

    def end(self) -> None:
        self._current = None
        self._cancel_on_lost = True

    # -- writing

    def _wake_writer(self) -> None:
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _drain(self) -> None:
        if self._write_paused and not self._lost:
            self._drain_waiter = self._loop.create_future()
            await self._drain_waiter

    async def _flush(self, out: list[bytes], split: int) -> None:
        if not out:
            return
        data = b"".join(out)
        out.clear()
        transport = self._transport
        assert transport is not None
        if self._lost or transport.is_closing():
            return
        current = self._current
        if current is not None:
            current.bytes_sent += len(data)  # one writer; readers only poll it
        if split <= 0:
            transport.write(data)
            await self._drain()
            return
        # A high-water mark of zero makes every piece wait until the kernel took
        # it, so pieces leave in separate send() calls (TCP_NODELAY is set).
        transport.set_write_buffer_limits(high=0)
        try:
            for start in range(0, len(data), split):
                if self._lost or transport.is_closing():
                    return
                transport.write(data[start : start + split])
                await self._drain()
                await asyncio.sleep(0)
        finally:
            if not transport.is_closing():
                transport.set_write_buffer_limits()

    async def play(self, plan: Iterator[_Step], knobs: SimKnobs | None, keep_alive: bool) -> bool:
        """Write a plan. True when the response ended cleanly and the connection may stay."""
        split = knobs.split if knobs else 0
        ka_ms = knobs.keepalive_ms if knobs else 0.0
        keepalive = max(ka_ms, 1.0) / 1000 if ka_ms > 0 else None
        out: list[bytes] = []
        chunked = False
        sse_open = False
        last_event = self._loop.time()
        pending = 0
        for step in plan:
            if isinstance(step, bytes):
                if not chunked:
                    out.append(step)
                elif step:  # an empty chunk would be the terminator
                    out.append(_frame(step))
                pending += len(step)
                if pending >= _FLUSH_BYTES:
                    # A long burst goes out as it is made, under flow control,
                    # instead of as one write the size of the whole stream.
                    await self._flush(out, split)
                    pending = 0
            elif isinstance(step, _Pause):
                await self._flush(out, split)
                if sse_open and keepalive is not None:
                    last_event = await self._idle(step.seconds, keepalive, last_event, split)
                else:
                    await asyncio.sleep(step.seconds)
            elif isinstance(step, _Head):
                chunked = step.length is None
                sse_open = chunked
                out.append(self._head(step, keep_alive))
                last_event = self._loop.time()
            elif step is _Op.END:
                if chunked:
                    out.append(b"0\r\n\r\n")
                await self._flush(out, split)
                return True
            else:
                await self._flush(out, split)
                await self._finish_badly(step)
                return False
        await self._flush(out, split)
        return True

    async def _finish_badly(self, op: _Op) -> None:
        transport = self._transport
        assert transport is not None
        if op is _Op.HANG:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._gone), _HANG_LIMIT_S)
        elif op is _Op.ENDLESS:
            block = _frame(b"x" * _ENDLESS_BLOCK)
            for _ in range(_ENDLESS_LIMIT // _ENDLESS_BLOCK):
                if self._lost or transport.is_closing():
                    break
                transport.write(block)
                if self._current is not None:
                    self._current.bytes_sent += len(block)
                await self._drain()
                await asyncio.sleep(0)  # a fast reader never pauses us; let others run
        transport.abort()

    async def _idle(self, seconds: float, keepalive: float, last_event: float, split: int) -> float:
        """Sleep ``seconds``, writing a keep-alive comment after each ``keepalive`` of quiet."""
        end = self._loop.time() + seconds
        # Bounded: each pass either finishes or moves last_event forward by >= 1 ms.
        while True:
            now = self._loop.time()
            due = last_event + keepalive
            if due >= end:
                await asyncio.sleep(max(0.0, end - now))
                return last_event
            await asyncio.sleep(max(0.0, due - now))
            await self._flush([_frame(_KEEPALIVE)], split)
            last_event = self._loop.time()

    def _head(self, head: _Head, keep_alive: bool) -> bytes:
        try:
            reason = http.HTTPStatus(head.status).phrase
        except ValueError:
            reason = "Unknown"
        lines = [f"HTTP/1.1 {head.status} {reason}\r\n"]
        lines += [f"{name}: {value}\r\n" for name, value in head.headers]
        if head.length is None:
            lines.append("transfer-encoding: chunked\r\n")
        else:
            lines.append(f"content-length: {head.length}\r\n")
        if not keep_alive:
            lines.append("connection: close\r\n")
        lines.append(f"date: {self._core.date()}\r\n\r\n")
        return "".join(lines).encode("utf-8")

    def shutdown(self) -> None:
        if self._transport is not None:
            self._transport.abort()


# ---------------------------------------------------------------- the server


def _require_loopback(host: str) -> None:
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"the simulator binds loopback only, not {host!r}")


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


class Simulator:
    """A mistral.rs protocol simulator on loopback (see the module docstring).

    Use ``start()``/``stop()`` to run it on its own thread and event loop (tests),
    or ``await serve_forever()`` on the current loop (CLI). Knob arguments are the
    defaults of every response; ``directives=False`` ignores ``[[sim ...]]``.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model_id: str = DEFAULT_MODEL_ID,
        chunks: int = 8,
        delay_ms: float = 0,
        keepalive_ms: float = 10_000,
        directives: bool = True,
        first_delay_ms: float = 0,
        split: int = 0,
        unicode: bool = False,
        finish: str = "stop",
        tool_call: bool = False,
        extras: bool = False,
        fault: str | None = None,
        status: int | None = None,
    ) -> None:
        _require_loopback(host)
        knobs = SimKnobs(
            chunks=chunks,
            delay_ms=delay_ms,
            first_delay_ms=first_delay_ms,
            keepalive_ms=keepalive_ms,
            split=split,
            unicode=unicode,
            finish=finish,
            tool_call=tool_call,
            status=status,
            extras=extras,
            fault=fault,
        )
        self._host = host
        self._port = port
        self._state = _State(model_id, knobs, directives)
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    # -- addresses

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    @property
    def model_id(self) -> str:
        return self._state.model_id

    # -- running

    async def serve_forever(self) -> None:
        """Serve on the running loop until cancelled."""
        await self._serve(*await self._bind())

    async def _bind(self) -> tuple[asyncio.Server, _Core]:
        core = _Core(self._state)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Connection(core), self._host, self._port, backlog=1024
        )
        self._port = server.sockets[0].getsockname()[1]
        self._listening.set()
        return server, core

    async def _serve(self, server: asyncio.Server, core: _Core) -> None:
        try:
            await server.serve_forever()
        finally:
            server.close()
            # A connection accepted just before the close gets connection_made,
            # and its request task, a loop turn or two later: sweep until a
            # turn finds nothing new (bounded).
            for _ in range(20):
                await asyncio.sleep(0)
                conns, tasks = list(core.connections), list(core.tasks)
                for conn in conns:
                    conn.shutdown()
                for task in tasks:
                    task.cancel()
                if tasks:
                    await asyncio.wait(tasks, timeout=5)
                if not conns and not tasks:
                    break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5)

    def start(self) -> None:
        """Serve on a background thread; return once listening."""
        if self._thread is not None:
            raise RuntimeError("simulator already started")
        self._thread = threading.Thread(target=self._thread_main, name="sim", daemon=True)
        self._thread.start()
        if not self._listening.wait(_READY_TIMEOUT_S):
            raise RuntimeError("simulator did not start listening in time")
        if self._error is not None:
            raise RuntimeError("simulator failed to start") from self._error

    def _thread_main(self) -> None:
        loop = _loop_factory()()
        self._loop = loop
        try:
            self._main = loop.create_task(self.serve_forever())
            loop.run_until_complete(self._main)
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # reported by start()
            self._error = exc
        finally:
            self._listening.set()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def stop(self) -> None:
        loop, main, thread = self._loop, self._main, self._thread
        if loop is not None and main is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(main.cancel)
        if thread is not None:
            thread.join(_READY_TIMEOUT_S)

    # -- observations and controls (thread-safe)

    def requests(self) -> list[SimRequest]:
        with self._state.cond:
            return [dataclasses.replace(r) for r in self._state.requests]

    def reset(self) -> None:
        """Back to as constructed: no recorded requests, peak = current, model loaded.

        The completion-id counter keeps counting, so ids stay unique per simulator.
        """
        st = self._state
        with st.cond:
            st.requests.clear()
            st.max_active = st.active
            st.knobs = st.initial_knobs
            st.model_status, st.model_entries, st.models_fault = "loaded", 1, None

    @property
    def active_streams(self) -> int:
        with self._state.cond:
            return self._state.active

    @property
    def max_active_streams(self) -> int:
        with self._state.cond:
            return self._state.max_active

    def set_model_status(self, status: str | None) -> None:
        if status is not None and status not in MODEL_STATUSES:
            raise ValueError(f"status must be one of {sorted(MODEL_STATUSES)} or None")
        with self._state.cond:
            self._state.model_status = status

    def set_model_entries(self, count: int) -> None:
        if not 0 <= count <= 16:
            raise ValueError("count must be 0..16")
        with self._state.cond:
            self._state.model_entries = count

    def set_models_fault(self, fault: str | None) -> None:
        if fault is not None and fault not in MODELS_FAULTS:
            raise ValueError(f"fault must be one of {sorted(MODELS_FAULTS)} or None")
        with self._state.cond:
            self._state.models_fault = fault

    def set_knobs(self, **changes: Any) -> None:
        """Change the default knobs of later requests (same names as the constructor)."""
        with self._state.cond:
            self._state.knobs = dataclasses.replace(self._state.knobs, **changes)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Poll ``predicate`` until true or ``timeout`` seconds; woken by every state change."""
        deadline = time.monotonic() + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self._state.cond:
                self._state.cond.wait(min(remaining, 0.05))
        return True


# ---------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.simulator",
        description="mistral.rs protocol simulator (test equipment; generates no real text)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model-id", default=DEFAULT_MODEL_ID)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--keepalive-ms", type=float, default=10_000.0)
    parser.add_argument("--first-delay-ms", type=float, default=0.0)
    parser.add_argument("--no-directives", action="store_true")
    args = parser.parse_args(argv)
    try:
        sim = Simulator(
            host=args.host,
            port=args.port,
            model_id=args.model_id,
            chunks=args.chunks,
            delay_ms=args.delay_ms,
            keepalive_ms=args.keepalive_ms,
            first_delay_ms=args.first_delay_ms,
            directives=not args.no_directives,
        )
    except ValueError as exc:
        print(f"simulator: {exc}", file=sys.stderr)
        return 2

    async def run() -> None:
        bound = await sim._bind()
        print(f"simulator listening on {sim.base_url}", flush=True)
        serving = asyncio.ensure_future(sim._serve(*bound))
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, serving.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serving

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
