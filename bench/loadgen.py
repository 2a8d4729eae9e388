"""A lean HTTP/1.1 load client for SSE streams: raw asyncio, keep-alive connections.

Theory of operation: one :class:`_Conn` protocol per TCP connection plays one
request at a time. It parses the response head, then a chunked (or
``content-length``) body, and watches the body bytes for the first content
event (TTFT: :data:`CHAT_CONTENT` for chat and completion chunks,
:data:`RESPONSES_CONTENT` for the Responses named events) and for the final
``data: [DONE]``, which ends both. Every buffer is bounded; EOF
or a parse failure fails the request in flight. :func:`run_load` spreads a
fixed number of requests over ``concurrency`` connections, bounded in count
and in time. Only 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

#: the first chat chunk with text: ``"content":"`` and a character
CHAT_CONTENT = re.compile(rb'"content":"[^"]')
#: the first Responses ``response.output_text.delta`` event with a non-empty delta
RESPONSES_CONTENT = re.compile(
    rb'event: ?response\.output_text\.delta\r?\ndata: ?\{[^\r\n]*?"delta":"[^"]'
)
#: the first Anthropic ``text_delta`` with text
MESSAGES_CONTENT = re.compile(rb'"text_delta","text":"[^"]')
#: how a valid stream ends: chat, completions and Responses; Anthropic Messages
DONE_TAIL = b"data: [DONE]\n\n"
MESSAGES_TAIL = b'data: {"type":"message_stop"}\n\n'
_MAX_HEAD = 65_536
_MAX_BUFFER = 16 * 1024 * 1024
_TAIL = 64
#: bytes kept across body chunks until the first content event (an event split
#: between two chunks is still seen); bounded
_SCAN_TAIL = 4096


NOT_SENT = "not sent (time budget)"


@dataclass(slots=True)
class Result:
    status: int = 0
    ttft_s: float | None = None
    duration_s: float = 0.0
    done: bool = False
    error: str | None = None

    @property
    def sent(self) -> bool:
        return self.error != NOT_SENT


class _ProtocolError(Exception):
    pass


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[Result] | None = None
        self.result = Result()
        self.sent_at = 0.0
        self.state = "idle"  # idle | head | chunked | length
        self.remaining = 0
        self.tail = b""
        self.scan = b""
        self.first_content = CHAT_CONTENT
        self.done_tail = DONE_TAIL
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail("connection closed")

    def request(
        self,
        payload: bytes,
        first_content: re.Pattern[bytes] = CHAT_CONTENT,
        done_tail: bytes = DONE_TAIL,
    ) -> asyncio.Future[Result]:
        assert self.transport is not None and self.state == "idle"
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        self.result = Result()
        self.tail = self.scan = b""
        self.first_content = first_content
        self.done_tail = done_tail
        self.state = "head"
        self.sent_at = time.perf_counter()
        self.transport.write(payload)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        if self.state == "idle":
            return  # nothing in flight: ignore (a server would not send unasked)
        self.buf += data
        if len(self.buf) > _MAX_BUFFER:
            self._fail("response buffer over limit")
            return
        try:
            self._parse()
        except (_ProtocolError, ValueError) as exc:
            self._fail(f"protocol: {exc}")

    def _parse(self) -> None:
        buf = self.buf
        if self.state == "head":
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    raise _ProtocolError("head too large")
                return
            head = bytes(buf[:end]).split(b"\r\n")
            del buf[: end + 4]
            self.result.status = int(head[0].split(b" ", 2)[1])
            chunked, length = False, 0
            for line in head[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
                elif name == b"content-length":
                    length = int(value)
            if chunked:
                self.state = "chunked"
            else:
                self.state, self.remaining = "length", length
        if self.state == "length":
            take = min(self.remaining, len(buf))
            self._body(bytes(buf[:take]))
            del buf[:take]
            self.remaining -= take
            if self.remaining == 0:
                self._finish()
            return
        pos = 0
        while True:
            line_end = buf.find(b"\r\n", pos)
            if line_end < 0:
                break
            size = int(bytes(buf[pos:line_end]).split(b";", 1)[0], 16)
            start = line_end + 2
            if size == 0:
                if len(buf) < start + 2:
                    break
                pos = start + 2  # no trailers expected
                del buf[:pos]
                self._finish()
                return
            if len(buf) < start + size + 2:
                break
            self._body(bytes(buf[start : start + size]))
            pos = start + size + 2
        if pos:
            del buf[:pos]

    def _body(self, data: bytes) -> None:
        if self.result.ttft_s is None:
            scan = self.scan + data
            if self.first_content.search(scan):
                self.result.ttft_s = time.perf_counter() - self.sent_at
                self.scan = b""
            else:
                self.scan = scan[-_SCAN_TAIL:]
        self.tail = (self.tail + data)[-_TAIL:]

    def _finish(self) -> None:
        result = self.result
        result.duration_s = time.perf_counter() - self.sent_at
        result.done = self.tail.endswith(self.done_tail)
        if result.status != 200:
            result.error = f"status {result.status}"
        elif not result.done:
            result.error = "no [DONE]"
        self.state = "idle"
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(result)

    def _fail(self, why: str) -> None:
        self.state = "idle"
        self.buf.clear()
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            self.result.error = why
            self.result.duration_s = time.perf_counter() - self.sent_at
            waiter.set_result(self.result)
        if self.transport is not None and not self.closed:
            self.transport.close()


@dataclass
class LoadResult:
    results: list[Result] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> list[Result]:
        return [r for r in self.results if r.error is None]

    def errors(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.results:
            if r.error is not None:
                counts[r.error] = counts.get(r.error, 0) + 1
        return counts


async def _connect(port: int) -> _Conn:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(_Conn, "127.0.0.1", port)
    return conn


async def open_connections(port: int, count: int) -> list[_Conn]:
    """Kept-alive connections to share between runs (warm-up, then measured)."""
    return list(await asyncio.gather(*(_connect(port) for _ in range(count))))


def close_connections(conns: list[_Conn]) -> None:
    for conn in conns:
        if conn.transport is not None:
            conn.transport.close()


async def run_load(
    port: int,
    payload_for: Callable[[int], bytes],
    *,
    total: int,
    concurrency: int,
    request_timeout_s: float,
    budget_s: float,
    connections: list[_Conn] | None = None,
    first_content: re.Pattern[bytes] = CHAT_CONTENT,
    done_tail: bytes = DONE_TAIL,
) -> LoadResult:
    """``total`` requests over ``concurrency`` kept-alive connections, within ``budget_s``.

    ``first_content`` finds the first content event (TTFT) in the body bytes.

    With ``connections`` (at least ``concurrency`` of them) those are used and
    left open, replacing any that closed; otherwise new ones are opened and
    closed at the end.
    """
    concurrency = max(1, min(concurrency, total))
    owned = connections is None
    conns = connections if connections is not None else await open_connections(port, concurrency)
    out = LoadResult()
    next_index = 0
    stop_at = time.perf_counter() + budget_s

    async def worker(slot: int) -> None:
        nonlocal next_index
        conn = conns[slot]
        while next_index < total and time.perf_counter() < stop_at:
            index = next_index
            next_index += 1
            if conn.closed:
                try:
                    conn = await asyncio.wait_for(_connect(port), 5)
                except (OSError, TimeoutError):
                    out.results.append(Result(error="connect failed"))
                    continue
            waiter = conn.request(payload_for(index), first_content, done_tail)
            try:
                result = await asyncio.wait_for(asyncio.shield(waiter), request_timeout_s)
            except TimeoutError:
                conn._fail("timeout")
                result = waiter.result()
            out.results.append(result)
        conns[slot] = conn

    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    finally:
        out.wall_s = time.perf_counter() - started
        if owned:
            close_connections(conns)
    skipped = total - len(out.results)
    out.results.extend(Result(error=NOT_SENT) for _ in range(skipped))
    return out


def http_post(port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """The raw bytes of one keep-alive POST request."""
    lines = [f"POST {path} HTTP/1.1", f"host: 127.0.0.1:{port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += ["content-type: application/json", f"content-length: {len(body)}", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body
