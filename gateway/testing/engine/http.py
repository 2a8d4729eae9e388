"""A small HTTP/1.1 server connection on asyncio streams, parsed by httptools.

One :class:`Connection` per accepted socket: a reader task parses requests into
a bounded queue (head ≤ 64 KiB, body ≤ 50 MiB, at most a few pipelined) and
resolves ``gone`` when the peer closes or the socket fails, so a handler can
stop work the moment its caller leaves. Writers raise ``ConnectionError`` once
the peer is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import socket
from collections import deque
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

import httptools

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 50 * 1024 * 1024  # the server's DEFAULT_MAX_BODY_LIMIT
_MAX_QUEUED = 4
_READ_BYTES = 64 * 1024


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool
    refusal: tuple[int, str] | None = None  # a request the parser could not accept

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


@dataclass
class _Partial:
    url: bytearray = field(default_factory=bytearray)
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    head_bytes: int = 0


class _Callbacks:
    """httptools callbacks → complete :class:`Request` objects."""

    def __init__(self, queue: deque[Request]) -> None:
        self.queue = queue
        self.parser = httptools.HttpRequestParser(self)
        self.partial = _Partial()
        self.refusal: tuple[int, str] | None = None

    def on_message_begin(self) -> None:
        self.partial = _Partial()

    def on_url(self, url: bytes) -> None:
        self.partial.url += url
        self._grow(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        self.partial.headers.setdefault(key, value.decode("latin-1"))
        self._grow(len(name) + len(value))

    def on_headers_complete(self) -> None:
        declared = self.partial.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            self.refusal = (413, "request body too large")
            raise ValueError("declared body over limit")

    def on_body(self, body: bytes) -> None:
        if len(self.partial.body) + len(body) > MAX_BODY_BYTES:
            self.refusal = (413, "request body too large")
            raise ValueError("body over limit")
        self.partial.body += body

    def on_message_complete(self) -> None:
        self.queue.append(
            Request(
                method=self.parser.get_method().decode("latin-1"),
                target=self.partial.url.decode("latin-1"),
                headers=self.partial.headers,
                body=bytes(self.partial.body),
                keep_alive=bool(self.parser.should_keep_alive()),
            )
        )

    def _grow(self, size: int) -> None:
        self.partial.head_bytes += size
        if self.partial.head_bytes > MAX_HEAD_BYTES:
            self.refusal = (431, "request header fields too large")
            raise ValueError("head over limit")


class Connection:
    """One client connection (see the module docstring)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._queue: deque[Request] = deque()
        self._callbacks = _Callbacks(self._queue)
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._task = asyncio.create_task(self._read())

    async def next_request(self) -> Request | None:
        """The next request, or ``None`` once the peer has gone."""
        while not self._queue:
            if self.gone.done():
                return None
            self._arrived.clear()
            waiter: asyncio.Future[Any] = asyncio.ensure_future(self._arrived.wait())
            gone: asyncio.Future[Any] = self.gone
            await asyncio.wait({waiter, gone}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        request = self._queue.popleft()
        self._room.set()
        return request

    async def write(self, data: bytes) -> None:
        if self.gone.done():
            raise ConnectionResetError("the peer has gone")
        self._writer.write(data)
        await self._writer.drain()

    async def respond(
        self,
        status: int,
        headers: list[tuple[str, str]],
        body: bytes,
        *,
        keep_alive: bool,
    ) -> None:
        all_headers = [*headers, ("content-length", str(len(body)))]
        await self.write(head(status, all_headers, keep_alive=keep_alive) + body)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._resolve_gone()
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()

    async def _read(self) -> None:
        """Parse until EOF or a socket error (then ``gone``), or a refused request (not gone)."""
        try:
            while True:
                await self._room.wait()
                data = await self._reader.read(_READ_BYTES)
                if not data:
                    break
                try:
                    self._callbacks.parser.feed_data(data)
                except httptools.HttpParserError:
                    status, text = self._callbacks.refusal or (400, "Bad Request")
                    self._queue.append(Request("?", "", {}, b"", False, (status, text)))
                    self._arrived.set()
                    return
                except httptools.HttpParserUpgrade:
                    self._queue.append(Request("?", "", {}, b"", False, (400, "Bad Request")))
                    self._arrived.set()
                    return
                if self._queue:
                    self._arrived.set()
                if len(self._queue) >= _MAX_QUEUED:
                    self._room.clear()
        except (ConnectionError, OSError):
            pass
        self._resolve_gone()

    def _resolve_gone(self) -> None:
        if not self.gone.done():
            self.gone.set_result(None)


def head(status: int, headers: list[tuple[str, str]], *, keep_alive: bool) -> bytes:
    """A response head: status line, the headers, ``date``, and ``connection: close``."""
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}"]
    lines += [f"{name}: {value}" for name, value in headers]
    if not keep_alive:
        lines.append("connection: close")
    lines.append("date: " + formatdate(usegmt=True))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body."""
    return b"%x\r\n%b\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"
