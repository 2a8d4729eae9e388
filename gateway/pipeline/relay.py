"""Pump one worker answer through its dialect to the caller. Knows no endpoint.

Theory of operation:

- Bytes are read from the worker as they arrive, hashed (``stream_sha256``)
  and fed to the dialect's sans-I/O source (an SSE validator, or a JSON body).
  Every frame the dialect releases in one read is re-emitted as one body
  message, so a caller sees each event as soon as it is validated; each
  applies the caller's backpressure to the worker's stream. After the head,
  a listener's :class:`~gateway.types.BodyWriter` (when it offers one) writes
  them to the connection directly: the same chunk, without an ASGI message
  and two wrappers per read; a full caller buffer is awaited first, as
  ``send`` awaits it. The head, the terminator and an error frame always go
  through ``send``.
- Response headers go out with the first valid event (a keep-alive counts).
  Before that, any failure propagates as a :class:`GatewayError` and becomes an
  ordinary HTTP error; after it, the stream ends with the dialect's one error
  frame and no terminator (spec §8, §12). The terminator is sent only after
  the source has seen the worker's body end right after its own.
- One deadline covers the whole read: first-event timeout until the first
  event, then the idle timeout after every event, never past the total. A
  send to the caller that outlasts it means the caller stopped reading
  (:class:`~gateway.pipeline.cancel.CallerStalled`), not a worker timeout.
- :meth:`Relay.stream_to` returns once the answer has ended validly, before
  the terminator: what the caller may use next (a Responses id) is recorded
  first, then :meth:`Relay.end` sends it. A non-streaming caller
  (:meth:`Relay.collect`) gets nothing until the answer is complete, then
  :meth:`Relay.reply` sends the dialect's assembled answer (JSON, or a body
  already in pieces: images, audio). The relay never calls back into the
  pipeline; only it writes its own state.
- ``on_head`` (audio answers) gets the worker's ``Content-Type`` once the
  response is open, before any of its bytes.
- An agentic answer (spec §22) has an :class:`Actor` (``agents.py``): every
  item is shown to it, and when it needs I/O before the next one (an
  approval's decision, a file to keep) the relay stops reading, sends what it
  has, and awaits the actor with the idle and total timers paused (§24); the
  worker itself waits for the decision.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.apis.base import ACT, CONTENT, DONE, PROGRESSED, Dialect, pump
from gateway.core.errors import GatewayError
from gateway.core.replies import Pieces, send_json, send_pieces
from gateway.pipeline.cancel import CallerStalled
from gateway.pipeline.deadline import Deadline
from gateway.types import BodyWriter, Send
from gateway.upstream.base import WorkerStream

Opener = Callable[[], Awaitable[WorkerStream]]
#: frames sent to the caller now (a stream), from inside the actor
Emit = Callable[[list[bytes]], Awaitable[None]]
#: how far the deadline moves while the actor works (its own bounds apply)
_PAUSED_S = 86_400.0


class Actor(Protocol):
    """What an agentic answer's run does between two items (``agents.AgentRun``)."""

    def note(self, item: Any) -> bool:
        """Every item read; True when :meth:`act` must run before the next one."""
        ...

    async def act(self, emit: Emit | None) -> list[bytes]: ...


def _within(seconds: float) -> Deadline:
    """``asyncio.timeout(seconds)`` at a third of its cost (one timer handle)."""
    return Deadline(asyncio.get_running_loop().time() + seconds)


@dataclass(frozen=True, slots=True)
class Timeouts:
    first_event_s: float
    idle_s: float
    total_s: float


@dataclass(slots=True)
class RelayState:
    """What the pump observed; read by the request's ``finally``."""

    headers_sent: bool = False
    #: the last body message (terminator, answer or error frame) was handed over
    finished: bool = False
    #: the answer's valid end reached the caller (terminator or assembled answer)
    completed: bool = False
    first_content_at: float | None = None
    hasher: Any = field(default_factory=hashlib.sha256)


class Relay:
    def __init__(
        self,
        dialect: Dialect,
        *,
        timeouts: Timeouts,
        response_headers: list[tuple[bytes, bytes]],
        abort: Callable[[], None] | None = None,
        on_head: Callable[[bytes], None] | None = None,
        actor: Actor | None = None,
        body_writer: BodyWriter | None = None,
    ) -> None:
        self.dialect = dialect
        self.body_writer = body_writer
        self.actor = actor
        self._acting = False
        self.timeouts = timeouts
        self.response_headers = response_headers
        self.abort = abort
        self.on_head = on_head
        self.state = RelayState()
        self.upstream: WorkerStream | None = None
        self._total_at = 0.0
        self._sending = False

    @property
    def stream_sha256(self) -> str | None:
        """SHA-256 of the de-chunked bytes the worker sent (None before any)."""
        return self.state.hasher.hexdigest() if self.dialect.source.bytes_received else None

    async def stream_to(self, open_stream: Opener, send: Send) -> None:
        """Re-stream to an ASGI ``send`` up to the answer's valid end (the
        terminator is :meth:`end`'s); on failure after headers, end with an
        error frame."""
        try:
            await self._pump(open_stream, send)
        except GatewayError as exc:
            if not self.state.headers_sent:
                raise
            await self.end_with_error(send, exc, self.timeouts.idle_s)
            raise

    async def collect(self, open_stream: Opener) -> None:
        """Run the pump without a caller stream (non-streaming callers)."""
        await self._pump(open_stream, None)

    async def end(self, send: Send) -> None:
        """The terminator, after :meth:`stream_to` returned. A caller that does
        not take it within the idle timeout stopped reading."""
        try:
            async with _within(self.timeouts.idle_s):
                await send({"type": "http.response.body", "body": self.dialect.terminal_frame})
        except TimeoutError as exc:
            raise CallerStalled from exc
        self.state.finished = self.state.completed = True

    async def reply(self, send: Send, answer: Any, headers: Mapping[str, str]) -> None:
        """A collected answer as one reply (non-streaming callers): JSON, or its pieces."""
        if isinstance(answer, Pieces):
            await send_pieces(send, 200, answer, headers)
        else:
            await send_json(send, 200, answer, headers)
        self.state.finished = self.state.completed = True

    async def end_with_error(self, send: Send, exc: GatewayError, timeout_s: float) -> None:
        """After headers: the one final error frame (no terminator). A caller that
        stopped reading would block this send for good: past ``timeout_s`` its
        connection is dropped instead."""
        self.state.finished = True
        frame = self.dialect.error_frame(exc)
        try:
            async with _within(timeout_s):
                await send({"type": "http.response.body", "body": frame})
        except TimeoutError:
            if self.abort is not None:
                self.abort()

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
        self._total_at = start + self.timeouts.total_s
        source = self.dialect.source
        hasher = self.state.hasher
        try:
            first = min(start + self.timeouts.first_event_s, self._total_at)
            # First looked at when the idle deadline after an event would fall:
            # the first event's move is then a float store (deadline.py).
            async with Deadline(first, first_check=start + self.timeouts.idle_s) as deadline:
                # The first-event deadline covers connecting and the response head too.
                upstream = self.upstream = await open_stream()
                if self.on_head is not None:
                    self.on_head(upstream.content_type)
                async for raw in upstream:
                    hasher.update(raw)
                    source.receive_data(raw)
                    out: list[bytes] = []
                    try:
                        progressed = self._drain(out, send is not None)
                    except GatewayError:
                        # Events validated before the bad one still reach the caller,
                        # however the worker's bytes were split into reads.
                        if send is not None and out:
                            await self._send_body(send, out)
                        raise
                    if progressed:
                        deadline.move_to(min(loop.time() + self.timeouts.idle_s, self._total_at))
                    if send is not None and out:
                        writer = self.body_writer
                        if writer is not None and self.state.headers_sent and not writer.paused:
                            # The common case, without a coroutine per read: what
                            # _send_body does once the head is out and nothing waits.
                            writer.write(b"".join(out))
                        else:
                            await self._send_body(send, out)
                    if self._acting:
                        await self._events(send, deadline)
                source.receive_data(b"")
                if not await self._events(send, deadline, at_eof=True):
                    raise GatewayError("upstream_protocol_error")
        except TimeoutError as exc:
            if self._sending:
                # Blocked on the caller, not the worker: the caller stopped reading.
                raise CallerStalled from exc
            raise GatewayError("upstream_timeout") from exc

    async def _events(self, send: Send | None, deadline: Deadline, *, at_eof: bool = False) -> bool:
        """The actor's pending work, then every event buffered after it (at EOF:
        every event left); as :meth:`_drain`, whether any completed (at EOF:
        whether the answer ended validly)."""
        result = False
        while True:
            if self._acting:
                self._acting = False
                await self._act(send, deadline)
            out: list[bytes] = []
            try:
                result = self._drain(out, send is not None, at_eof=at_eof)
            except GatewayError:
                if send is not None and out:
                    await self._send_body(send, out)
                raise
            if result and not at_eof:
                loop = asyncio.get_running_loop()
                deadline.move_to(min(loop.time() + self.timeouts.idle_s, self._total_at))
            if send is not None and out:
                await self._send_body(send, out)
            if not self._acting:
                return result

    async def _act(self, send: Send | None, deadline: Deadline) -> None:
        """The actor's work, with the idle and total timers paused (spec §24)."""
        actor = self.actor
        assert actor is not None
        loop = asyncio.get_running_loop()
        paused = loop.time()
        deadline.move_to(paused + _PAUSED_S)

        async def emit(frames: list[bytes]) -> None:
            assert send is not None
            await self._send_body(send, frames)

        frames = await actor.act(emit if send is not None else None)
        now = loop.time()
        self._total_at += now - paused
        deadline.move_to(min(now + self.timeouts.idle_s, self._total_at))
        if send is not None and frames:
            await self._send_body(send, frames)

    def _drain(self, out: list[bytes], streaming: bool, *, at_eof: bool = False) -> bool:
        """Append the frames for every event now available (the loop over them
        is ``apis.base.pump``, compiled with the core). Returns whether any
        event completed (before EOF) or whether the answer ended validly (at EOF)."""
        progressed = False
        note = None if self.actor is None else self.actor.note
        while True:
            watch = self.state.first_content_at is None
            status = pump(self.dialect, out, streaming, watch, note)
            if status & CONTENT:
                self.state.first_content_at = time.monotonic()
            if status & DONE:
                return True
            progressed = progressed or bool(status & PROGRESSED)
            if status & ACT:
                self._acting = True
            elif status & CONTENT:
                continue
            return progressed and not at_eof

    async def _send_body(self, send: Send, frames: list[bytes]) -> None:
        if not self.state.headers_sent:
            self.state.headers_sent = True
            await self._send(
                send,
                {"type": "http.response.start", "status": 200, "headers": self.response_headers},
            )
            if self.body_writer is not None and not self.body_writer.ready():
                self.body_writer = None  # not a chunked stream after all: send throughout
        body = b"".join(frames)
        writer = self.body_writer
        if writer is None:
            await self._send(send, {"type": "http.response.body", "body": body, "more_body": True})
            return
        if writer.paused:
            # As send does: the caller's buffer drains before more is written.
            self._sending = True
            await writer.drain()
            self._sending = False
        writer.write(body)

    async def _send(self, send: Send, message: dict[str, Any]) -> None:
        # Left True when the send is cancelled: the deadline then knows whom it cut.
        self._sending = True
        await send(message)
        self._sending = False
