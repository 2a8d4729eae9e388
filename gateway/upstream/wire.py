"""A lean HTTP/1.1 client for the worker's streamed responses (used only by upstream.py).

Theory of operation:

* One :class:`WireConnection` (an ``asyncio.Protocol``, parsed by
  ``httptools``) carries one exchange at a time. Body bytes are queued as they
  arrive, de-chunked and undecoded; reading pauses while more than
  ``_HIGH_WATER`` bytes wait for the consumer and resumes below
  ``_LOW_WATER``, so a slow caller bounds memory, not the worker.
* The head is capped at ``_MAX_HEAD_BYTES`` and ``_MAX_HEADERS`` lines. EOF is
  data: before the body's framed end it is a broken stream
  (:class:`WireError`); for a body framed "until close" it is the end.
* :class:`WirePool` bounds concurrent exchanges (a semaphore, waited on for at
  most the pool timeout) and keeps finished connections for reuse while they
  are open and younger than the keep-alive expiry. A connection goes back to
  the pool only when its response ended cleanly and allowed keep-alive.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from typing import Any, cast

import httptools

_MAX_HEAD_BYTES = 65_536
_MAX_HEADERS = 100
_HIGH_WATER = 1 << 20
_LOW_WATER = 1 << 18


class WireError(Exception):
    """The connection broke, timed out or spoke invalid HTTP/1.1."""


class WireConnectError(WireError):
    """No connection could be made (or no pool slot came free in time)."""


class WireProtocolError(WireError):
    """The worker spoke invalid HTTP/1.1, or a head over the size caps."""


class WireConnection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser: Any = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0  # bytes received before the head was complete
        self.header_bytes = 0  # header lines as parsed
        self.head_done = False
        self.protocol_error = False
        self.complete = False
        self.closed = False
        self.error: str | None = None
        self.keep_alive = False
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None

    # --------------------------------------------------------- asyncio side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.parser is None:
            self.error = "unexpected bytes"
            self._close()
            return
        if not self.head_done:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.protocol_error = True
            self.error = "invalid HTTP/1.1"
            self._close()
        if not self.head_done and self.head_bytes > _MAX_HEAD_BYTES and self.error is None:
            # httptools holds a header value whole until it ends: a head still
            # arriving is bounded by the bytes received, so an endless header
            # cannot grow memory past one read over the cap.
            self.protocol_error = True
            self.error = "head too large"
            self._close()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.parser is not None and not self.complete:
            if self.head_done and self._until_close():
                self.complete, self.keep_alive = True, False
            elif self.error is None:
                self.error = "connection closed"
        self._wake()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # ------------------------------------------------------ httptools side

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value) + 4
        if self.header_bytes > _MAX_HEAD_BYTES or len(self.headers) >= _MAX_HEADERS:
            raise httptools.HttpParserError("head too large")
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        # httptools hands a new bytes object per piece (``at[:length]``): kept as it is
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = bool(self.parser.should_keep_alive())

    # ------------------------------------------------------------ exchange

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def headers_named(self, name: bytes) -> list[bytes]:
        return [value for key, value in self.headers if key == name]

    def begin(self) -> None:
        """Start an exchange: reset the response state (before the first write)."""
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.headers, self.head_bytes, self.header_bytes = 0, [], 0, 0
        self.head_done = self.complete = self.keep_alive = self.protocol_error = False
        self.error = None

    async def write(self, data: bytes, write_timeout_s: float) -> None:
        """Write part of the request, waiting while the worker's socket is full:
        a body is produced piece by piece and never queued here whole."""
        if self.closed or self.transport is None:
            raise WireError(self.error or "connection closed")
        self.transport.write(data)
        if self._writable is not None:
            try:
                async with asyncio.timeout(write_timeout_s):
                    await self._writable
            except TimeoutError as exc:
                self._close()
                raise WireError("write timed out") from exc
        if self.closed and self.error is not None:
            raise WireError(self.error)

    async def send(self, request: bytes, write_timeout_s: float) -> None:
        """Start an exchange and write the whole request."""
        self.begin()
        await self.write(request, write_timeout_s)

    async def read_head(self) -> None:
        while not self.head_done:
            if self.error is not None:
                raise self._failure()
            await self._wait()

    def _failure(self) -> WireError:
        return WireProtocolError(self.error) if self.protocol_error else WireError(self.error)

    def take(self) -> bytes | None:
        """All body bytes queued so far, or None when none are."""
        chunks = self.chunks
        if not chunks:
            return None
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    async def wait_body(self) -> None:
        if self.error is not None and not self.complete:
            raise self._failure()
        await self._wait()

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and self.error is None

    def _until_close(self) -> bool:
        if self.header(b"transfer-encoding") is not None:
            return False
        return self.header(b"content-length") is None

    async def _wait(self) -> None:
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def close(self) -> None:
        # connection_lost comes a loop iteration later; until then it must not look reusable.
        self.keep_alive = False
        self._close()


class _Slots(asyncio.Semaphore):
    """asyncio's semaphore with a cheaper ``locked``: 3.11's builds a generator
    over its waiters on every call, twice per ``acquire`` (~3 % of a streamed
    request's CPU in issue 26's profile). Same answer, same state."""

    def locked(self) -> bool:
        if self._value == 0:
            return True
        waiters = self._waiters
        return waiters is not None and any(not w.cancelled() for w in waiters)


class WirePool:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_connections: int,
        connect_timeout_s: float,
        keepalive_expiry_s: float = 30.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.tls = tls
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_expiry_s = keepalive_expiry_s
        self._slots = _Slots(max_connections)
        self._idle: list[WireConnection] = []

    async def acquire(self) -> WireConnection:
        """A connection for one exchange; :meth:`release` it exactly once."""
        if self._slots.locked():
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    await self._slots.acquire()
            except TimeoutError as exc:
                raise WireConnectError("no pool slot") from exc
        else:
            await self._slots.acquire()  # free: returns at once, no timer needed
        try:
            now = time.monotonic()
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed and now - conn.idle_since < self.keepalive_expiry_s:
                    return conn
                conn.close()
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    WireConnection, self.host, self.port, ssl=self.tls
                )
            return conn
        except BaseException as exc:
            self._slots.release()
            if isinstance(exc, OSError | TimeoutError):
                raise WireConnectError("connect failed") from exc
            raise

    def release(self, conn: WireConnection) -> None:
        if conn.reusable() and not conn.chunks:
            conn.parser = None
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()
        self._slots.release()

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
