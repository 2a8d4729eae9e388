"""BodyWriter: a streamed body's frames written as uvicorn's ``send`` writes them.

Each test drives a real uvicorn ``RequestResponseCycle`` over a recording
transport: the head through ``send``, then body frames through the writer
and through ``send``, and compares the bytes."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.http.bodywriter import BodyWriter

SSE_HEAD = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/event-stream")],
}
FRAMES = [b"data: {}\n\n", b"", b"data: " + b"x" * 5000 + b"\n\n", b":\n\n"]


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.paused_reading = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:  # pragma: no cover - not reached here
        raise AssertionError("closed")

    def pause_reading(self) -> None:
        self.paused_reading = True

    def resume_reading(self) -> None:
        self.paused_reading = False

    def get_extra_info(self, name: str) -> Any:
        return None


def _cycle(method: str = "POST") -> tuple[Any, _Transport, FlowControl]:
    """A cycle (typed Any: its send takes TypedDict messages), its transport and flow."""
    transport = _Transport()
    flow = FlowControl(cast(asyncio.Transport, transport))
    log = logging.getLogger("test.bodywriter")
    cycle = RequestResponseCycle(
        scope=cast(
            Any, {"method": method, "http_version": "1.1", "path": "/", "query_string": b""}
        ),
        transport=cast(asyncio.Transport, transport),
        flow=flow,
        logger=log,
        access_logger=log,
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )
    return cycle, transport, flow


async def test_frames_are_the_bytes_send_writes() -> None:
    via_send, sent, _ = _cycle()
    direct, written, _ = _cycle()
    await via_send.send(SSE_HEAD)
    await direct.send(SSE_HEAD)
    writer = BodyWriter(direct)
    assert writer.ready()
    for frame in FRAMES:
        await via_send.send({"type": "http.response.body", "body": frame, "more_body": True})
        writer.write(frame)
    # The terminator still goes through send on both.
    for cycle in (via_send, direct):
        await cycle.send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
    # Byte for byte (send also writes an empty buffer for an empty frame,
    # which the corked transport ignores; the writer writes nothing).
    assert b"".join(written.writes) == b"".join(sent.writes)
    assert [w for w in written.writes if w] == [w for w in sent.writes if w]
    assert b"".join(written.writes).endswith(b"\r\n0\r\n\r\n")
    assert direct.response_complete and not writer.ready()


async def test_not_ready_before_the_head_or_for_a_sized_body() -> None:
    cycle, _, _ = _cycle()
    writer = BodyWriter(cycle)
    assert not writer.ready()
    sized, _, _ = _cycle()
    headers = [(b"content-length", b"2")]
    await sized.send({"type": "http.response.start", "status": 200, "headers": headers})
    assert not BodyWriter(sized).ready()
    head, _, _ = _cycle("HEAD")
    await head.send(SSE_HEAD)
    assert not BodyWriter(head).ready()


async def test_paused_while_the_callers_buffer_is_full_and_drain_waits_for_it() -> None:
    cycle, _, flow = _cycle()
    await cycle.send(SSE_HEAD)
    writer = BodyWriter(cycle)
    assert not writer.paused
    flow.pause_writing()
    assert writer.paused
    drain = asyncio.ensure_future(writer.drain())
    await asyncio.sleep(0)
    assert not drain.done()
    flow.resume_writing()
    async with asyncio.timeout(2):
        await drain
    assert not writer.paused


@pytest.mark.parametrize("paused", [False, True])
async def test_a_frame_for_a_caller_gone_is_dropped(paused: bool) -> None:
    cycle, transport, flow = _cycle()
    await cycle.send(SSE_HEAD)
    writer = BodyWriter(cycle)
    if paused:
        flow.pause_writing()
    cycle.disconnected = True
    # Nothing to wait for (send returns at once for a caller gone), nothing written.
    assert not writer.paused
    before = list(transport.writes)
    writer.write(b"data: {}\n\n")
    assert transport.writes == before
