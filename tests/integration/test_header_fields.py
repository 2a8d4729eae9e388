"""A request head with more than 100 header fields is 431 ``headers_too_large``
before authentication (spec §21), on the listener's own protocol
(gateway/http/protocol.py) under uvicorn on 127.0.0.1, over raw sockets.

The byte cap stays the default (32 KiB), so 5,000 empty fields fit in it: only
the field count refuses them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.core.errors import GatewayError
from gateway.http.protocol import LimitedHttpProtocol
from tests.support import rawhttp
from tests.support.stack import Stack, chat_body, running_stack, worker_posts

#: fields rawhttp.chat_post always sends: host, authorization, content-type,
#: x-request-id (given below) and content-length
_FIXED_FIELDS = 5


@pytest.fixture
def stack(tmp_path: Path, _dev_secret: None) -> Iterator[Stack]:
    with running_stack(
        tmp_path,
        acme={"limits": {"max_output_tokens": 512, "requests_per_minute": 100_000}},
    ) as running:
        yield running


def _port(stack: Stack) -> int:
    return int(stack.url.rsplit(":", 1)[1])


def _exchange(stack: Stack, raw: bytes, close_wait_s: float = 0.5) -> rawhttp.Response:
    sock = rawhttp.connect(_port(stack))
    try:
        sock.sendall(raw)
        return rawhttp.read_response(sock, close_wait_s=close_wait_s)
    finally:
        sock.close()


def _chat_with_fields(stack: Stack, total: int, request_id: str) -> bytes:
    filler = [(f"x-f{i}", "v") for i in range(total - _FIXED_FIELDS)]
    raw = rawhttp.chat_post(
        stack.rs256(),
        [("x-request-id", request_id), *filler],
        body=rawhttp.json_body(chat_body()),
    )
    assert raw.split(b"\r\n\r\n", 1)[0].count(b"\r\n") == total  # the request line's CRLF
    return raw


class _AuthSpy:
    """Counts the app's authentication attempts (the gateway runs in this process)."""

    def __init__(self, stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        auth = stack.runtime.auth
        real = auth.authenticate

        async def counting(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await real(*args, **kwargs)

        monkeypatch.setattr(auth, "authenticate", counting)


def test_101_fields_are_431_before_authentication(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _AuthSpy(stack, monkeypatch)
    refused = stack.metric("gateway_rejections_total", tenant="-", code="headers_too_large")
    response = _exchange(stack, _chat_with_fields(stack, 101, "fields-101"))
    assert response.status == 431
    assert response.header("content-type") == "application/json"
    assert orjson.loads(response.body) == GatewayError("headers_too_large").body()
    assert response.error_code() == "headers_too_large"
    assert response.header("connection") == "close" and response.closed
    assert spy.calls == 0, "the app never saw the request"
    assert worker_posts(stack.sim) == []
    assert (
        stack.metric("gateway_rejections_total", tenant="-", code="headers_too_large")
        == refused + 1
    )
    # A request served after it has its receipt; the refused one has none.
    served = _exchange(stack, _chat_with_fields(stack, 100, "fields-after"))
    assert served.status == 200
    stack.receipt("fields-after")
    assert [r for r in stack.receipts() if r["request_id"] == "fields-101"] == []


def test_100_fields_are_served(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _AuthSpy(stack, monkeypatch)
    response = _exchange(stack, _chat_with_fields(stack, 100, "fields-100"))
    assert response.status == 200
    assert spy.calls == 1
    assert stack.receipt("fields-100")["outcome"] == "complete"
    assert len(worker_posts(stack.sim)) == 1


def test_the_count_restarts_with_each_message_on_a_connection(stack: Stack) -> None:
    sock = rawhttp.connect(_port(stack))
    try:
        for index in range(3):  # 3 x 100 fields on one kept-alive connection
            sock.sendall(_chat_with_fields(stack, 100, f"fields-kept-{index}"))
            assert rawhttp.read_response(sock, close_wait_s=0).status == 200
        sock.sendall(_chat_with_fields(stack, 101, "fields-kept-over"))
        assert rawhttp.read_response(sock).status == 431
    finally:
        sock.close()


# -------------------------------------------- what 5,000 empty fields cost


def _thread_cpu_s(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def _cpu_per_request(stack: Stack, raw: bytes, count: int) -> tuple[float, set[int]]:
    """The gateway thread's CPU seconds per request, and the statuses seen."""
    thread = stack.gw.server.thread
    statuses: set[int] = set()
    before = _thread_cpu_s(thread)
    for _ in range(count):
        # No waiting for the close: the readiness poll's CPU stays out of the figure.
        statuses.add(_exchange(stack, raw, close_wait_s=0).status)
    return (_thread_cpu_s(thread) - before) / count, statuses


def test_5000_empty_fields_cost_a_hundred_parser_callbacks_not_the_app(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A figure, not a timed assertion: the gateway thread's CPU per request of
    5,000 empty fields (no credentials), without the count (as before spec §21)
    and with it."""
    empty = [("a", "")] * 5000
    raw = rawhttp.chat_post(None, empty, body=rawhttp.json_body(chat_body()))
    assert len(raw) < 32_768  # within the byte cap: only the count refuses it
    plain = rawhttp.chat_post(None, body=rawhttp.json_body(chat_body()))
    count = 200
    with monkeypatch.context() as patch:
        patch.setattr(LimitedHttpProtocol, "max_header_fields", 1 << 30)
        without_cap, before_statuses = _cpu_per_request(stack, raw, count)
    with_cap, after_statuses = _cpu_per_request(stack, raw, count)
    reference, plain_statuses = _cpu_per_request(stack, plain, count)
    assert before_statuses == {401}  # the app parsed all of them, then refused the caller
    assert after_statuses == {431}
    assert plain_statuses == {401}
    print(
        f"\ngateway CPU per request, 5,000 empty header fields ({len(raw)} bytes),"
        f" {count} requests each:"
        f"\n  without the count (before): {without_cap * 1e3:.3f} ms (401 from the app)"
        f"\n  with the count (after):     {with_cap * 1e3:.3f} ms (431 at field 101)"
        f"\n  reference, no extra fields: {reference * 1e3:.3f} ms (401 from the app)"
        f"\n  before / after: {without_cap / max(with_cap, 1e-9):.1f}x"
    )
