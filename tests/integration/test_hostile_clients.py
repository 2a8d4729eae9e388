"""Hostile callers (issue 8): every trick ends in a clean refusal or a cut-off,
never a hung task, unbounded memory or a request reaching the worker.

The stack runs the listener's own protocol (gateway/http/protocol.py) under uvicorn
on 127.0.0.1 with short timeouts so that cut-offs happen within a test.
"""

from __future__ import annotations

import socket
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import rawhttp
from tests.support.poll import eventually
from tests.support.stack import Stack, chat_body, running_stack, worker_posts

HEADER_TIMEOUT_S = 0.5
BODY_TIMEOUT_S = 0.5
MAX_HEADER_BYTES = 8192
KEEP_ALIVE_S = 1


@pytest.fixture
def hostile(tmp_path: Path, _dev_secret: None) -> Iterator[Stack]:
    with running_stack(
        tmp_path,
        acme={"limits": {"max_output_tokens": 8192, "requests_per_minute": 6000}},
        listen={
            "host": "127.0.0.1",
            "port": 0,
            "shutdown_grace_s": 5,
            "header_timeout_s": HEADER_TIMEOUT_S,
            "body_timeout_s": BODY_TIMEOUT_S,
            "max_header_bytes": MAX_HEADER_BYTES,
        },
        upstream={"idle_timeout_s": 1, "total_timeout_s": 4, "max_stream_bytes": 1 << 28},
        limits={"max_output_tokens": 8192},
        server_options={"timeout_keep_alive": KEEP_ALIVE_S},
    ) as stack:
        yield stack


def _port(stack: Stack) -> int:
    return int(stack.url.rsplit(":", 1)[1])


def _exchange(stack: Stack, raw: bytes) -> rawhttp.Response:
    """Send bytes on a fresh connection; the one response (and whether it closed)."""
    sock = rawhttp.connect(_port(stack))
    try:
        sock.sendall(raw)
        return rawhttp.read_response(sock)
    finally:
        sock.close()


def _served(stack: Stack) -> bool:
    with stack.client(timeout=5) as client:
        return client.post("/v1/chat/completions", json=chat_body()).status_code == 200


# ------------------------------------------------------------- slow heads


def test_slow_head_gets_408_while_others_are_served(hostile: Stack) -> None:
    slow = rawhttp.connect(_port(hostile))
    silent = rawhttp.connect(_port(hostile))
    try:
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nx-a: ")
        # Another caller is served while both connections hang.
        assert _served(hostile)
        response = rawhttp.read_response(slow, timeout_s=10)
        assert response.status == 408
        assert response.error_code() == "request_timeout"
        assert response.header("connection") == "close" and response.closed
        # A connection that never sent a byte is closed without an answer.
        assert rawhttp.wait_closed(silent, 10)
    finally:
        slow.close()
        silent.close()
    assert len(worker_posts(hostile.sim)) == 1


def test_trickled_head_is_cut_at_the_deadline_not_kept_alive(hostile: Stack) -> None:
    sock = rawhttp.connect(_port(hostile))
    started = time.monotonic()
    try:
        # One byte at a time: each byte is progress, but the head has a deadline.
        head = b"GET /livez HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: " + b"a" * 200
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            if time.monotonic() - started > 5:
                break
            time.sleep(0.02)
        response = rawhttp.read_response(sock, timeout_s=10)
    finally:
        sock.close()
    assert response.status == 408
    assert time.monotonic() - started < 5


# ------------------------------------------------------------- slow bodies


def test_slow_body_gets_408_and_a_receipt(hostile: Stack) -> None:
    body = rawhttp.json_body(chat_body("hello"))
    sock = rawhttp.connect(_port(hostile))
    try:
        head = rawhttp.chat_post(
            hostile.rs256(),
            [("content-length", str(len(body))), ("x-request-id", "slow-body-1")],
            content_length=False,
        )
        sock.sendall(head + body[:10])  # and never the rest
        assert _served(hostile)
        response = rawhttp.read_response(sock, timeout_s=10)
    finally:
        sock.close()
    assert response.status == 408
    assert response.error_code() == "request_timeout"
    assert response.closed
    receipt = hostile.receipt("slow-body-1")
    assert (receipt["outcome"], receipt["error_code"]) == ("rejected", "request_timeout")
    assert len(worker_posts(hostile.sim)) == 1  # only the served one
    assert hostile.runtime.table.admissions.in_use == 0


def test_unread_body_after_a_refusal_is_not_drained_forever(hostile: Stack) -> None:
    sock = rawhttp.connect(_port(hostile))
    try:
        # No credentials: 401 at once.
        head = rawhttp.chat_post(None, [("content-length", str(1 << 20))], content_length=False)
        sock.sendall(head + b"{")
        response = rawhttp.read_response(sock, timeout_s=10)
        assert response.status == 401
        # The caller keeps the body coming, slowly; the gateway stops waiting for it.
        started = time.monotonic()
        closed = False
        while not closed and time.monotonic() - started < 8:
            try:
                sock.sendall(b"x" * 10)
            except OSError:
                break
            closed = rawhttp.wait_closed(sock, 0.1)
        assert time.monotonic() - started < BODY_TIMEOUT_S + 3
    finally:
        sock.close()


# ------------------------------------------------------------ big heads


def test_oversized_header_gets_431(hostile: Stack) -> None:
    response = _exchange(
        hostile, rawhttp.request("GET", "/livez", headers=[("x-big", "b" * (MAX_HEADER_BYTES + 1))])
    )
    assert response.status == 431
    assert response.error_code() == "headers_too_large"
    assert response.closed
    assert "bbbb" not in response.body.decode()
    assert hostile.metric("gateway_rejections_total", tenant="-", code="headers_too_large") >= 1


def test_many_headers_get_431(hostile: Stack) -> None:
    sock = rawhttp.connect(_port(hostile))
    try:
        headers = [(f"x-h{i}", "v" * 40) for i in range(400)]
        sock.sendall(rawhttp.request("GET", "/livez", headers=headers))
        response = rawhttp.read_response(sock)
    finally:
        sock.close()
    assert response.status == 431


def test_endless_header_is_cut_before_it_ends(hostile: Stack) -> None:
    """A header value that never ends: refused once the bytes pass the cap."""
    sock = rawhttp.connect(_port(hostile))
    sent = 0
    try:
        sock.sendall(b"GET /livez HTTP/1.1\r\nhost: 127.0.0.1\r\nx-endless: ")
        block = b"e" * 4096
        with pytest.raises(OSError):
            # Bounded: the gateway must refuse long before 64 MiB.
            while sent < 64 << 20:
                sock.sendall(block)
                sent += len(block)
        # The refusal may be lost to the reset when the kernel still held our bytes.
    finally:
        sock.close()
    assert sent < 4 << 20
    assert _served(hostile)


# ------------------------------------------------- kept-alive connections


def _after_one_request(stack: Stack) -> Any:
    """A connection that has had one complete request and response."""
    sock = rawhttp.connect(_port(stack))
    sock.sendall(rawhttp.request("GET", "/livez"))
    first = rawhttp.read_response(sock, close_wait_s=0)
    assert first.status == 200
    return sock


def test_next_head_on_a_kept_alive_connection_has_the_same_limits(hostile: Stack) -> None:
    sock = _after_one_request(hostile)
    try:
        sock.sendall(b"GET /livez HTTP/1.1\r\nhost: 127.0.0.1\r\n")  # and no more
        assert rawhttp.read_response(sock).status == 408
    finally:
        sock.close()
    sock = _after_one_request(hostile)
    try:
        sock.sendall(b"GET /livez HTTP/1.1\r\nx-big: " + b"b" * (MAX_HEADER_BYTES * 4))
        assert rawhttp.read_response(sock).status == 431
    finally:
        sock.close()


def test_blank_lines_do_not_keep_a_connection_open(hostile: Stack) -> None:
    sock = _after_one_request(hostile)
    started = time.monotonic()
    try:
        # CRLFs between requests are skipped by the parser; each used to reset
        # the keep-alive timer. Now the first one starts the head deadline.
        closed = False
        while not closed and time.monotonic() - started < 8:
            try:
                sock.sendall(b"\r\n")
            except OSError:
                break
            closed = rawhttp.wait_closed(sock, 0.2)
    finally:
        sock.close()
    assert time.monotonic() - started < HEADER_TIMEOUT_S + KEEP_ALIVE_S + 3


def test_finishing_an_unread_body_then_idling_is_closed(hostile: Stack) -> None:
    sock = rawhttp.connect(_port(hostile))
    try:
        head = rawhttp.chat_post(None, [("content-length", "100")], content_length=False)
        sock.sendall(head + b"x" * 10)
        assert rawhttp.read_response(sock).status == 401
        sock.sendall(b"x" * 90)  # the body ends; then the caller just sits there
        assert rawhttp.wait_closed(sock, KEEP_ALIVE_S + 3)
    finally:
        sock.close()


def test_endless_chunked_trailer_is_cut(hostile: Stack) -> None:
    """Trailers (and chunk extensions) are buffered whole by the parser: capped too."""
    sock = rawhttp.connect(_port(hostile))
    sent = 0
    try:
        head = rawhttp.chat_post(
            hostile.rs256(), [("transfer-encoding", "chunked")], content_length=False
        )
        sock.sendall(head + b"2\r\n{}\r\n0\r\nx-trailer: ")
        with pytest.raises(OSError):
            while sent < 256 << 20:
                sock.sendall(b"t" * 65536)
                sent += 65536
    finally:
        sock.close()
    assert sent < 32 << 20  # the cap is 8 KiB; the rest is what the kernel buffers held
    assert _served(hostile)
    # A canceled request keeps its permit until the worker confirms (spec §20).
    assert eventually(lambda: hostile.runtime.table.admissions.in_use == 0)


def test_pipelined_bad_head_never_answers_the_request_before_it(hostile: Stack) -> None:
    """A refusal for request 2 must not go out as request 1's response."""
    sock = rawhttp.connect(_port(hostile))
    try:
        first = _stream_request(hostile, "pipelined-1", "[[sim first_delay_ms=300 chunks=2]]")
        sock.sendall(first + b"GET /livez HTTP/1.1\r\nx-big: " + b"b" * (MAX_HEADER_BYTES * 4))
        received = b""
        sock.settimeout(5)
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (ConnectionError, TimeoutError):
            pass
    finally:
        sock.close()
    assert not received.startswith(b"HTTP/1.1 431")
    receipt = hostile.receipt("pipelined-1")
    # Either request 1 was answered (and maybe cut) or the connection went first;
    # a "complete" receipt with nothing received would mean a lost reply.
    assert (received.startswith(b"HTTP/1.1 200"), receipt["outcome"]) in {
        (True, "complete"),
        (True, "canceled"),
        (False, "canceled"),
    }


# --------------------------------------------------------- header tricks


def test_crlf_in_request_id_cannot_inject_a_response_header(hostile: Stack) -> None:
    response = _exchange(
        hostile,
        rawhttp.request(
            "GET",
            "/livez",
            headers=[("x-request-id", "abc\r\nset-cookie: stolen=1")],
        ),
    )
    assert response.status == 200
    assert response.header("set-cookie") is None
    assert response.header("x-request-id") == "abc"


@pytest.mark.parametrize(
    ("value", "refused"),
    [("abc\rdef", True), ("abc def", False), ("a" * 65, False), ("abc\x00", True), ("é", False)],
    ids=["bare-cr", "space", "too-long", "nul", "non-ascii"],
)
def test_odd_request_ids_are_replaced_or_refused(hostile: Stack, value: str, refused: bool) -> None:
    response = _exchange(
        hostile, rawhttp.request("GET", "/livez", headers=[("x-request-id", value)])
    )
    if refused:  # control characters: the parser refuses the header outright
        assert response.status == 400
        assert response.error_code() == "invalid_request"
        assert response.closed
    else:
        assert response.status == 200
        echoed = response.header("x-request-id")
        assert echoed is not None and echoed.startswith("req_") and echoed != value


def test_folded_header_line_is_refused(hostile: Stack) -> None:
    response = _exchange(
        hostile, b"GET /livez HTTP/1.1\r\nhost: 127.0.0.1\r\nx-request-id: a\r\n b\r\n\r\n"
    )
    assert response.status == 400
    assert response.error_code() == "invalid_request"


def test_duplicate_authorization_in_raw_casing_is_refused(hostile: Stack) -> None:
    token = hostile.rs256()
    response = _exchange(
        hostile,
        rawhttp.chat_post(
            None,
            [("Authorization", f"Bearer {token}"), ("authorization", "Bearer sk-other")],
            body=rawhttp.json_body(chat_body()),
        ),
    )
    assert response.status == 401
    assert token not in response.body.decode()
    assert worker_posts(hostile.sim) == []


_BODY = b'{"model":"gemma-4-mm","messages":[{"role":"user","content":"hi"}]}'
_CHUNKED = b"%x\r\n%b\r\n0\r\n\r\n" % (len(_BODY), _BODY)


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ([("transfer-encoding", "chunked"), ("content-length", str(len(_BODY)))], _CHUNKED),
        ([("content-length", str(len(_BODY))), ("transfer-encoding", "chunked")], _CHUNKED),
        ([("transfer-encoding", "gzip, chunked")], _CHUNKED),
        ([("transfer-encoding", "chunked, gzip")], _CHUNKED),
        ([("transfer-encoding", "xchunked")], _CHUNKED),
        ([("transfer-encoding", "chunked"), ("transfer-encoding", "chunked")], _CHUNKED),
        ([("transfer-encoding", "identity")], _BODY),
        ([("content-length", f"{len(_BODY)}, {len(_BODY)}")], _BODY),
        ([("content-length", str(len(_BODY))), ("content-length", str(len(_BODY)))], _BODY),
        ([("content-length", "-1")], _BODY),
        ([("content-length", "+67")], _BODY),
    ],
    ids=[
        "te-then-cl",
        "cl-then-te",
        "gzip-chunked",
        "chunked-gzip",
        "xchunked",
        "te-twice",
        "te-identity",
        "cl-list",
        "cl-twice",
        "cl-negative",
        "cl-plus",
    ],
)
def test_framing_tricks_are_refused(
    hostile: Stack, headers: list[tuple[str, str]], body: bytes
) -> None:
    response = _exchange(
        hostile,
        rawhttp.chat_post(hostile.rs256(), headers, body=body, content_length=False),
    )
    assert response.status == 400
    assert response.error_code() == "invalid_request"
    assert worker_posts(hostile.sim) == []


def test_plain_chunked_body_is_fine(hostile: Stack) -> None:
    response = _exchange(
        hostile,
        rawhttp.chat_post(
            hostile.rs256(), [("transfer-encoding", "chunked")], body=_CHUNKED, content_length=False
        ),
    )
    assert response.status == 200


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        (b"GET /livez HTTP/1.0\r\n\r\n", 505, "http_version_not_supported"),
        (
            b"GET /livez HTTP/1.0\r\nconnection: keep-alive\r\n\r\n",
            505,
            "http_version_not_supported",
        ),
        (b"GET /livez\r\n\r\n", 505, "http_version_not_supported"),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, "invalid_request"),
        (
            b"GET /livez HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n",
            400,
            "invalid_request",
        ),
        (
            b"CONNECT 127.0.0.1:1234 HTTP/1.1\r\nhost: 127.0.0.1:1234\r\n\r\n",
            400,
            "invalid_request",
        ),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, "invalid_request"),
    ],
    ids=["http10", "http10-keepalive", "http09", "h2-preface", "h2c-upgrade", "connect", "tls"],
)
def test_other_protocols_are_refused(hostile: Stack, raw: bytes, status: int, code: str) -> None:
    response = _exchange(hostile, raw)
    assert (response.status, response.error_code()) == (status, code)
    assert response.closed
    assert worker_posts(hostile.sim) == []


# ------------------------------------------------------------ slow readers


def _stream_request(stack: Stack, request_id: str, directive: str) -> bytes:
    return rawhttp.chat_post(
        stack.rs256(),
        [("x-request-id", request_id)],
        body=rawhttp.json_body(chat_body(directive, stream=True, max_tokens=8192)),
    )


# 8000 chunks of 8 KiB: about 66 MB of stream, far more than the kernel buffers
# on both hops can hold, so the worker can only finish if the gateway buffers.
_BIG_STREAM = "[[sim chunks=8000 pad=8192]]"
_BIG_STREAM_BYTES = 8000 * 8192


def test_caller_that_stops_reading_holds_bounded_memory_and_is_cut(hostile: Stack) -> None:
    tracemalloc.start()
    try:
        sock = rawhttp.connect(_port(hostile), rcvbuf=4096)
        try:
            sock.sendall(_stream_request(hostile, "stall-1", _BIG_STREAM))
            sock.settimeout(10)
            assert sock.recv(1024).startswith(b"HTTP/1.1 200")  # then read no more
            # Another caller is served meanwhile.
            assert _served(hostile)
            receipt = hostile.receipt("stall-1", timeout_s=20)
        finally:
            sock.close()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert receipt["outcome"] == "canceled"
    assert receipt["cancellation"] == ["caller_stalled", "upstream_closed", "worker_confirmed"]

    def stalled() -> Any:
        # requests() returns snapshots: look again each time.
        (found,) = [r for r in worker_posts(hostile.sim) if r.headers["x-request-id"] == "stall-1"]
        return found

    # The gateway freed the worker (the simulator saw the connection drop) ...
    assert eventually(lambda: stalled().disconnected_at is not None)
    # ... which by then could not have written its whole stream: backpressure.
    assert 1 << 20 < stalled().bytes_sent < _BIG_STREAM_BYTES * 0.8
    # Everything in this process (gateway, simulator, client) stayed far below the stream.
    assert peak < 24 << 20, f"peak traced memory {peak / 1e6:.1f} MB"
    assert eventually(lambda: hostile.runtime.table.admissions.in_use == 0)  # its finally


def test_very_slow_reader_is_cut_by_the_total_limit(hostile: Stack) -> None:
    sock = rawhttp.connect(_port(hostile), rcvbuf=4096)
    received = 0
    ended_by_server = False
    started = time.monotonic()
    try:
        sock.sendall(_stream_request(hostile, "slow-reader-1", _BIG_STREAM))
        # Reads a little, often enough never to look idle, never fast enough to finish.
        while time.monotonic() - started < 15:
            sock.settimeout(0.2)
            try:
                data = sock.recv(2048)
            except TimeoutError:
                continue
            except ConnectionError:
                ended_by_server = True
                break
            if not data:
                ended_by_server = True
                break
            received += len(data)
            time.sleep(0.05)
    finally:
        sock.close()
    assert ended_by_server
    assert time.monotonic() - started < 10  # total_timeout_s is 4
    receipt = hostile.receipt("slow-reader-1", timeout_s=10)
    assert receipt["outcome"] == "canceled"
    assert "caller_stalled" in receipt["cancellation"]
    assert receipt["duration_ms"] < 6000
    assert received < _BIG_STREAM_BYTES / 4


def test_gateway_is_whole_after_the_hostile_run(hostile: Stack) -> None:
    """Refusals leave no task, permit or pooled connection behind."""
    port = _port(hostile)
    for raw in (b"GET /livez HTTP/1.0\r\n\r\n", b"\x00\x01garbage\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(raw)
            assert rawhttp.wait_closed(sock, 5)
    assert _served(hostile)
    runtime = hostile.runtime
    assert runtime.table.admissions.in_use == 0
    assert not runtime.inflight
    with httpx.Client(base_url=hostile.url) as client:
        assert client.get("/livez").status_code == 200
