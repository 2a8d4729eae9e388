"""The listener's HTTP/1.1 protocol: uvicorn's httptools protocol plus the limits
a caller-facing server needs, which uvicorn does not apply with httptools.

Theory of operation (each limit closes one way a caller can hold the gateway):

- **Head deadline.** A request head must be complete within
  ``listen.header_timeout_s`` of its first byte, or of the connection for the
  first request (slowloris). A connection that sent nothing is closed
  silently; one that sent part of a head gets 408 ``request_timeout``. Idle
  kept-alive connections stay uvicorn's business (its keep-alive timeout).
- **Head size.** At most ``listen.max_header_bytes`` of request line and
  headers, checked as parsed and, for a head still arriving, as bytes come in
  (httptools buffers a header value whole before reporting it, so an endless
  header is counted by the bytes received; exact to within one read). Over
  it: 431 ``headers_too_large``.
- **HTTP/1.1 only.** HTTP/1.0 (and 0.9) would get a chunked SSE stream it
  cannot parse: 505 ``http_version_not_supported``. Upgrades (h2c,
  WebSocket) are refused with 400: nothing here speaks them.
- **Unread bodies.** After a response that did not read the whole request body
  (a 401, 413 …), the rest is drained for at most ``listen.body_timeout_s``,
  then the connection closes: a caller cannot trickle an unread body forever.
  (A body the app does read has its own deadline, ``limits.read_body``.)
- **Abort.** ``scope["extensions"]["gateway.abort"]`` closes the connection at
  once, for a caller that stopped reading its stream (see ``streaming.py``).
- Refusals are OpenAI-shaped JSON with ``connection: close``; a refusal that
  arrives while a response is already streaming just closes the connection.
  None echoes what the caller sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from http import HTTPStatus
from typing import Any, cast

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.asgi import ABORT_EXTENSION
from gateway.config import ListenConfig
from gateway.errors import GatewayError

log = logging.getLogger("gateway")


class _Refused(Exception):
    """Raised from a parser callback to stop parsing; the code is on the protocol."""


class LimitedHttpProtocol(HttpToolsProtocol):
    header_timeout_s = 10.0
    body_timeout_s = 30.0
    max_header_bytes = 32_768

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._received = 0  # bytes received while a head was incomplete
        self._head_size = 0  # request line and headers as parsed
        self._message_done = False
        self._timer: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._refusal: str | None = None
        self._refused = False

    # ------------------------------------------------------- asyncio side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            self._received += len(data)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._refuse(self._refusal or "invalid_request")
            return
        if self._in_head and self._received > self.max_header_bytes:
            self._refuse("headers_too_large")

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self._message_done and not self.transport.is_closing():
            self._linger = self.loop.call_later(self.body_timeout_s, self._close)

    # ------------------------------------------------------ parser side

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_size, self._message_done = True, 0, False
        if self._timer is None:
            self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._received = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.parser.get_http_version() != "1.1":
            self._stop("http_version_not_supported")
        if self.parser.should_upgrade():
            self._stop("invalid_request")
        # The scope dict is the one uvicorn hands the app.
        scope = cast(dict[str, Any], self.scope)
        scope.setdefault("extensions", {})[ABORT_EXTENSION] = self._abort
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._message_done = True
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        super().on_message_complete()

    # ------------------------------------------------------------ helpers

    def _count(self, size: int) -> None:
        self._head_size += size
        if self._head_size > self.max_header_bytes:
            self._stop("headers_too_large")

    def _stop(self, code: str) -> None:
        self._refusal = code
        raise _Refused(code)

    def _arm_head_timer(self) -> None:
        self._received = 0
        self._timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing() or not self._in_head:
            return
        if self._received == 0:
            self._close()  # nothing asked, nothing to answer
        else:
            self._refuse("request_timeout")

    def _refuse(self, code: str) -> None:
        self._refused = True
        self._cancel_timers()
        if self.transport.is_closing():
            return
        log.info("connection refused: %s", code)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and cycle.response_started:
            self._abort()  # mid-response: a second status line would corrupt the stream
            return
        self.transport.write(refusal_bytes(code))
        self.transport.close()

    def _abort(self) -> None:
        """Drop the connection now; the app's further sends are discarded."""
        cycle = self.cycle
        if cycle is not None:
            # As uvicorn's connection_lost does, but now: the app may return
            # before the transport reports the loss.
            cycle.disconnected = True
            cycle.message_event.set()
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

    def _cancel_timers(self) -> None:
        for timer in (self._timer, self._linger):
            if timer is not None:
                timer.cancel()
        self._timer = self._linger = None


def refusal_bytes(code: str) -> bytes:
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
