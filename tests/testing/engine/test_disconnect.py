"""A caller that leaves mid-stream stops the engine: counted as dropped, and the CPU falls back.

The small (~25M-parameter) model keeps both cores busy while it decodes, so
whether decoding stopped shows in the adapter process's CPU (``/proc``).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from tests.support import rawhttp
from tests.support.engine import EngineAdapter, chat_body, cpu_rate, running_adapter
from tests.support.poll import eventually

_BUSY = 0.5  # cores: decoding uses about two here; idle is zero
_IDLE = 0.1


@pytest.fixture(scope="module")
def small() -> Iterator[EngineAdapter]:
    with running_adapter("small") as adapter:
        yield adapter


def _open_stream(adapter: EngineAdapter, max_tokens: int) -> tuple[socket.socket, bytes]:
    sock = rawhttp.connect(adapter.port)
    body = json.dumps(chat_body(max_tokens=max_tokens, stream=True)).encode()
    sock.sendall(rawhttp.chat_post(None, body=body))
    received = b""
    sock.settimeout(60)
    while received.count(b"\ndata: {") < 5:  # headers, then a few chunks
        data = sock.recv(65536)
        assert data, "the adapter closed the stream early"
        received += data
    return sock, received


def test_a_dropped_stream_is_counted_and_decoding_stops(small: EngineAdapter) -> None:
    before = small.stats()
    sock, received = _open_stream(small, max_tokens=1900)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    try:
        busy = cpu_rate(small.pid)
        assert small.stats()["active_streams"] == 1
    finally:
        sock.close()
    assert busy > _BUSY  # the engine was decoding for this stream

    expected = int(before["streams_dropped"]) + 1

    def dropped() -> bool:
        return int(small.stats()["streams_dropped"]) == expected

    assert eventually(dropped, timeout_s=10)
    after = small.stats()
    assert (after["active_streams"], after["open_streamers"]) == (0, 0)
    assert after["streams_finished"] == before["streams_finished"]
    assert eventually(lambda: cpu_rate(small.pid) < _IDLE, timeout_s=10)


def test_after_a_drop_the_engine_serves_the_next_stream_whole(small: EngineAdapter) -> None:
    sock, _ = _open_stream(small, max_tokens=1900)
    sock.close()
    assert eventually(lambda: small.stats()["open_streamers"] == 0, timeout_s=10)
    finished = small.stats()["streams_finished"]
    answer_sock = rawhttp.connect(small.port)
    try:
        body = json.dumps(chat_body(max_tokens=8, stream=True)).encode()
        answer_sock.sendall(rawhttp.chat_post(None, body=body))
        answer = rawhttp.read_response(answer_sock, timeout_s=60, close_wait_s=0)
    finally:
        answer_sock.close()
    assert answer.status == 200
    assert answer.body.endswith(b"data: [DONE]\n\n")
    assert small.stats()["streams_finished"] == finished + 1
