"""The separate metrics listener (``metrics.listen``, spec §13) holds no
connection longer than its bounds: a scraper that sends a head and never reads
the answer is cut (docs/security.md threat 8)."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.observe import listener as metrics_listener
from gateway.observe.listener import MetricsListener
from tests.support.poll import eventually_async

#: far more than the kernel's socket buffers hold between the two ends
_PAYLOAD_BYTES = 32 << 20


class _Big:
    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("big", "A large exposition.", labels=["pad"])
        for index in range(32):
            family.add_metric([f"{index}" + "x" * (_PAYLOAD_BYTES // 32)], 1.0)
        yield family


def _serving() -> list[asyncio.Task[object]]:
    return [
        t
        for t in asyncio.all_tasks()
        if getattr(t.get_coro(), "__qualname__", "") == "MetricsListener._serve"
    ]


@pytest.fixture
async def big_listener(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[MetricsListener]:
    monkeypatch.setattr(metrics_listener, "_WRITE_TIMEOUT_S", 0.5, raising=False)
    registry = CollectorRegistry()
    registry.register(_Big())
    listener = MetricsListener(registry, "127.0.0.1", 0, "/metrics")
    await listener.start()
    try:
        yield listener
    finally:
        await listener.aclose()


async def _stalled_scraper(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    await asyncio.get_running_loop().sock_sendall(sock, b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
    return sock


def _drain(sock: socket.socket) -> int:
    """What the scraper can still read (until EOF or a reset)."""
    sock.setblocking(True)
    sock.settimeout(5)
    got = 0
    try:
        while chunk := sock.recv(1 << 20):
            got += len(chunk)
    except (ConnectionResetError, TimeoutError):
        pass
    return got


async def test_a_scraper_that_never_reads_is_cut(big_listener: MetricsListener) -> None:
    sock = await _stalled_scraper(big_listener.port)
    try:
        await eventually_async(lambda: bool(_serving()), "the scrape is being answered")
        # Never reading: the answer cannot be written, and the listener gives up.
        await eventually_async(lambda: not _serving(), "the stalled scrape is cut", 10)
        received = await asyncio.to_thread(_drain, sock)
    finally:
        sock.close()
    assert received < _PAYLOAD_BYTES  # the connection was dropped, not kept to finish


async def test_a_scraper_that_reads_gets_everything(big_listener: MetricsListener) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", big_listener.port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        async with asyncio.timeout(20):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 200 ")
    assert len(body) > _PAYLOAD_BYTES


async def test_a_reset_during_the_head_leaves_nothing_running(
    big_listener: MetricsListener,
) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", big_listener.port))
    await asyncio.get_running_loop().sock_sendall(sock, b"GET /metr")
    await eventually_async(lambda: bool(_serving()), "the head is being read")
    # SO_LINGER 0: close sends a reset.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    await eventually_async(lambda: not _serving(), "the reset connection is let go")
