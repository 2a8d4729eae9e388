"""The listener's HTTP/1.1 protocol: uvicorn's httptools protocol plus the limits
a caller-facing server needs, which uvicorn does not apply with httptools.

Theory of operation (each limit closes one way a caller can hold the gateway):

- **Head deadline.** A request head must be complete within
  ``listen.header_timeout_s`` of the first byte after the previous message
  (blank lines included), or of the connection for the first request
  (slowloris). A connection that sent nothing (or only blank lines) is closed
  silently; one that sent part of a head gets 408 ``request_timeout``. While
  an earlier request on the connection is still being answered, the next
  head's deadline waits. Idle kept-alive connections stay uvicorn's business
  (its keep-alive timeout, restarted after a drained body too).
- **Head size.** At most ``listen.max_header_bytes`` of request line and
  headers, checked as parsed and, for a head still arriving, as bytes come in
  (httptools buffers a header value whole before reporting it, so an endless
  header is counted by the bytes received; exact to within one read). The
  same cap bounds what a body may carry besides body bytes (chunk-size lines,
  extensions, trailers). Over it: 431 ``headers_too_large``.
- **Header count.** At most :attr:`LimitedHttpProtocol.max_header_fields`
  (100, spec §21) fields in a message (trailers count too), counted as the
  parser reports them: the next one is 431 ``headers_too_large`` before
  uvicorn stores it, so a head of thousands of tiny fields (within the byte
  cap) costs a hundred parser callbacks, not a scope the app then scans
  (authentication, request ids, tracing) field by field.
- **HTTP/1.1 only.** HTTP/1.0 (and 0.9) would get a chunked SSE stream it
  cannot parse: 505 ``http_version_not_supported``. Upgrades (h2c,
  WebSocket) are refused with 400: nothing here speaks them.
- **Unread bodies.** After a response that did not read the whole request body
  (a 401, 413 …), the rest is drained for at most ``listen.body_timeout_s``,
  then the connection closes: a caller cannot trickle an unread body forever.
  (A body the app does read has its own deadline, ``limits.read_body``.)
- **Abort.** ``scope["extensions"]["gateway.abort"]`` closes the connection at
  once, for a caller that stopped reading its stream (see ``streaming.py``).
- **Body frames.** ``scope["extensions"]["gateway.body"]`` writes a streamed
  response's body frames to the connection directly (``bodywriter.py``).
- **Disconnects.** ``scope["extensions"]["gateway.disconnect"]`` is
  ``watch(callback) -> stop``: ``callback`` runs (on the next loop turn) once
  the request's ``receive`` would answer ``http.disconnect`` -- the caller gone,
  the connection refused or aborted, or the response complete -- unless
  ``stop`` was called first. It is what a task looping on ``receive`` until
  ``http.disconnect`` does (``watch_disconnect``), without the task, the
  coroutine and the wake-ups per request; like that task's first
  ``receive``, it resumes reading the connection.
- Refusals are OpenAI-shaped JSON with ``connection: close``. A refusal for
  a request's own body (bad framing, oversized trailers) answers it if the
  app has not answered yet (the app's reply is then discarded). Otherwise,
  while a request on the connection is unanswered or streaming, a refusal
  (say, for a pipelined request behind it) resets the connection: a status
  line then would answer the wrong request. None echoes what the caller sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import struct
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, cast

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.config import ListenConfig
from gateway.core.errors import ErrorCode, GatewayError
from gateway.http.asgi import ABORT_EXTENSION, DISCONNECT_EXTENSION
from gateway.http.bodywriter import BODY_EXTENSION, BodyWriter
from gateway.http.cork import CorkedTransport
from gateway.observe.metrics import UNKNOWN_TENANT

log = logging.getLogger("gateway")


class _Refused(Exception):
    """Raised from a parser callback to stop parsing; the code is on the protocol."""


class LimitedHttpProtocol(HttpToolsProtocol):
    header_timeout_s = 10.0
    body_timeout_s = 30.0
    max_header_bytes = 32_768
    #: a fixed bound of the spec (§21), not a config key: no client needs more
    max_header_fields = 100

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fields = 0  # header (and trailer) fields of this message so far
        self._in_body = False  # a head is complete, its message is not
        self._begun = False  # a message has begun and its head is not complete
        self._received = 0  # bytes received towards the next head
        self._since_body = 0  # bytes received in a body since the last body bytes
        self._head_size = 0  # request line and headers as parsed
        self._message_done = True
        self._timer: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._refusal: ErrorCode | None = None
        self._refused = False
        # gateway.disconnect: cycle -> [its callback, the call scheduled for it]
        self._watches: dict[Any, list[Any]] = {}

    # ------------------------------------------------------- asyncio side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # One send per loop turn, not per ASGI message (gateway/http/cork.py).
        corked = CorkedTransport(cast(asyncio.Transport, transport), self.loop)
        super().connection_made(corked)  # type: ignore[arg-type]
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)
        self._wake()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_body:
            self._since_body += len(data)
        else:
            # Between messages or inside a head. Counted before parsing: a read
            # that also holds the end of a pipelined body is not counted (so
            # the bound is exact to within one read).
            self._received += len(data)
            if self._timer is None:
                # Any byte after a message (a head, or only CRLFs) starts the
                # clock for the next head; uvicorn's keep-alive timer stops here.
                self._arm_head_timer()
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._refuse(self._refusal or "invalid_request")
            return
        if self._in_body:
            # Bytes in a body that are not body bytes: chunk-size lines,
            # extensions and trailers, which httptools buffers whole.
            if self._since_body > self.max_header_bytes:
                self._refuse("headers_too_large")
        elif self._received > self.max_header_bytes:
            self._refuse("headers_too_large")

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._wake()
        if not self._message_done and not self.transport.is_closing():
            self._linger = self.loop.call_later(self.body_timeout_s, self._close)

    # ------------------------------------------------------ parser side

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begun, self._head_size, self._message_done = True, 0, False
        self._fields = 0
        if self._timer is None:
            self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields += 1
        if self._fields > self.max_header_fields:
            self._stop("headers_too_large")
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_body, self._begun = True, False
        self._received = self._since_body = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.parser.get_http_version() != "1.1":
            self._stop("http_version_not_supported")
        if self.parser.should_upgrade():
            self._stop("invalid_request")
        super().on_headers_complete()
        # This request's own cycle (a pipelined one may follow before it ends);
        # the app's task starts on a later loop turn, after this is in place.
        scope = cast(dict[str, Any], self.scope)
        extensions = scope.setdefault("extensions", {})
        extensions[ABORT_EXTENSION] = functools.partial(self._abort, self.cycle)
        extensions[BODY_EXTENSION] = BodyWriter(self.cycle)
        extensions[DISCONNECT_EXTENSION] = functools.partial(self._watch, self.cycle)

    def on_body(self, body: bytes) -> None:
        self._since_body = 0
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_body, self._message_done = False, True
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        super().on_message_complete()
        cycle = self.cycle
        if (
            cycle is not None
            and cycle.response_complete
            and self.timeout_keep_alive_task is None
            and not self.transport.is_closing()
        ):
            # The response went out before the body ended (a refusal) and the
            # body's bytes stopped uvicorn's keep-alive timer: start it again.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    # ------------------------------------------------------------ helpers

    def _count(self, size: int) -> None:
        self._head_size += size
        if self._head_size > self.max_header_bytes:
            self._stop("headers_too_large")

    def _stop(self, code: ErrorCode) -> None:
        self._refusal = code
        raise _Refused(code)

    def _arm_head_timer(self) -> None:
        self._timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._in_body:
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # The request before is still being answered (bounded by its own
            # limits); the next head's deadline waits for it.
            self._arm_head_timer()
            return
        if self._begun:
            self._refuse("request_timeout")
        else:
            self._close()  # nothing (or only blank lines) asked, nothing to answer

    def _refuse(self, code: ErrorCode) -> None:
        self._refused = True
        self._cancel_timers()
        if self.transport.is_closing():
            return
        log.debug("connection refused: %s", code)
        self._count_refusal(code)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if not (self._in_body and not cycle.response_started):
                # The fault is a pipelined request's, or this response is
                # already under way: a status line now would answer the wrong
                # request or corrupt this one. Drop the connection instead.
                self._abort(cycle)
                return
            # This request's own body is at fault and nothing has been answered:
            # answer it here; the app's own reply is discarded.
            cycle.disconnected = True
            cycle.message_event.set()
            self._wake()
        self.transport.write(refusal_bytes(code))
        self.transport.close()

    def _count_refusal(self, code: str) -> None:
        # gateway_rejections_total{tenant="-"}: hostile traffic shows up on the
        # dashboard, not only in a debug log.
        app = self.app
        for _ in range(4):  # past uvicorn's own wrappers (proxy headers, trace logging)
            if hasattr(app, "state") or not hasattr(app, "app"):
                break
            app = app.app
        runtime = getattr(getattr(app, "state", None), "runtime", None)
        if runtime is not None:
            metrics = runtime.metrics
            metrics.child(metrics.rejections, UNKNOWN_TENANT, code).inc()

    def _abort(self, cycle: Any = None) -> None:
        """Drop the connection now; ``cycle``'s further sends are discarded."""
        if cycle is not None:
            # As uvicorn's connection_lost does, but now: the app may return
            # before the transport reports the loss.
            cycle.disconnected = True
            cycle.message_event.set()
            self._wake()
        if not self.transport.is_closing():
            sock = self.transport.get_extra_info("socket")
            with contextlib.suppress(AttributeError, OSError):
                # Linger 0: a reset, so the kernel drops what the caller never
                # read instead of trickling it out after we let go.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.transport.abort()

    def _close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    # ---------------------------------------------- gateway.disconnect

    def _watch(self, cycle: Any, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` on a later loop turn once ``cycle``'s ``receive``
        would answer ``http.disconnect``; the returned function stops watching.
        Each request's cycle has its own watch (a pipelined request may start
        while the one before it is still finishing)."""
        entry: list[Any] = [callback, None]
        self._watches[cycle] = entry
        if not (cycle.disconnected or cycle.response_complete):
            # What receive() does before it waits.
            self.flow.resume_reading()
        self._wake()
        return functools.partial(self._unwatch, cycle, entry)

    def _unwatch(self, cycle: Any, entry: list[Any]) -> None:
        if self._watches.get(cycle) is entry:
            del self._watches[cycle]
            if entry[1] is not None:
                entry[1].cancel()

    def _wake(self) -> None:
        for cycle, entry in self._watches.items():
            if entry[1] is None and (cycle.disconnected or cycle.response_complete):
                # On the next turn, as the watching task would have run.
                entry[1] = self.loop.call_soon(self._went, cycle, entry)

    def _went(self, cycle: Any, entry: list[Any]) -> None:
        if self._watches.get(cycle) is entry:
            del self._watches[cycle]
            entry[0]()

    def _cancel_timers(self) -> None:
        for timer in (self._timer, self._linger):
            if timer is not None:
                timer.cancel()
        self._timer = self._linger = None


def refusal_bytes(code: ErrorCode) -> bytes:
    """A complete HTTP/1.1 response for a refusal before any app ran."""
    error = GatewayError(code)
    body = orjson.dumps(error.body())
    status = HTTPStatus(error.status)
    head = (
        f"HTTP/1.1 {status.value} {status.phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def protocol_class(listen: ListenConfig) -> type[LimitedHttpProtocol]:
    """The protocol class for uvicorn's ``http=``, with this listener's limits."""
    return type(
        "GatewayHttpProtocol",
        (LimitedHttpProtocol,),
        {
            "header_timeout_s": listen.header_timeout_s,
            "body_timeout_s": listen.body_timeout_s,
            "max_header_bytes": listen.max_header_bytes,
        },
    )
