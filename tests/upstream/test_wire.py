"""The worker's HTTP/1.1 wire code fed bytes directly: a fake transport, no socket.

Heads and bodies (content-length, chunked, until close) whole and split, the
head caps, malformed input and EOF as the errors the client maps (spec §12),
reading backpressure, writing with a full socket, and the pool's reuse rules."""

from __future__ import annotations

import asyncio
import random
import ssl
from typing import Any, cast

import pytest

from gateway.upstream import wire
from gateway.upstream.wire import (
    WireConnectError,
    WireConnection,
    WireError,
    WirePool,
    WireProtocolError,
)

OK = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-request-id: r1\r\n"


class FakeTransport:
    """What WireConnection uses of an asyncio transport. ``close`` reports
    ``connection_lost`` one loop iteration later, as a real transport does."""

    def __init__(self, protocol: WireConnection) -> None:
        self.protocol = protocol
        self.written: list[bytes] = []
        self.closed = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def _connection(*, begin: bool = True) -> tuple[WireConnection, FakeTransport]:
    conn = WireConnection()
    transport = FakeTransport(conn)
    conn.connection_made(cast(asyncio.Transport, transport))
    if begin:
        conn.begin()
    return conn, transport


def _feed(conn: WireConnection, data: bytes, split: str) -> None:
    if split == "whole":
        conn.data_received(data)
    elif split == "bytewise":
        for i in range(len(data)):
            conn.data_received(data[i : i + 1])
    else:
        rng = random.Random(split)
        cuts = sorted(rng.sample(range(1, len(data)), k=min(12, len(data) - 1)))
        for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True):
            conn.data_received(data[a:b])


def _body(conn: WireConnection) -> bytes:
    return conn.take() or b""


def _chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def _lost(conn: WireConnection) -> None:
    """Let the fake transport's connection_lost run (one loop iteration)."""
    await asyncio.sleep(0)
    assert conn.closed


SPLITS = ["whole", "bytewise", "seed-1", "seed-2"]


# -- heads ---------------------------------------------------------------------


@pytest.mark.parametrize("split", SPLITS)
async def test_a_head_is_parsed_whole_or_split(split: str) -> None:
    conn, _ = _connection()
    head = OK + b"X-Request-Id: r2\r\ncontent-length: 5\r\n\r\n"
    _feed(conn, head, split)
    async with asyncio.timeout(5):
        await conn.read_head()
    assert conn.status == 200 and conn.head_done
    # Names are lowercased; the first value is header(), every value headers_named().
    assert conn.header(b"content-type") == b"text/event-stream"
    assert conn.headers_named(b"x-request-id") == [b"r1", b"r2"]
    assert conn.header(b"x-absent") is None
    assert conn.head_bytes == len(head) and not conn.complete


async def test_read_head_waits_for_the_rest_of_the_head() -> None:
    conn, _ = _connection()
    reader = asyncio.create_task(conn.read_head())
    conn.data_received(OK[:20])
    await asyncio.sleep(0)
    assert not reader.done()
    conn.data_received(OK[20:] + b"content-length: 0\r\n\r\n")
    async with asyncio.timeout(5):
        await reader
    assert conn.status == 200 and conn.complete


@pytest.mark.parametrize(
    "head",
    [
        b"garbage\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nab",
        b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
    ],
    ids=["not-http", "bad-status", "two-lengths", "bad-length", "no-colon"],
)
async def test_an_invalid_head_is_a_protocol_error(head: bytes) -> None:
    conn, transport = _connection()
    conn.data_received(head)
    assert conn.protocol_error and conn.error == "invalid HTTP/1.1"
    assert transport.closed
    with pytest.raises(WireProtocolError):
        await conn.read_head()


async def test_a_head_over_the_byte_cap_is_refused_while_it_arrives() -> None:
    conn, transport = _connection()
    conn.data_received(b"HTTP/1.1 200 OK\r\nx-long: ")
    piece = b"a" * 8192
    fed = 0
    while not transport.closed:
        conn.data_received(piece)
        fed += len(piece)
        assert fed <= wire._MAX_HEAD_BYTES + len(piece)
    assert conn.error == "head too large"
    with pytest.raises(WireProtocolError, match="head too large"):
        await conn.read_head()


async def test_too_many_header_lines_are_a_protocol_error() -> None:
    conn, transport = _connection()
    lines = b"".join(b"x-h%d: v\r\n" % i for i in range(wire._MAX_HEADERS + 1))
    conn.data_received(b"HTTP/1.1 200 OK\r\n" + lines + b"\r\n")
    assert conn.protocol_error and transport.closed
    assert len(conn.headers) == wire._MAX_HEADERS
    with pytest.raises(WireProtocolError):
        await conn.read_head()


async def test_exactly_the_header_line_cap_is_accepted() -> None:
    conn, _ = _connection()
    lines = b"".join(b"x-h%d: v\r\n" % i for i in range(wire._MAX_HEADERS - 1))
    conn.data_received(b"HTTP/1.1 200 OK\r\n" + lines + b"content-length: 0\r\n\r\n")
    await conn.read_head()
    assert len(conn.headers) == wire._MAX_HEADERS and conn.complete


async def test_eof_before_the_head_is_a_broken_connection() -> None:
    conn, _ = _connection()
    conn.data_received(OK)
    conn.connection_lost(None)
    assert conn.error == "connection closed" and not conn.protocol_error
    with pytest.raises(WireError) as caught:
        await conn.read_head()
    assert not isinstance(caught.value, WireProtocolError)


async def test_bytes_outside_an_exchange_close_the_connection() -> None:
    conn, transport = _connection(begin=False)
    conn.data_received(b"HTTP/1.1 200 OK\r\n\r\n")
    assert conn.error == "unexpected bytes" and transport.closed
    assert not conn.head_done


# -- bodies ----------------------------------------------------------------------


@pytest.mark.parametrize("split", SPLITS)
async def test_a_content_length_body_is_kept_whole_or_split(split: str) -> None:
    conn, _ = _connection()
    body = "data: héllo\n\n".encode()
    _feed(conn, OK + b"content-length: %d\r\n\r\n" % len(body) + body, split)
    assert _body(conn) == body
    assert conn.complete and conn.keep_alive and conn.reusable()


@pytest.mark.parametrize("split", SPLITS)
async def test_a_chunked_body_is_dechunked_whole_or_split(split: str) -> None:
    conn, _ = _connection()
    pieces = [b"data: a\n\n", b"\r\n\r\n", b"x" * 300]
    _feed(conn, OK + b"transfer-encoding: chunked\r\n\r\n" + _chunked(*pieces), split)
    assert _body(conn) == b"".join(pieces)
    assert conn.complete and conn.reusable()


async def test_chunk_extensions_and_trailers_carry_nothing_into_the_body() -> None:
    conn, _ = _connection()
    raw = b"3;name=value\r\nabc\r\n0\r\nx-trailer: 1\r\n\r\n"
    conn.data_received(OK + b"transfer-encoding: chunked\r\n\r\n" + raw)
    assert _body(conn) == b"abc" and conn.complete


async def test_an_invalid_chunk_size_is_a_protocol_error() -> None:
    conn, transport = _connection()
    conn.data_received(OK + b"transfer-encoding: chunked\r\n\r\nzz\r\nab\r\n")
    await conn.read_head()  # the head itself was fine
    assert transport.closed and conn.protocol_error
    with pytest.raises(WireProtocolError):
        await conn.wait_body()


@pytest.mark.parametrize(
    "framing",
    [b"content-length: 10\r\n\r\nabc", b"transfer-encoding: chunked\r\n\r\n5\r\nab"],
    ids=["content-length", "chunked"],
)
async def test_eof_before_the_framed_end_is_a_broken_stream(framing: bytes) -> None:
    conn, _ = _connection()
    conn.data_received(OK + framing)
    await conn.read_head()
    assert conn.take() is not None
    conn.connection_lost(ConnectionResetError())
    assert not conn.complete and conn.error == "connection closed"
    with pytest.raises(WireError) as caught:
        await conn.wait_body()
    assert not isinstance(caught.value, WireProtocolError)


async def test_a_body_until_close_ends_at_eof() -> None:
    conn, _ = _connection()
    conn.data_received(OK + b"\r\nevery byte until close")
    await conn.read_head()
    assert not conn.complete
    conn.connection_lost(None)
    assert conn.complete and not conn.keep_alive and conn.error is None
    assert _body(conn) == b"every byte until close"
    assert not conn.reusable()


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nab",
        b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nab",
    ],
    ids=["connection-close", "http-1.0"],
)
async def test_a_response_without_keepalive_is_not_reusable(head: bytes) -> None:
    conn, _ = _connection()
    conn.data_received(head)
    assert conn.complete and _body(conn) == b"ab"
    assert not conn.keep_alive and not conn.reusable()


async def test_wait_body_returns_when_more_bytes_come() -> None:
    conn, _ = _connection()
    conn.data_received(OK + b"transfer-encoding: chunked\r\n\r\n")
    await conn.read_head()
    assert conn.take() is None
    waiter = asyncio.create_task(conn.wait_body())
    await asyncio.sleep(0)
    assert not waiter.done()
    conn.data_received(b"2\r\nab\r\n")
    async with asyncio.timeout(5):
        await waiter
    assert conn.take() == b"ab"


async def test_take_joins_what_is_queued_and_empties_the_queue() -> None:
    conn, _ = _connection()
    conn.data_received(OK + b"transfer-encoding: chunked\r\n\r\n")
    for piece in (b"a", b"bc", b"def"):
        conn.data_received(_chunked(piece)[:-5])  # each chunk, not the last-chunk
    assert conn.buffered == 6
    assert conn.take() == b"abcdef"
    assert conn.take() is None and conn.buffered == 0


async def test_reading_pauses_above_high_water_and_resumes_on_take() -> None:
    conn, transport = _connection()
    conn.data_received(OK + b"transfer-encoding: chunked\r\n\r\n")
    big = b"x" * (wire._HIGH_WATER // 2 + 1)
    conn.data_received(_chunked(big)[:-5])
    assert transport.reading and not conn.paused
    conn.data_received(_chunked(big)[:-5])
    assert not transport.reading and conn.paused
    assert len(conn.take() or b"") == 2 * len(big)
    assert transport.reading and not conn.paused


async def test_begin_resets_the_response_for_the_next_exchange() -> None:
    conn, _ = _connection()
    conn.data_received(OK + b"content-length: 1\r\n\r\na")
    assert conn.complete and conn.status == 200
    conn.begin()
    assert (conn.status, conn.headers, conn.head_done, conn.complete) == (0, [], False, False)
    conn.data_received(b"HTTP/1.1 503 Busy\r\ncontent-length: 0\r\n\r\n")
    await conn.read_head()
    assert conn.status == 503 and conn.header(b"x-request-id") is None


# -- writing -------------------------------------------------------------------


async def test_send_begins_an_exchange_and_writes_the_request() -> None:
    conn, transport = _connection(begin=False)
    await conn.send(b"GET / HTTP/1.1\r\n\r\n", 1)
    assert transport.written == [b"GET / HTTP/1.1\r\n\r\n"]
    assert conn.parser is not None and not conn.head_done


async def test_write_waits_while_the_socket_is_full() -> None:
    conn, transport = _connection()
    conn.pause_writing()
    writer = asyncio.create_task(conn.write(b"piece", 5))
    await asyncio.sleep(0)
    assert transport.written == [b"piece"] and not writer.done()
    conn.resume_writing()
    async with asyncio.timeout(5):
        await writer


async def test_a_write_stuck_past_its_timeout_breaks_the_connection() -> None:
    conn, transport = _connection()
    conn.pause_writing()
    with pytest.raises(WireError, match="write timed out"):
        await conn.write(b"piece", 0.01)
    assert transport.closed


async def test_a_connection_lost_while_writing_fails_the_write() -> None:
    conn, _ = _connection()
    conn.pause_writing()
    writer = asyncio.create_task(conn.write(b"piece", 5))
    await asyncio.sleep(0)
    conn.connection_lost(BrokenPipeError())
    with pytest.raises(WireError, match="connection closed"):
        async with asyncio.timeout(5):
            await writer


async def test_writing_to_a_closed_connection_fails_at_once() -> None:
    conn, transport = _connection()
    conn.connection_lost(None)
    with pytest.raises(WireError):
        await conn.write(b"x", 1)
    assert transport.written == []
    with pytest.raises(WireError, match="connection closed"):
        await WireConnection().write(b"x", 1)


async def test_close_is_not_reusable_before_connection_lost_arrives() -> None:
    conn, transport = _connection()
    conn.data_received(OK + b"content-length: 0\r\n\r\n")
    assert conn.reusable()
    conn.close()
    assert not conn.reusable() and not conn.closed and transport.closed
    await _lost(conn)


# -- the pool ----------------------------------------------------------------------


def _pool(max_connections: int = 2, **options: Any) -> WirePool:
    return WirePool(
        "127.0.0.1", 9, max_connections=max_connections, connect_timeout_s=0.05, **options
    )


class _Dialer:
    """Stands in for ``loop.create_connection``: a fake-transport connection,
    or the error it is told to raise."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error
        self.calls: list[tuple[Any, ...]] = []
        self.made: list[WireConnection] = []

    async def __call__(
        self, factory: Any, host: str, port: int, *, ssl: Any = None
    ) -> tuple[Any, WireConnection]:
        self.calls.append((host, port, ssl))
        if self.error is not None:
            raise self.error
        conn = factory()
        transport = FakeTransport(conn)
        conn.connection_made(cast(asyncio.Transport, transport))
        self.made.append(conn)
        return transport, conn


@pytest.fixture
async def dialer(monkeypatch: pytest.MonkeyPatch) -> _Dialer:
    fake = _Dialer()
    monkeypatch.setattr(asyncio.get_running_loop(), "create_connection", fake)
    return fake


def _finished(conn: WireConnection) -> WireConnection:
    conn.begin()
    conn.data_received(OK + b"content-length: 2\r\n\r\nab")
    return conn


async def test_acquire_dials_the_configured_host_and_tls(dialer: _Dialer) -> None:
    context = ssl.create_default_context()
    pool = _pool(tls=context)
    conn = await pool.acquire()
    assert dialer.calls == [("127.0.0.1", 9, context)]
    assert conn is dialer.made[0]


async def test_a_cleanly_finished_connection_is_reused(dialer: _Dialer) -> None:
    pool = _pool()
    first = await pool.acquire()
    _finished(first).take()
    pool.release(first)
    assert first.parser is None  # bytes before the next begin() close it
    again = await pool.acquire()
    assert again is first and len(dialer.calls) == 1


@pytest.mark.parametrize(
    "spoil",
    ["unread-body", "not-complete", "closed", "connection-close"],
)
async def test_a_connection_that_cannot_be_reused_is_closed(dialer: _Dialer, spoil: str) -> None:
    pool = _pool()
    conn = await pool.acquire()
    conn.begin()
    if spoil == "connection-close":
        conn.data_received(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
    elif spoil != "not-complete":
        _finished(conn)
        if spoil == "closed":
            conn.take()
            conn.close()
    pool.release(conn)
    await _lost(conn)
    await pool.acquire()
    assert len(dialer.calls) == 2


async def test_an_expired_idle_connection_is_closed_not_reused(dialer: _Dialer) -> None:
    pool = _pool(keepalive_expiry_s=0)
    conn = await pool.acquire()
    _finished(conn).take()
    pool.release(conn)
    fresh = await pool.acquire()
    assert fresh is not conn and len(dialer.calls) == 2
    await _lost(conn)


async def test_no_free_slot_within_the_timeout_is_a_connect_error(dialer: _Dialer) -> None:
    pool = _pool(max_connections=1)
    held = await pool.acquire()
    with pytest.raises(WireConnectError, match="no pool slot"):
        await pool.acquire()
    pool.release(held)
    # The slot came back: the next acquire gets it at once.
    async with asyncio.timeout(1):
        await pool.acquire()


async def test_a_waiting_acquire_gets_the_slot_released_meanwhile(dialer: _Dialer) -> None:
    pool = WirePool("127.0.0.1", 9, max_connections=1, connect_timeout_s=5)
    held = await pool.acquire()
    waiter = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0)
    assert not waiter.done()
    pool.release(held)
    async with asyncio.timeout(5):
        assert await waiter is not None


@pytest.mark.parametrize("error", [ConnectionRefusedError(), TimeoutError()])
async def test_a_failed_dial_is_a_connect_error_and_frees_its_slot(
    dialer: _Dialer, error: BaseException
) -> None:
    pool = _pool(max_connections=1)
    dialer.error = error
    for _ in range(3):  # a slot leaked per failure would block the second attempt
        with pytest.raises(WireConnectError, match="connect failed"):
            async with asyncio.timeout(1):
                await pool.acquire()


async def test_close_closes_every_idle_connection(dialer: _Dialer) -> None:
    pool = _pool()
    a, b = await pool.acquire(), await pool.acquire()
    for conn in (a, b):
        _finished(conn).take()
        pool.release(conn)
    pool.close()
    await asyncio.sleep(0)
    assert a.closed and b.closed
    await pool.acquire()
    assert len(dialer.calls) == 3
