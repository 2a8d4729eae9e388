"""The worker's small JSON exchanges (``GET``/``DELETE /v1/responses/{id}``, the
models listing) are bounded by bytes received, and refuse content codings, like
the inference stream (docs/security.md threat 11)."""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gateway.config import UpstreamConfig
from gateway.core.errors import GatewayError
from gateway.upstream.client import ListingError, Upstream

#: what the worker's body would inflate to (the gzip is about 64 KiB)
_INFLATED = 64 << 20
_ROUTE = "/srv/mosaic-models/sim"


def _reply(body: bytes, *, coding: bytes | None = None, chunked: bool = False) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    if coding is not None:
        head += b"content-encoding: " + coding + b"\r\n"
    if chunked:
        piece = 1 << 16
        parts = [
            b"%x\r\n%b\r\n" % (len(body[i : i + piece]), body[i : i + piece])
            for i in range(0, len(body), piece)
        ]
        return head + b"transfer-encoding: chunked\r\n\r\n" + b"".join(parts) + b"0\r\n\r\n"
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


#: what a loopback worker does with one connection, given the request's head
Answer = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _serving(answer: Answer) -> AsyncIterator[str]:
    """A worker on loopback: each connection's request head read, then
    ``answer`` (10 s at most), then the connection aborted; every connection
    still open is aborted when the test lets go."""
    connections: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        try:
            async with asyncio.timeout(10):
                await answer(await reader.readuntil(b"\r\n\r\n"), reader, writer)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        for writer in connections:
            writer.transport.abort()
        await server.wait_closed()


async def _worker(reply: bytes) -> AsyncIterator[str]:
    async def answer(
        head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        # In pieces, so that this side's buffer is not what the test measures.
        view = memoryview(reply)
        for start in range(0, len(reply), 1 << 16):
            writer.write(view[start : start + (1 << 16)])
            await writer.drain()

    async for base_url in _serving(answer):
        yield base_url


@pytest.fixture(params=["gzip", "plain", "chunked"])
async def hostile(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    filler = b'{"id": "resp_x", "object": "response", "pad": "' + b" " * _INFLATED + b'"}'
    if request.param == "gzip":
        reply = _reply(gzip.compress(filler, 9), coding=b"gzip")
    else:
        reply = _reply(filler, chunked=request.param == "chunked")
    async for base_url in _worker(reply):
        yield base_url


async def _peak(action: object) -> int:
    tracemalloc.start()
    try:
        await action  # type: ignore[misc]
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


async def test_a_huge_or_encoded_json_answer_is_refused_within_its_bound(hostile: str) -> None:
    upstream = Upstream(UpstreamConfig(base_url=hostile, route=_ROUTE))
    refused: list[GatewayError] = []

    async def exchange() -> None:
        try:
            await upstream.request_json("GET", "/v1/responses/resp_x", "r-1", 10.0)
        except GatewayError as exc:
            refused.append(exc)

    try:
        peak = await _peak(exchange())
    finally:
        await upstream.aclose()
    assert [e.code for e in refused] == ["upstream_protocol_error"]
    # The bound is max_line_bytes (1 MiB by default), not what the worker sent.
    assert peak < 8 << 20, peak


async def test_a_huge_or_encoded_listing_is_a_bad_body_within_its_bound(hostile: str) -> None:
    upstream = Upstream(UpstreamConfig(base_url=hostile, route=_ROUTE))
    reasons: list[str] = []

    async def listing() -> None:
        try:
            await upstream.get_models(10.0)
        except ListingError as exc:
            reasons.append(exc.reason)

    try:
        peak = await _peak(listing())
    finally:
        await upstream.aclose()
    assert reasons == ["bad_body"]
    assert peak < 8 << 20, peak


async def test_a_small_encoded_answer_is_refused_too() -> None:
    """A content coding is refused whatever its size (nothing decodes it)."""
    body = gzip.compress(b'{"id": "resp_x", "object": "response"}')
    async for base_url in _worker(_reply(body, coding=b"gzip")):
        upstream = Upstream(UpstreamConfig(base_url=base_url, route=_ROUTE))
        try:
            with pytest.raises(GatewayError) as refused:
                await upstream.request_json("GET", "/v1/responses/resp_x", "r-1", 10.0)
        finally:
            await upstream.aclose()
        assert refused.value.code == "upstream_protocol_error"


async def test_a_plain_answer_still_parses() -> None:
    body = b'{"id": "resp_x", "object": "response"}'
    async for base_url in _worker(_reply(body)):
        upstream = Upstream(UpstreamConfig(base_url=base_url, route=_ROUTE))
        try:
            status, parsed = await upstream.request_json("GET", "/v1/responses/resp_x", "r", 10.0)
        finally:
            await upstream.aclose()
        assert (status, parsed) == (200, {"id": "resp_x", "object": "response"})


async def _listing_worker(behaviour: str) -> AsyncIterator[str]:
    """A worker whose ``POST`` streams one event and holds its connection open,
    and whose ``GET /v1/models`` answers by ``behaviour``: ``list``, ``silent``
    (never answers) or ``cut`` (closes inside the head)."""

    async def answer(
        head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if head.startswith(b"POST"):
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n"
            )
            await reader.read()  # until the client lets go
        elif behaviour == "list":
            writer.write(_reply(b'{"object": "list", "data": []}'))
            await writer.drain()
        elif behaviour == "cut":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-ty")
            await writer.drain()
        else:
            await reader.read()

    async for base_url in _serving(answer):
        yield base_url


async def test_a_full_inference_pool_does_not_delay_the_listing() -> None:
    """The readiness poll has connections of its own: every inference slot
    taken by a stream still open, the listing answers at once."""
    async for base_url in _listing_worker("list"):
        upstream = Upstream(UpstreamConfig(base_url=base_url, route=_ROUTE), pool_size=1)
        try:
            stream = await upstream.open_stream("/v1/chat/completions", b"{}", "r-1")
            assert upstream.pool._slots.locked()  # the only inference slot is taken
            listing = await upstream.get_models(2.0)
            stream.close()
        finally:
            await upstream.aclose()
        assert listing == {"object": "list", "data": []}


@pytest.mark.parametrize(("behaviour", "reason"), [("silent", "timeout"), ("cut", "http_error")])
async def test_a_listing_that_fails_says_why(behaviour: str, reason: str) -> None:
    async for base_url in _listing_worker(behaviour):
        upstream = Upstream(UpstreamConfig(base_url=base_url, route=_ROUTE))
        try:
            with pytest.raises(ListingError) as failed:
                await upstream.get_models(0.3)
        finally:
            await upstream.aclose()
        assert failed.value.reason == reason


async def test_a_listing_nobody_answers_is_connection_refused() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()  # the port is free again: nothing listens there
    upstream = Upstream(UpstreamConfig(base_url=f"http://127.0.0.1:{port}", route=_ROUTE))
    try:
        with pytest.raises(ListingError) as failed:
            await upstream.get_models(2.0)
    finally:
        await upstream.aclose()
    assert failed.value.reason == "connection_refused"
