"""The ~25M-parameter model through the gateway: a caller that leaves, and 1 ms keep-alives.

The small model keeps both cores busy while it decodes, so whether the engine
stopped shows in the adapter process's CPU (``/proc``, polled with a
deadline). The adapter here sends a keep-alive after 1 ms without a chunk,
so comments fall between nearly all of its chunks.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator

import pytest

from tests.support import rawhttp
from tests.support.engine import EngineAdapter, chat_body, cpu_rate, running_adapter
from tests.support.engine_stack import (
    ALIAS,
    EngineStack,
    gateway_body,
    running_engine_stack,
    stream_raw,
    worker_bytes,
)
from tests.support.poll import eventually

_BUSY = 0.25  # cores: decoding uses up to two here (less on a shared machine); idle is zero
_IDLE = 0.1


@pytest.fixture(scope="module")
def small(dev_secret: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineStack]:
    with (
        running_adapter("small", keepalive_ms=1) as adapter,
        running_engine_stack(tmp_path_factory.mktemp("small"), adapter) as stack,
    ):
        yield stack


def _open_stream(stack: EngineStack, request_id: str, max_tokens: int) -> socket.socket:
    """A raw streaming request through the gateway; returns once a few chunks arrived."""
    sock = rawhttp.connect(stack.gw.server.port)
    body = json.dumps(gateway_body(chat_body(max_tokens=max_tokens, stream=True))).encode()
    sock.sendall(rawhttp.chat_post(stack.rs256(), [("x-request-id", request_id)], body=body))
    received = b""
    sock.settimeout(60)
    while received.count(b"data: {") < 5:  # headers, then a few chunks
        data = sock.recv(65536)
        assert data, "the gateway closed the stream early"
        received += data
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    return sock


def test_a_caller_that_leaves_stops_the_engine(small: EngineStack) -> None:
    adapter: EngineAdapter = small.adapter
    before = adapter.stats()
    request_id = "lane-leaves-" + os.urandom(4).hex()
    sock = _open_stream(small, request_id, max_tokens=500)
    try:
        busy = cpu_rate(adapter.pid)
        assert adapter.stats()["active_streams"] == 1
    finally:
        sock.close()
    assert busy > _BUSY, busy  # the engine was decoding for this stream

    dropped = int(before["streams_dropped"]) + 1
    assert eventually(lambda: int(adapter.stats()["streams_dropped"]) == dropped, timeout_s=10)
    after = adapter.stats()
    assert (after["active_streams"], after["open_streamers"]) == (0, 0)
    assert after["streams_finished"] == before["streams_finished"]
    assert eventually(lambda: cpu_rate(adapter.pid) < _IDLE, timeout_s=10)

    receipt = small.receipt(request_id, timeout_s=10)
    assert receipt["outcome"] == "canceled"
    assert receipt["cancellation"] == ["caller_disconnected", "upstream_closed", "worker_confirmed"]
    assert receipt["usage"]["source"] == "estimated"
    assert small.metric("gateway_permits_in_use") == 0


def test_keepalives_every_millisecond_break_nothing(small: EngineStack) -> None:
    adapter = small.adapter
    before = adapter.stats()
    body = gateway_body(chat_body(max_tokens=160, stream_options={"include_usage": True}))
    via = stream_raw(small.url, body, small.headers())
    assert via.status == 200
    stream = via.stream
    assert stream.events[-1] == "[DONE]" and stream.events.count("[DONE]") == 1
    assert stream.keepalives > len(stream.chunks) // 2  # between most chunks
    first_chunk = stream.raw.index(b"data: {")
    assert b"}\n\n:\n\n" in stream.raw[first_chunk:]  # between chunks, not only before
    # every chunk and every keep-alive the worker sent, byte for byte
    receipt = small.receipt(via.request_id)
    sent = worker_bytes(stream.raw, adapter.route, receipt)
    assert hashlib.sha256(sent).hexdigest() == receipt["stream_sha256"]
    after = adapter.stats()
    assert after["chunks_streamed"] - before["chunks_streamed"] == len(stream.chunks)
    assert stream.chunks[-1]["usage"]["completion_tokens"] == 160
    assert receipt["outcome"] == "length"

    # the official SDK reads the same kind of stream to the end
    with small.openai() as client:
        chunks = list(
            client.chat.completions.create(
                model=ALIAS,
                messages=[{"role": "user", "content": "Say something."}],
                max_tokens=16,
                temperature=0,
                stream=True,
            )
        )
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(chunk.model == ALIAS for chunk in chunks)


def test_a_caller_leaving_during_prefill_keeps_the_permit_until_the_engine_lets_go(
    small: EngineStack,
) -> None:
    """Spec §20 on the real engine: a long prompt, the caller gone before its
    first token. The adapter's /metrics is the SDK's view (docs/engine-lane.md):
    the sequence runs while its streamer is open."""
    adapter: EngineAdapter = small.adapter
    request_id = "lane-prefill-" + os.urandom(4).hex()
    prompt = " ".join(f"word{n % 97}" for n in range(400))  # well inside the 2,048 context
    body = gateway_body(
        chat_body(messages=[{"role": "user", "content": prompt}], max_tokens=400, stream=True)
    )
    payload = json.dumps(body).encode()
    sock = rawhttp.connect(small.gw.server.port)
    try:
        sock.sendall(rawhttp.chat_post(small.rs256(), [("x-request-id", request_id)], body=payload))
        started = eventually(lambda: adapter.stats()["active_streams"] == 1, timeout_s=30)
        if not started:
            sock.settimeout(5)
            print(sock.recv(4096))
        assert started
    finally:
        sock.close()
    left = time.monotonic()
    streamer_gone: list[float] = []
    permit_back: list[float] = []
    deadline = left + 60
    while time.monotonic() < deadline and not (streamer_gone and permit_back):
        now = time.monotonic()
        if not streamer_gone and adapter.stats()["open_streamers"] == 0:
            streamer_gone.append(now)
        if not permit_back and small.metric("gateway_permits_in_use") == 0:
            permit_back.append(now)
        time.sleep(0.005)
    assert streamer_gone and permit_back
    receipt = small.receipt(request_id, timeout_s=10)
    assert receipt["outcome"] == "canceled"
    assert receipt["cancellation"][-1] == "worker_confirmed"
    # The permit went back after the engine dropped the sequence (one 100 ms
    # poll later at most, plus this loop's own 5 ms step).
    assert permit_back[0] >= streamer_gone[0] - 0.01
    print(
        f"engine let go {1000 * (streamer_gone[0] - left):.0f} ms after the caller left; "
        f"permit back after {1000 * (permit_back[0] - left):.0f} ms"
    )
