"""Raw loopback HTTP for the simulator's tests: exact bytes, chunk frames, SSE events.

Every read has a socket timeout; only 127.0.0.1 is ever dialled.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from dataclasses import dataclass
from typing import Any


@dataclass
class Raw:
    status: int
    headers: list[tuple[str, str]]
    head_bytes: int
    frames: list[bytes]  # chunk payloads, in order
    body: bytes  # de-chunked (or the raw body when not chunked)
    terminated: bool  # chunked terminator seen (or content-length satisfied)
    ending: str  # "eof" | "reset" | "timeout"

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k == name]
        return values[0] if values else None

    def events(self) -> list[bytes]:
        return [e for e in self.body.split(b"\n\n") if e]

    def chunks(self) -> list[dict[str, Any]]:
        return [json.loads(e[6:]) for e in self.events() if e.startswith(b"data: {")]


def exchange(port: int, request: bytes, timeout: float = 5.0, limit: int = 1 << 22) -> bytes:
    """Send raw bytes; read until the server closes, resets, goes quiet, or ``limit``."""
    received = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        try:
            while len(received) < limit:
                data = sock.recv(65536)
                if not data:
                    break
                received += data
        except (TimeoutError, ConnectionResetError):
            pass
    return bytes(received)


def read_raw(port: int, request: bytes, timeout: float = 5.0) -> Raw:
    received = bytearray()
    ending = "eof"
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        try:
            while len(received) < 1 << 22:
                data = sock.recv(65536)
                if not data:
                    break
                received += data
        except TimeoutError:
            ending = "timeout"
        except ConnectionResetError:
            ending = "reset"
    return parse(bytes(received), ending)


def parse(raw: bytes, ending: str = "eof") -> Raw:
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return Raw(0, [], len(raw), [], b"", False, ending)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = [(k.lower(), v.strip()) for k, _, v in (ln.partition(":") for ln in lines[1:])]
    if ("transfer-encoding", "chunked") not in headers:
        length = dict(headers).get("content-length")
        done = length is not None and len(rest) == int(length)
        return Raw(status, headers, len(head) + 4, [rest], rest, done, ending)
    frames: list[bytes] = []
    terminated = False
    pos = 0
    while pos < len(rest):  # bounded: pos advances every pass or we break
        size_end = rest.find(b"\r\n", pos)
        if size_end < 0:
            break
        size = int(rest[pos:size_end], 16)
        if size == 0:
            terminated = rest[size_end : size_end + 4] == b"\r\n\r\n"
            break
        start = size_end + 2
        if len(rest) < start + size:
            frames.append(rest[start:])  # a partial frame (endless_line, hang)
            break
        frames.append(rest[start : start + size])
        pos = start + size + 2
    return Raw(status, headers, len(head) + 4, frames, b"".join(frames), terminated, ending)


def http_request(
    path: str,
    body: dict[str, Any] | bytes | None = None,
    *,
    method: str = "POST",
    headers: dict[str, str] | None = None,
    close: bool = True,
) -> bytes:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode() if body else b""
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1"]
    if body is not None:
        lines += ["content-type: application/json", f"content-length: {len(payload)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if close:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


@dataclass(frozen=True)
class Event:
    """One SSE event of a named-event stream (``name`` None: a bare ``data:`` event)."""

    name: str | None
    data: bytes

    def json(self) -> Any:
        return json.loads(self.data)


def sse_events(body: bytes) -> list[Event]:
    """The events of an SSE body, keep-alive comments left out."""
    events: list[Event] = []
    for block in body.split(b"\n\n"):
        if not block or block.startswith(b":"):
            continue
        name: str | None = None
        data: list[bytes] = []
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                data.append(line[6:])
        events.append(Event(name, b"\n".join(data)))
    return events


class Streaming:
    """A request on a raw loopback socket whose response is read on a thread, so a test
    can act mid-stream (post an approval, hang up). Every wait has a deadline."""

    def __init__(self, port: int, request: bytes, timeout: float = 10.0) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self._sock.sendall(request)
        self._received = bytearray()
        self._cond = threading.Condition()
        self._ending: str | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        ending = "eof"
        try:
            while len(self._received) < 1 << 26:
                data = self._sock.recv(65536)
                if not data:
                    break
                with self._cond:
                    self._received += data
                    self._cond.notify_all()
        except TimeoutError:
            ending = "timeout"
        except OSError:
            ending = "reset"
        with self._cond:
            self._ending = ending
            self._cond.notify_all()

    def wait_for(self, needle: bytes, timeout: float = 5.0) -> bool:
        """True once ``needle`` arrived; False at the deadline or the end of the stream."""
        with self._cond:
            self._cond.wait_for(
                lambda: needle in self._received or self._ending is not None, timeout
            )
            return needle in self._received

    def events(self) -> list[Event]:
        with self._cond:
            raw = bytes(self._received)
        return sse_events(parse(raw).body)

    def hang_up(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(5)

    def result(self, timeout: float = 10.0) -> Raw:
        self._thread.join(timeout)
        self._sock.close()
        with self._cond:
            return parse(bytes(self._received), self._ending or "timeout")
