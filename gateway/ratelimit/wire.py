"""A lean Redis client for the limits store: pipelined RESP2 over asyncio.

Theory of operation
-------------------

The store needs four things from Redis: ``EVALSHA`` (falling back to
``SCRIPT LOAD``), pipelines of them, ``PING``, and a handshake (``AUTH``,
``SELECT``) on every new connection, over TCP or TLS. A general client
costs a request several times the round trip in CPU (``bench/README.md``),
so this one does only that, the way ``gateway/upstream/wire.py`` does for
the worker.

* A :class:`RedisConnection` is an ``asyncio.Protocol``: :meth:`send` writes
  a batch of encoded commands at once and returns one future per command;
  replies (``gateway.ratelimit.resp``) resolve the futures in order. A
  connection lost, or bytes that are not RESP2, fail every pending future
  with ``ConnectionError`` and close it.
* :class:`RedisWire` keeps at most ``max_connections`` in use (a semaphore)
  and reuses idle ones, newest first. :meth:`RedisWire.execute` takes one
  connection for one batch; only a batch whose every reply arrived gives its
  connection back. Anything else -- a cancellation, the caller's timeout, a
  broken connection -- closes it, synchronously, so a reply in flight can
  never reach the next caller. There are no timeouts in here: every store
  call runs inside its own ``asyncio.timeout`` (and a new connection inside
  ``connect_timeout_s``), and nothing here swallows a cancellation.
* Error replies are values (:class:`~gateway.ratelimit.resp.RespError`) in the
  batch's result; the handshake's are raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import Sequence
from typing import cast
from urllib.parse import unquote, urlsplit

from gateway.ratelimit.resp import Reply, ReplyParser, RespError, RespProtocolError, encode

__all__ = ["Command", "RedisConnection", "RedisWire"]

#: a command as its parts, or already encoded (``resp.encode``)
Command = Sequence[bytes | str | int | float] | bytes


class RedisConnection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = ReplyParser()
        self.waiting: deque[asyncio.Future[Reply]] = deque()
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed(data)
            while True:
                done, reply = self.parser.next_reply()
                if not done:
                    return
                if not self.waiting:
                    raise RespProtocolError("a reply nobody asked for")
                waiter = self.waiting.popleft()
                if not waiter.done():
                    waiter.set_result(reply)
        except RespProtocolError as exc:
            self._fail(exc)

    def eof_received(self) -> bool | None:
        with contextlib.suppress(RespProtocolError):
            self.parser.feed_eof()
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError(f"connection to Redis lost: {exc or 'closed by the server'}"))

    def _fail(self, exc: Exception) -> None:
        self.close()
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_exception(exc)

    def send(self, commands: Sequence[Command]) -> list[asyncio.Future[Reply]]:
        """Write ``commands`` in one go; one future per reply, in order."""
        if self.closed or self.transport is None:
            raise ConnectionError("connection to Redis closed")
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in commands]
        self.waiting.extend(futures)
        self.transport.write(
            b"".join([c if isinstance(c, bytes) else encode(*c) for c in commands])
        )
        return futures

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()  # nothing of ours is worth flushing


async def _replies(futures: list[asyncio.Future[Reply]]) -> list[Reply]:
    return [await future for future in futures]


class RedisWire:
    """Connections to one Redis; see the module docstring."""

    def __init__(
        self,
        host: str,
        port: int = 6379,
        *,
        username: str | None = None,
        password: str | None = None,
        db: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        connect_timeout_s: float = 1.0,
        max_connections: int = 64,
    ) -> None:
        if max_connections < 1 or connect_timeout_s <= 0:
            raise ValueError("max_connections and connect_timeout_s must be positive")
        self.host, self.port, self.db = host, port, db
        self._username, self._password = username, password
        self._ssl = ssl_context
        self._connect_timeout_s = connect_timeout_s
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[RedisConnection] = []
        self._closed = False

    @classmethod
    def from_url(cls, url: str, *, password: str | None = None, **kwargs: object) -> RedisWire:
        """``redis://[user@]host[:port][/db]`` or ``rediss://`` (TLS, system CAs)."""
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise ValueError("a redis:// or rediss:// URL with a host is required")
        db = int(parts.path.lstrip("/") or 0)
        context = ssl.create_default_context() if parts.scheme == "rediss" else None
        username = unquote(parts.username) if parts.username else None
        return cls(
            parts.hostname,
            parts.port or 6379,
            username=username,
            password=password,
            db=db,
            ssl_context=cast(ssl.SSLContext | None, kwargs.pop("ssl_context", context)),
            **kwargs,  # type: ignore[arg-type]
        )

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    async def execute(self, commands: Sequence[Command]) -> list[Reply]:
        """One pipelined batch on one connection; error replies are values."""
        async with self._slots:
            conn = self._take()
            if conn is None:
                conn = await self._connect()
            whole = False
            try:
                replies = await _replies(conn.send(commands))
                whole = True
                return replies
            finally:
                if whole and not conn.closed and not self._closed:
                    self._idle.append(conn)
                else:
                    conn.close()

    def _take(self) -> RedisConnection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        return None

    async def _connect(self) -> RedisConnection:
        if self._closed:
            raise ConnectionError("the Redis client is closed")
        loop = asyncio.get_running_loop()
        conn: RedisConnection | None = None
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    RedisConnection,
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                )
                handshake: list[Command] = []
                if self._password is not None:
                    who = () if self._username is None else (self._username,)
                    handshake.append(("AUTH", *who, self._password))
                if self.db:
                    handshake.append(("SELECT", self.db))
                if handshake:
                    for reply in await _replies(conn.send(handshake)):
                        if isinstance(reply, RespError):
                            raise reply
        except TimeoutError:
            if conn is not None:
                conn.close()
            raise TimeoutError(
                f"no connection to {self.host}:{self.port} within {self._connect_timeout_s} s"
            ) from None
        except (OSError, ssl.SSLError) as exc:
            if conn is not None:
                conn.close()
            if isinstance(exc, ConnectionError) and type(exc) is ConnectionError:
                raise
            raise ConnectionError(
                f"cannot connect to {self.host}:{self.port} ({type(exc).__name__}: {exc})"
            ) from exc
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        return conn

    async def aclose(self) -> None:
        """Close every idle connection now, and each one in use when it is given back."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()
