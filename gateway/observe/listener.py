"""``metrics.listen``: ``/metrics`` on its own plain-HTTP listener (spec §13).

A scrape port apart from the callers' port (which then has no ``/metrics``)
lets a NetworkPolicy open it to the monitoring namespace only. The listener
speaks just enough HTTP/1.1: one ``GET <metrics.path>`` per connection, a
head of at most :data:`_MAX_HEAD` bytes read within :data:`_HEAD_TIMEOUT_S`
(a longer or slower head is just closed), then the answer and close, written
within :data:`_WRITE_TIMEOUT_S` (a scraper that stops reading is cut: the
exposition can be far larger than the socket buffers, and a write nobody
reads would otherwise hold the connection and its copy of the payload forever).
Anything else is 404 (405 for another method on the path); nothing here
reads a body. The exposition is rendered as on the main listener: off the
event loop, at a bounded rate (``exposition.py``).
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from gateway.observe.exposition import exposition_of

log = logging.getLogger("gateway.metrics")

_MAX_HEAD = 8192
_HEAD_TIMEOUT_S = 5.0
#: the whole answer, written and closed, at most (a slower reader is reset)
_WRITE_TIMEOUT_S = 10.0


class MetricsListener:
    def __init__(self, registry: CollectorRegistry, host: str, port: int, path: str) -> None:
        self._registry = registry
        self._host = host
        self._port = port
        self._path = path.encode("ascii")
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`; an OS-chosen one for port 0)."""
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self._host, self._port, limit=_MAX_HEAD
        )
        log.info("metrics listening on http://%s:%d%s", self._host, self.port, self._path.decode())

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except (TimeoutError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.transport.abort()
            return
        method, _, rest = head.partition(b" ")
        target = rest.split(b" ", 1)[0].split(b"?", 1)[0]
        if target != self._path:
            await self._answer(writer, 404, b"text/plain", b"not found\n")
        elif method != b"GET":
            await self._answer(writer, 405, b"text/plain", b"method not allowed\n")
        else:
            body = await exposition_of(self._registry).render()
            await self._answer(writer, 200, CONTENT_TYPE_LATEST.encode(), body)

    async def _answer(
        self, writer: asyncio.StreamWriter, status: int, content_type: bytes, body: bytes
    ) -> None:
        reason = {200: b"OK", 404: b"Not Found", 405: b"Method Not Allowed"}.get(status, b"Error")
        try:
            async with asyncio.timeout(_WRITE_TIMEOUT_S):
                writer.write(
                    b"HTTP/1.1 %d %b\r\ncontent-type: %b\r\ncontent-length: %d\r\n"
                    b"connection: close\r\n\r\n" % (status, reason, content_type, len(body)) + body
                )
                await writer.drain()
                writer.close()
                await writer.wait_closed()
        except (TimeoutError, OSError):
            # Not read in time (or the peer went away): drop what is buffered.
            writer.transport.abort()
