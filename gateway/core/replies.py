"""Whole JSON replies over an ASGI ``send`` (every handler and the relay's
non-streamed answer). Pure: it awaits the callable it is given."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.types import Send


def encode_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def send_json(
    send: Send,
    status: int,
    body: Any,
    headers: Mapping[str, str] | None = None,
) -> None:
    payload = orjson.dumps(body)
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    raw_headers += encode_headers(headers or {})
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": payload})
