"""Raw-socket HTTP/1.1 for hostile-client tests: bytes no well-behaved client sends.

Every read has a deadline; sockets only ever connect to 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import httptools


@dataclass
class Response:
    status: int = 0
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    closed: bool = False  # the server closed the connection after it

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k == name]
        return values[0] if values else None

    def error_code(self) -> str | None:
        code: str | None = json.loads(self.body)["error"]["code"]
        return code


class _Parser:
    def __init__(self) -> None:
        self.response = Response()
        self.done = False
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.response.headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.response.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.response.body += body

    def on_message_complete(self) -> None:
        self.done = True


def connect(port: int, *, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        # Before connect, so the window is small from the start (no autotuning).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    return sock


def read_response(sock: socket.socket, timeout_s: float = 10, close_wait_s: float = 2) -> Response:
    """One response; then whether the server closes the connection (waited for briefly)."""
    parser = _Parser()
    deadline = time.monotonic() + timeout_s
    while not parser.done:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no complete response in time")
        sock.settimeout(remaining)
        data = sock.recv(65536)
        if not data:
            parser.response.closed = True
            break
        parser.parser.feed_data(data)
    if not parser.response.closed and close_wait_s > 0:
        parser.response.closed = wait_closed(sock, close_wait_s)
    return parser.response


def wait_closed(sock: socket.socket, timeout_s: float) -> bool:
    """True once the server closed (EOF or reset) within the deadline; bytes are dropped."""
    deadline = time.monotonic() + timeout_s
    while (remaining := deadline - time.monotonic()) > 0:
        sock.settimeout(remaining)
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except ConnectionError:
            return True
    return False


def request(
    method: str,
    path: str,
    *,
    headers: list[tuple[str, str]] | None = None,
    body: bytes = b"",
    version: str = "HTTP/1.1",
    content_length: bool = True,
) -> bytes:
    lines = [f"{method} {path} {version}", "host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in headers or []]
    if content_length and body:
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def json_body(value: Any) -> bytes:
    return json.dumps(value).encode()


def chat_post(
    token: str | None,
    headers: list[tuple[str, str]] | None = None,
    *,
    body: bytes = b"",
    content_length: bool = True,
) -> bytes:
    """``POST /v1/chat/completions`` with a bearer ``token`` (if any), a JSON
    content type and ``headers``; ``content_length=False`` leaves framing to them."""
    auth = [("authorization", f"Bearer {token}")] if token is not None else []
    return request(
        "POST",
        "/v1/chat/completions",
        headers=[*auth, ("content-type", "application/json"), *(headers or [])],
        body=body,
        content_length=content_length,
    )
