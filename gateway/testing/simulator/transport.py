"""One client connection: httptools parsing, a request queue, a plan player
with flow control and keep-alive comments."""

from __future__ import annotations

import asyncio
import contextlib
import http
import socket
import time
from collections import deque
from collections.abc import Iterator
from typing import cast

import httptools

from gateway.testing.simulator.channel import Incoming
from gateway.testing.simulator.core import Core
from gateway.testing.simulator.knobs import MAX_BODY_BYTES, SimKnobs
from gateway.testing.simulator.plans import Head, Op, Pause, Step, Wait
from gateway.testing.simulator.state import SimRequest

_MAX_HEAD_BYTES = 64 * 1024

_MAX_PIPELINE = 32

_FLUSH_BYTES = 64 * 1024

_HANG_LIMIT_S = 300.0

_ENDLESS_LIMIT = 512 * 1024 * 1024

_ENDLESS_BLOCK = 64 * 1024


def _frame(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class Connection(asyncio.Protocol):
    """One client connection: httptools parsing, a request queue, a plan player."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._queue: deque[Incoming] = deque()
        self._task: asyncio.Task[None] | None = None
        self._lost = False
        self._gone: asyncio.Future[None] = self._loop.create_future()
        self._broken = False
        self._reading_paused = False
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._current: SimRequest | None = None
        self._cancel_on_lost = True
        self._url = bytearray()
        self._headers: list[tuple[str, str]] = []
        self._head_bytes = 0
        self._body = bytearray()
        self._method = ""
        self._refusal: tuple[int, str] | None = None

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._core.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self._broken:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._broken = True
            status, text = self._refusal or (400, "Bad Request")
            target = self._url.decode("latin-1")
            refusal = Incoming(
                self._method or "?", target, self._headers, b"", False, (status, text)
            )
            self._enqueue(refusal)

    def eof_received(self) -> bool:
        return False  # a half-close is a goodbye: close, and let connection_lost report it

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if not self._gone.done():
            self._gone.set_result(None)
        self._core.connections.discard(self)
        if self._current is not None:
            self._core.state.update(self._current, disconnected_at=time.monotonic())
        self._wake_writer()
        if self._task is not None and self._cancel_on_lost:
            self._task.cancel()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writer()

    # -- httptools callbacks

    def on_message_begin(self) -> None:
        self._url.clear()
        self._headers = []
        self._head_bytes = 0
        self._body.clear()
        self._method = ""

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._grow_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))
        self._grow_head(len(name) + len(value))

    def on_headers_complete(self) -> None:
        self._method = self._parser.get_method().decode("latin-1")

    def on_body(self, body: bytes) -> None:
        if len(self._body) + len(body) > MAX_BODY_BYTES:
            self._refusal = (413, "request body too large")
            raise ValueError("body over limit")
        self._body += body

    def on_message_complete(self) -> None:
        keep = bool(self._parser.should_keep_alive())
        target = self._url.decode("latin-1")
        self._enqueue(Incoming(self._method, target, self._headers, bytes(self._body), keep))

    def _grow_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > _MAX_HEAD_BYTES:
            self._refusal = (431, "request header fields too large")
            raise ValueError("head over limit")

    # -- request queue

    def _enqueue(self, inc: Incoming) -> None:
        self._queue.append(inc)
        if len(self._queue) >= _MAX_PIPELINE and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()
        if self._task is None and not self._lost:
            self._task = self._loop.create_task(self._work())
            self._core.tasks.add(self._task)
            self._task.add_done_callback(self._core.tasks.discard)

    async def _work(self) -> None:
        transport = self._transport
        assert transport is not None
        try:
            while self._queue and not self._lost:
                inc = self._queue.popleft()
                if self._reading_paused and len(self._queue) < _MAX_PIPELINE // 2:
                    self._reading_paused = False
                    transport.resume_reading()
                if not await self._core.respond(self, inc) or not inc.keep_alive:
                    transport.close()  # flushes what is buffered first
                    return
        except Exception as exc:  # a simulator bug: make it loud, drop the connection
            self._loop.call_exception_handler(
                {"message": "simulator response failed", "exception": exc}
            )
            transport.abort()
        finally:
            self._task = None

    def begin(self, req: SimRequest, *, cancel_on_lost: bool) -> None:
        self._current = req
        self._cancel_on_lost = cancel_on_lost

    def end(self) -> None:
        self._current = None
        self._cancel_on_lost = True

    # -- writing

    def _wake_writer(self) -> None:
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _drain(self) -> None:
        if self._write_paused and not self._lost:
            self._drain_waiter = self._loop.create_future()
            await self._drain_waiter

    async def _flush(self, out: list[bytes], split: int) -> None:
        if not out:
            return
        data = b"".join(out)
        out.clear()
        transport = self._transport
        assert transport is not None
        if self._lost or transport.is_closing():
            return
        current = self._current
        if current is not None:
            current.bytes_sent += len(data)  # one writer; readers only poll it
        if split <= 0:
            transport.write(data)
            await self._drain()
            return
        # A high-water mark of zero makes every piece wait until the kernel took
        # it, so pieces leave in separate send() calls (TCP_NODELAY is set).
        transport.set_write_buffer_limits(high=0)
        try:
            for start in range(0, len(data), split):
                if self._lost or transport.is_closing():
                    return
                transport.write(data[start : start + split])
                await self._drain()
                await asyncio.sleep(0)
        finally:
            if not transport.is_closing():
                transport.set_write_buffer_limits()

    async def play(self, plan: Iterator[Step], knobs: SimKnobs | None, keep_alive: bool) -> bool:
        """Write a plan. True when the response ended cleanly and the connection may stay."""
        split = knobs.split if knobs else 0
        ka_ms = knobs.keepalive_ms if knobs else 0.0
        keepalive = max(ka_ms, 1.0) / 1000 if ka_ms > 0 else None
        idle = b""
        out: list[bytes] = []
        chunked = False
        sse_open = False
        last_event = self._loop.time()
        pending = 0
        for step in plan:
            if isinstance(step, bytes):
                if not chunked:
                    out.append(step)
                elif step:  # an empty chunk would be the terminator
                    out.append(_frame(step))
                pending += len(step)
                if pending >= _FLUSH_BYTES:
                    # A long burst goes out as it is made, under flow control,
                    # instead of as one write the size of the whole stream.
                    await self._flush(out, split)
                    pending = 0
            elif isinstance(step, Pause):
                await self._flush(out, split)
                if sse_open and keepalive is not None:
                    last_event = await self._idle(step.seconds, keepalive, last_event, split, idle)
                else:
                    await asyncio.sleep(step.seconds)
            elif isinstance(step, Wait):
                await self._flush(out, split)
                idle_every = keepalive if sse_open else None
                last_event = await self._wait(step, idle_every, last_event, split, idle)
            elif isinstance(step, Head):
                chunked = step.length is None
                sse_open = chunked
                idle = step.idle
                out.append(self._head(step, keep_alive))
                last_event = self._loop.time()
            elif step is Op.END:
                if chunked:
                    out.append(b"0\r\n\r\n")
                await self._flush(out, split)
                return True
            else:
                await self._flush(out, split)
                await self._finish_badly(step)
                return False
        await self._flush(out, split)
        return True

    async def _finish_badly(self, op: Op) -> None:
        transport = self._transport
        assert transport is not None
        if op is Op.HANG:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._gone), _HANG_LIMIT_S)
        elif op is Op.ENDLESS:
            block = _frame(b"x" * _ENDLESS_BLOCK)
            for _ in range(_ENDLESS_LIMIT // _ENDLESS_BLOCK):
                if self._lost or transport.is_closing():
                    break
                transport.write(block)
                if self._current is not None:
                    self._current.bytes_sent += len(block)
                await self._drain()
                await asyncio.sleep(0)  # a fast reader never pauses us; let others run
        transport.abort()

    async def _wait(
        self, step: Wait, keepalive: float | None, last_event: float, split: int, idle: bytes
    ) -> float:
        """Await ``step.until()``, writing ``idle`` after each ``keepalive`` of quiet.
        If this reply is cancelled (the client went), the awaited task is cancelled
        and allowed to clean up."""
        task = self._loop.create_task(step.until())
        try:
            # Bounded: each pass ends, or writes a keep-alive and moves last_event >= 1 ms.
            while True:
                timeout = None
                if keepalive is not None:
                    timeout = max(0.0, last_event + keepalive - self._loop.time())
                done, _ = await asyncio.wait({task}, timeout=timeout)
                if done:
                    task.result()
                    return last_event
                await self._flush([_frame(idle)], split)
                last_event = self._loop.time()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=5)

    async def _idle(
        self, seconds: float, keepalive: float, last_event: float, split: int, idle: bytes
    ) -> float:
        """Sleep ``seconds``, writing ``idle`` (the head's keep-alive event: a comment,
        or an Anthropic ``ping``) after each ``keepalive`` of quiet."""
        end = self._loop.time() + seconds
        # Bounded: each pass either finishes or moves last_event forward by >= 1 ms.
        while True:
            now = self._loop.time()
            due = last_event + keepalive
            if due >= end:
                await asyncio.sleep(max(0.0, end - now))
                return last_event
            await asyncio.sleep(max(0.0, due - now))
            await self._flush([_frame(idle)], split)
            last_event = self._loop.time()

    def _head(self, head: Head, keep_alive: bool) -> bytes:
        try:
            reason = http.HTTPStatus(head.status).phrase
        except ValueError:
            reason = "Unknown"
        lines = [f"HTTP/1.1 {head.status} {reason}\r\n"]
        lines += [f"{name}: {value}\r\n" for name, value in head.headers]
        if head.length is None:
            lines.append("transfer-encoding: chunked\r\n")
        else:
            lines.append(f"content-length: {head.length}\r\n")
        if not keep_alive:
            lines.append("connection: close\r\n")
        lines.append(f"date: {self._core.date()}\r\n\r\n")
        return "".join(lines).encode("utf-8")

    def shutdown(self) -> None:
        if self._transport is not None:
            self._transport.abort()
