"""The worker's small JSON exchanges (``GET``/``DELETE /v1/responses/{id}``, the
models listing) are bounded by bytes received, and refuse content codings, like
the inference stream (docs/security.md threat 11)."""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
from collections.abc import AsyncIterator

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


async def _worker(reply: bytes) -> AsyncIterator[str]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10):
                await reader.readuntil(b"\r\n\r\n")
                # In pieces, so that this side's buffer is not what the test measures.
                view = memoryview(reply)
                for start in range(0, len(reply), 1 << 16):
                    writer.write(view[start : start + (1 << 16)])
                    await writer.drain()
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
        await server.wait_closed()


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
