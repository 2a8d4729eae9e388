"""The only place that talks to the worker over HTTP.

:class:`Upstream` sends a rewritten inference body and returns an open
:class:`UpstreamStream` once the worker's response head has been checked, or
raises a :class:`GatewayError` classified per spec §12 ("before the first
byte"). It also serves the readiness poll. Only a fixed set of headers is ever
sent: the caller's credentials and hop-by-hop headers never leave the
gateway, redirects are never followed and no content decoding is accepted.

Inference streams go through :mod:`gateway.upstream.wire` (raw asyncio +
httptools, a kept-alive pool): the profile showed httpx/httpcore spending
more CPU per request and per chunk than the rest of the gateway together.
The small exchanges (the readiness poll, the model listing, the worker's
metrics, a kept response's lookup) go through a pool of their own, so a
full inference pool never delays a readiness answer; httpx is not imported
by a serving gateway (~5-7 MB of its RSS, issue 35).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import orjson

from gateway.config import UpstreamConfig
from gateway.core.errors import GatewayError
from gateway.upstream.base import Accept, Rejection
from gateway.upstream.wire import (
    WireConnectError,
    WireConnection,
    WireError,
    WirePool,
    WireProtocolError,
)

_ACCEPT: dict[str, bytes] = {
    "sse": b"text/event-stream",
    "json": b"application/json",
    "audio": b"audio/wav, audio/pcm",
}
#: the media types each exchange accepts (an audio body's is compared whole)
_CONTENT_TYPES: dict[str, tuple[bytes, ...]] = {
    "sse": (b"text/event-stream",),
    "json": (b"application/json",),
    "audio": (b"audio/wav", b"audio/pcm"),
}
#: how much of a worker's 4xx body is read for its message (``rejection="relayed"``)
_REJECTION_BYTES = 16_384
#: the longest worker message a caller is shown (spec §24)
_REJECTION_CHARS = 200


_MAX_LISTING_BYTES = 1_048_576
#: connections of the small exchanges' own pool (readiness, listing, metrics)
_SMALL_POOL = 4
#: what one write to the worker may join (the request head and body pieces)
_COALESCE_BYTES = 65_536


class _BadBody(Exception):
    """A small JSON answer over its bound, or in a content coding."""


class _Unreachable(Exception):
    """Nothing accepted the connection (refused, or no slot of the pool)."""


class _Broken(Exception):
    """The exchange failed after connecting (reset, malformed, cut short)."""


class MetricsUnreadable(Exception):
    """The worker's metrics could not be read whole in time (slow, huge, cut)."""


class WorkerGone(MetricsUnreadable):
    """Nothing listens at the worker's address: its process, and what it ran, is gone."""


class ListingError(Exception):
    """The models listing failed; ``reason`` is a readiness reason word (spec §16)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UpstreamStream:
    """An open worker response whose head passed the checks
    (:class:`~gateway.upstream.base.WorkerStream` over the wire pool)."""

    def __init__(self, conn: WireConnection, pool: WirePool) -> None:
        self._conn: WireConnection | None = conn
        self._pool = pool
        self._content_type = conn.header(b"content-type") or b""

    @property
    def closed(self) -> bool:
        # True once the body has been read to its end (or the stream was closed).
        return self._conn is None

    @property
    def content_type(self) -> bytes:
        return self._content_type

    def __aiter__(self) -> AsyncIterator[bytes]:
        """De-chunked but undecoded bytes, exactly what the worker sent."""
        return self

    async def __anext__(self) -> bytes:
        conn = self._conn
        if conn is None:
            raise StopAsyncIteration
        while True:
            data = conn.take()
            if data is not None:
                return data
            if conn.complete:
                self._release(conn)
                raise StopAsyncIteration
            try:
                await conn.wait_body()
            except WireProtocolError as exc:
                raise GatewayError("upstream_protocol_error") from exc
            except WireError as exc:
                # The worker's connection broke (reset, truncated chunked body).
                raise GatewayError("upstream_unavailable") from exc

    def _release(self, conn: WireConnection) -> None:
        self._conn = None
        self._pool.release(conn)

    def close(self) -> None:
        """Drop the connection (the rest of the body is never read); synchronous,
        so that a request's cleanup has nothing to await."""
        conn = self._conn
        if conn is not None:
            conn.close()
            self._release(conn)


class Upstream:
    """:class:`~gateway.upstream.base.WorkerTransport` over HTTP/1.1."""

    def __init__(
        self,
        config: UpstreamConfig,
        *,
        pool_size: int = 32,
    ) -> None:
        self.config = config
        parts = urlsplit(config.base_url)
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._authority = parts.netloc.encode("ascii")
        self._pool_size = pool_size
        self._pool: WirePool | None = None
        self._small: WirePool | None = None
        self._closed = False
        # Per-read timeouts are the stream pump's job (first event, idle,
        # total); the pool only bounds connecting and writing.
        self._write_timeout_s = config.connect_timeout_s * 5

    @property
    def pool(self) -> WirePool:
        if self._pool is None:  # built on the serving loop, on first use
            self._pool = self._new_pool(self._pool_size)
        return self._pool

    @property
    def small_pool(self) -> WirePool:
        """The small exchanges' own few connections (readiness, listing, metrics)."""
        if self._small is None:
            self._small = self._new_pool(_SMALL_POOL)
        return self._small

    def _new_pool(self, size: int) -> WirePool:
        return WirePool(
            self._host,
            self.config.port,
            max_connections=size,
            connect_timeout_s=self.config.connect_timeout_s,
            keepalive_expiry_s=30,
            tls=ssl.create_default_context() if self._tls else None,
        )

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        self._closed = True
        for pool in (self._pool, self._small):
            if pool is not None:
                pool.close()

    async def open_stream(
        self,
        path: str,
        body: bytes | AsyncIterator[bytes],
        request_id: str,
        *,
        size: int | None = None,
        accept: Accept = "sse",
        traceparent: bytes | None = None,
        rejection: Rejection = "classified",
    ) -> UpstreamStream:
        """Send one request and return its checked response.

        ``body`` is the whole body, or its pieces with their total ``size``
        (sent as ``Content-Length``: the worker accepts either framing, and a
        known length is the plainest for every HTTP/1.1 server). A piece that
        fails to come (``GatewayError`` from the producer) closes the connection
        before the body is complete, so the worker never runs it.
        ``traceparent`` is the gateway's own span's (hex digits and dashes from
        the tracer, never a caller's header). With ``rejection="relayed"`` a 4xx
        is ``invalid_request`` carrying the worker's message (its first
        :data:`_REJECTION_BYTES` bytes read, cut to :data:`_REJECTION_CHARS`).
        """
        if isinstance(body, bytes):
            size, pieces = len(body), _once(body)
        else:
            if size is None:
                raise ValueError("a body in pieces needs its size")
            pieces = body
        head = (
            b"POST %b HTTP/1.1\r\nhost: %b\r\ncontent-type: application/json\r\n"
            b"accept: %b\r\naccept-encoding: identity\r\n"
            b"x-request-id: %b\r\n%bcontent-length: %d\r\n\r\n"
            % (
                path.encode("ascii"),
                self._authority,
                _ACCEPT[accept],
                request_id.encode("ascii"),
                b"traceparent: %b\r\n" % traceparent if traceparent else b"",
                size,
            )
        )
        pool = self.pool
        try:
            conn = await pool.acquire()
        except WireConnectError as exc:
            raise GatewayError("upstream_unavailable", outcome="upstream_error") from exc
        try:
            conn.begin()
            # Pieces are joined up to _COALESCE_BYTES before a write: a plain
            # body and its head go in one send (one syscall, one segment), and
            # media pieces stay bounded in memory.
            pending = head
            try:
                async for piece in pieces:
                    if len(pending) + len(piece) > _COALESCE_BYTES:
                        await conn.write(pending, self._write_timeout_s)
                        pending = piece
                    else:
                        pending += piece
                await conn.write(pending, self._write_timeout_s)
            except WireError:
                # A worker may answer (413) and close before the body is all sent.
                if not conn.head_done:
                    raise
            await conn.read_head()
            if rejection == "relayed" and 400 <= conn.status < 500:
                raise await _relayed_rejection(conn)
            _check_head(conn, request_id, accept)
        except BaseException as exc:
            conn.close()
            pool.release(conn)
            if isinstance(exc, WireProtocolError):
                raise GatewayError("upstream_protocol_error") from exc
            if isinstance(exc, WireError):
                raise GatewayError("upstream_unavailable") from exc
            raise
        return UpstreamStream(conn, pool)

    async def get_models(self, timeout_s: float) -> Any:
        """The worker's ``/v1/models`` listing; :class:`ListingError` says why not."""
        try:
            status, content = await self._small_json(
                "GET", "/v1/models", None, timeout_s, _MAX_LISTING_BYTES
            )
        except _Unreachable as exc:
            raise ListingError("connection_refused") from exc
        except TimeoutError as exc:
            raise ListingError("timeout") from exc
        except _Broken as exc:
            raise ListingError("http_error") from exc
        except _BadBody as exc:
            raise ListingError("bad_body") from exc
        if status != 200:
            raise ListingError("http_error")
        try:
            return orjson.loads(content)
        except orjson.JSONDecodeError as exc:
            raise ListingError("bad_body") from exc

    async def request_json(
        self, method: str, path: str, request_id: str, timeout_s: float
    ) -> tuple[int, Any]:
        """A small JSON exchange (``GET``/``DELETE /v1/responses/{id}``): the status
        and the parsed body (None when it is not JSON), bounded in size and time;
        failures to reach the worker are ``upstream_unavailable``/``upstream_timeout``."""
        try:
            status, content = await self._small_json(
                method, path, request_id, timeout_s, self.config.max_line_bytes
            )
        except TimeoutError as exc:
            raise GatewayError("upstream_timeout") from exc
        except (_Unreachable, _Broken) as exc:
            raise GatewayError("upstream_unavailable", outcome="upstream_error") from exc
        except _BadBody as exc:
            raise GatewayError("upstream_protocol_error") from exc
        try:
            body = orjson.loads(content) if content else None
        except orjson.JSONDecodeError:
            body = None
        return status, body

    async def post_json(
        self, path: str, body: Any, request_id: str, timeout_s: float
    ) -> tuple[int, Any]:
        """A small JSON POST (an approval's decision, spec §22) over the
        inference pool (one per tool round, waiting for a slot like the round
        it belongs to): 200 and the parsed answer (None when not JSON), or the
        refusal's 400 / 500 class with no body; bounded in bytes and time."""
        try:
            async with asyncio.timeout(timeout_s):
                stream = await self.open_stream(path, orjson.dumps(body), request_id, accept="json")
                try:
                    content = b""
                    async for piece in stream:
                        content += piece
                        if len(content) > _MAX_LISTING_BYTES:
                            raise GatewayError("upstream_protocol_error")
                finally:
                    stream.close()
        except TimeoutError as exc:
            raise GatewayError("upstream_timeout") from exc
        except GatewayError as exc:
            if exc.code == "upstream_rejected":
                return 400, None
            if exc.code == "upstream_error":
                return 500, None
            raise
        try:
            return 200, orjson.loads(content) if content else None
        except orjson.JSONDecodeError:
            return 200, None

    async def get_metrics(self, path: str, timeout_s: float, limit: int) -> tuple[int, bytes]:
        """The worker's Prometheus exposition (spec §20): status and body, bounded
        like every small exchange; :class:`MetricsUnreadable` when it could not be
        read whole within ``timeout_s`` and ``limit`` bytes."""
        try:
            return await self._small_json("GET", path, None, timeout_s, limit, accept="text/plain")
        except _Unreachable as exc:
            raise WorkerGone from exc
        except (_Broken, TimeoutError, _BadBody) as exc:
            raise MetricsUnreadable from exc

    async def _small_json(
        self,
        method: str,
        path: str,
        request_id: str | None,
        timeout_s: float,
        limit: int,
        accept: str = "application/json",
        body: bytes | None = None,
    ) -> tuple[int, bytes]:
        """Status and body of one small exchange, bounded by the bytes received
        (a declared or actual body over ``limit`` is :class:`_BadBody`) and in
        total time; a content coding is refused, never decoded (a gzip bomb
        would inflate in memory before any size check)."""
        head = b"%b %b HTTP/1.1\r\nhost: %b\r\naccept: %b\r\naccept-encoding: identity\r\n" % (
            method.encode("ascii"),
            path.encode("ascii"),
            self._authority,
            accept.encode("ascii"),
        )
        if request_id is not None:
            head += b"x-request-id: %b\r\n" % request_id.encode("ascii")
        if body is not None:
            head += b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
        pool = self.small_pool
        async with asyncio.timeout(timeout_s):
            try:
                conn = await pool.acquire()
            except WireConnectError as exc:
                if isinstance(exc.__cause__, TimeoutError):
                    raise TimeoutError from exc
                raise _Unreachable from exc
            try:
                conn.begin()
                await conn.write(head + b"\r\n" + (body or b""), timeout_s)
                await conn.read_head()
                coding = (conn.header(b"content-encoding") or b"").strip().lower()
                if coding not in (b"", b"identity"):
                    raise _BadBody
                declared = conn.header(b"content-length") or b""
                if declared.isdigit() and int(declared) > limit:
                    raise _BadBody
                content = bytearray()
                while not conn.complete:
                    data = conn.take()
                    if data is None:
                        await conn.wait_body()
                        continue
                    content += data
                    if len(content) > limit:
                        raise _BadBody
                content += conn.take() or b""
                if len(content) > limit:
                    raise _BadBody
            except BaseException as exc:
                conn.close()
                pool.release(conn)
                if isinstance(exc, WireError):
                    raise _Broken from exc
                raise
            pool.release(conn)
            return conn.status, bytes(content)


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


async def _relayed_rejection(conn: WireConnection) -> GatewayError:
    """A worker's 4xx as the caller's 400 ``invalid_request`` with the worker's
    message (spec §24): ``{"message": …}`` or plain text, bounded, control
    characters dropped, cut to :data:`_REJECTION_CHARS`. The wait for the body
    is the caller's deadline (the relay's first-event timeout)."""
    body = bytearray()
    while not conn.complete and len(body) < _REJECTION_BYTES:
        data = conn.take()
        if data is not None:
            body += data
            continue
        try:
            await conn.wait_body()
        except WireError:
            break  # what arrived is the message
    body += conn.take() or b""
    return GatewayError(
        "invalid_request", _worker_message(bytes(body[:_REJECTION_BYTES])), outcome="upstream_error"
    )


def _worker_message(body: bytes) -> str:
    text = body.decode("utf-8", "replace")
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        nested = parsed.get("error")
        message = (nested if isinstance(nested, dict) else parsed).get("message")
        text = message if isinstance(message, str) else ""
    shown = "".join(c if c.isprintable() else " " for c in text).strip()[:_REJECTION_CHARS]
    return shown or "The inference worker rejected the request."


def _check_head(conn: WireConnection, request_id: str, accept: Accept) -> None:
    status = conn.status
    if 400 <= status < 500:
        raise GatewayError("upstream_rejected")
    if status >= 500:
        raise GatewayError("upstream_error")
    if status != 200:
        # Redirects are never followed: the worker has no reason to send one.
        raise GatewayError("upstream_protocol_error")
    content_type = (conn.header(b"content-type") or b"").lower()
    if accept == "audio":
        # The whole media type: audio/wave or audio/pcmx is not what was asked for.
        if content_type.split(b";", 1)[0].strip() not in _CONTENT_TYPES[accept]:
            raise GatewayError("upstream_protocol_error")
    elif not content_type.startswith(_CONTENT_TYPES[accept]):
        raise GatewayError("upstream_protocol_error")
    if (conn.header(b"content-encoding") or b"identity").strip().lower() != b"identity":
        raise GatewayError("upstream_protocol_error")
    echoed = conn.headers_named(b"x-request-id")
    # Releases before 0.8.12 send no echo; a different one, or two, means a
    # crossed response (the worker sets exactly one).
    if echoed and (len(echoed) != 1 or echoed[0].decode("latin-1") != request_id):
        raise GatewayError("upstream_protocol_error")
