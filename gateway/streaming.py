"""Pump one worker stream through the validator to the caller.

Theory of operation:

- Bytes are read from the worker as they arrive, hashed (``stream_sha256``)
  and fed to :class:`gateway.sse.SSEValidator`. Every event the validator
  releases in one read is re-emitted in one ASGI send, so a caller sees each
  chunk as soon as it is validated; each ``await send`` applies the caller's
  backpressure to the worker's stream.
- Response headers go out with the first valid event (a keep-alive counts).
  Before that, any failure propagates as a :class:`GatewayError` and becomes an
  ordinary HTTP error; after it, the stream ends with one SSE error event and
  no ``[DONE]`` (spec §8, §12). ``[DONE]`` is sent only after the validator has
  seen the worker's body end right after it.
- One deadline covers the whole read: first-event timeout until the first
  event, then the idle timeout after every event, never past the total.
- Non-streaming requests run the same pump without sending and assemble the
  OpenAI JSON object at the end (spec §9).

The per-chunk path does one JSON parse (in the validator, with orjson), two
dict updates and one orjson dump.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.asgi import Send
from gateway.deadline import Deadline
from gateway.errors import GatewayError
from gateway.sse import NEED_DATA, Chunk, Done, KeepAlive, SSEValidator
from gateway.upstream.client import UpstreamStream

Opener = Callable[[], Awaitable[UpstreamStream]]

KEEPALIVE_FRAME = b":\n\n"
DONE_FRAME = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class Timeouts:
    first_event_s: float
    idle_s: float
    total_s: float


@dataclass(slots=True)
class StreamState:
    """What the pump observed; read by the request's ``finally`` for the receipt."""

    headers_sent: bool = False
    finished: bool = False  # the final body message was handed to the server
    first_content_at: float | None = None
    text_parts: list[str] = field(default_factory=list)
    reasoning_parts: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    hasher: Any = field(default_factory=hashlib.sha256)
    content_chunks: int = 0

    def text(self) -> str:
        return "".join(self.text_parts)


class CallerStalled(Exception):
    """The caller stopped reading: a send to it outlasted the idle (or total) deadline.

    The caller's transport buffer is full, so the relay stopped reading the
    worker (backpressure); the stream ends as a cancellation, not a worker
    timeout."""


def error_event(exc: GatewayError) -> bytes:
    return b"data: " + orjson.dumps(exc.body()) + b"\n\n"


class Relay:
    def __init__(
        self,
        *,
        validator: SSEValidator,
        alias: str,
        include_usage: bool,
        timeouts: Timeouts,
        response_headers: list[tuple[bytes, bytes]],
        abort: Callable[[], None] | None = None,
    ) -> None:
        self.validator = validator
        self.alias = alias
        self.include_usage = include_usage
        self.timeouts = timeouts
        self.response_headers = response_headers
        self.abort = abort
        self.state = StreamState()
        self.upstream: UpstreamStream | None = None
        self._sending = False
        # Only a non-streaming caller needs the text and tool calls kept: its
        # answer is assembled at the end. A streaming caller needs frames only.
        self._collecting = False

    @property
    def stream_sha256(self) -> str | None:
        """SHA-256 of the de-chunked bytes the worker sent (None before any)."""
        return self.state.hasher.hexdigest() if self.validator.bytes_received else None

    async def stream_to(self, open_stream: Opener, send: Send) -> None:
        """Re-stream to an ASGI ``send``; on failure after headers, end with an error event."""
        try:
            await self._pump(open_stream, send)
        except GatewayError as exc:
            if not self.state.headers_sent:
                raise
            await self.end_with_error(send, exc, self.timeouts.idle_s)
            raise

    async def end_with_error(self, send: Send, exc: GatewayError, timeout_s: float) -> None:
        """After headers: the one final error event (no ``[DONE]``). A caller that
        stopped reading would block this send for good: past ``timeout_s`` its
        connection is dropped instead."""
        self.state.finished = True
        try:
            async with asyncio.timeout(timeout_s):
                await send({"type": "http.response.body", "body": error_event(exc)})
        except TimeoutError:
            if self.abort is not None:
                self.abort()

    async def collect(self, open_stream: Opener) -> None:
        """Run the pump without a caller stream (non-streaming requests)."""
        self._collecting = True
        await self._pump(open_stream, None)

    def close(self) -> bool:
        """Close the worker response; True when it was still open (receipt: upstream_closed)."""
        upstream, self.upstream = self.upstream, None
        if upstream is None or upstream.closed:
            return False
        upstream.close()
        return True

    async def _pump(self, open_stream: Opener, send: Send | None) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        total_deadline = start + self.timeouts.total_s
        validator = self.validator
        state = self.state
        try:
            async with Deadline(
                min(start + self.timeouts.first_event_s, total_deadline)
            ) as deadline:
                # The first-event deadline covers connecting and the response head too.
                upstream = self.upstream = await open_stream()
                async for raw in upstream:
                    state.hasher.update(raw)
                    validator.receive_data(raw)
                    out: list[bytes] = []
                    try:
                        completed = self._drain_events(out)
                    except GatewayError:
                        # Events validated before the bad one still reach the caller,
                        # however the worker's bytes were split into reads.
                        if send is not None and out:
                            await self._send_body(send, out)
                        raise
                    if not completed:
                        continue
                    deadline.move_to(min(loop.time() + self.timeouts.idle_s, total_deadline))
                    if send is not None and out:
                        await self._send_body(send, out)
                validator.receive_data(b"")
                if not isinstance(validator.next_event(), Done):
                    raise GatewayError("upstream_protocol_error")
                if send is not None:
                    await self._send(send, {"type": "http.response.body", "body": DONE_FRAME})
                    state.finished = True
        except TimeoutError as exc:
            if self._sending:
                # Blocked on the caller, not the worker: the caller stopped reading.
                raise CallerStalled from exc
            raise GatewayError("upstream_timeout") from exc

    def _drain_events(self, out: list[bytes]) -> bool:
        """Append the frames for every event now available; False when none completed."""
        completed = False
        validator = self.validator
        while True:
            event = validator.next_event()
            if event is NEED_DATA:
                return completed
            completed = True
            if isinstance(event, Chunk):
                self._note_chunk(event)
                if not self._collecting:
                    out.append(self._chunk_frame(event))
            elif isinstance(event, KeepAlive):
                if not self._collecting:
                    out.append(KEEPALIVE_FRAME)
            elif isinstance(event, Done):  # pragma: no cover - Done only follows EOF
                return completed

    def _note_chunk(self, chunk: Chunk) -> None:
        state = self.state
        if state.first_content_at is None and (chunk.text or chunk.finish_reason):
            state.first_content_at = time.monotonic()
        if chunk.text:
            state.content_chunks += 1
            if self._collecting:
                state.text_parts.append(chunk.text)
        if self._collecting:
            choices = chunk.data.get("choices")
            if choices:
                delta = choices[0].get("delta")
                if isinstance(delta, dict):
                    self._note_delta(delta)

    def _chunk_frame(self, chunk: Chunk) -> bytes:
        data = chunk.data
        data["model"] = self.alias
        if not self.include_usage:
            data.pop("usage", None)
        return b"data: " + orjson.dumps(data) + b"\n\n"

    def _note_delta(self, delta: dict[str, Any]) -> None:
        reasoning = delta.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            self.state.reasoning_parts.append(reasoning)
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                if isinstance(call, dict):
                    _merge_tool_call(self.state.tool_calls, call)

    async def _send_body(self, send: Send, frames: list[bytes]) -> None:
        if not self.state.headers_sent:
            self.state.headers_sent = True
            await self._send(
                send,
                {"type": "http.response.start", "status": 200, "headers": self.response_headers},
            )
        await self._send(
            send, {"type": "http.response.body", "body": b"".join(frames), "more_body": True}
        )

    async def _send(self, send: Send, message: dict[str, Any]) -> None:
        # Left True when the send is cancelled: the deadline then knows whom it cut.
        self._sending = True
        await send(message)
        self._sending = False


def _merge_tool_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    index = delta.get("index", 0)
    if not isinstance(index, int):
        return
    call = calls.setdefault(
        index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if isinstance(delta.get("id"), str):
        call["id"] = delta["id"]
    function = delta.get("function")
    if isinstance(function, dict):
        if isinstance(function.get("name"), str):
            call["function"]["name"] += function["name"]
        if isinstance(function.get("arguments"), str):
            call["function"]["arguments"] += function["arguments"]


def assemble(
    *,
    endpoint: str,
    alias: str,
    validator: SSEValidator,
    state: StreamState,
    usage: dict[str, Any],
) -> dict[str, Any]:
    """The OpenAI JSON object for a non-streaming caller, from a validated stream."""
    common = {
        "id": validator.chunk_id,
        "created": validator.created,
        "model": alias,
        "system_fingerprint": "local",
    }
    if endpoint == "completions":
        return {
            **common,
            "object": "text_completion",
            "choices": [
                {
                    "index": 0,
                    "text": state.text(),
                    "logprobs": None,
                    "finish_reason": validator.finish_reason,
                }
            ],
            "usage": usage,
        }
    message: dict[str, Any] = {"role": "assistant", "content": state.text()}
    if state.tool_calls:
        message["tool_calls"] = [state.tool_calls[i] for i in sorted(state.tool_calls)]
        if not state.text_parts:
            message["content"] = None
    else:
        message["tool_calls"] = None
    if state.reasoning_parts:
        message["reasoning_content"] = "".join(state.reasoning_parts)
    return {
        **common,
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": validator.finish_reason,
                "logprobs": None,
            }
        ],
        "usage": usage,
    }
