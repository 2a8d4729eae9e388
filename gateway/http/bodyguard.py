"""Request-body guards: size and time while reading, then JSON parse with a depth bound.

The body limit is enforced as bytes arrive: a ``Content-Length`` above it is
refused before anything is read, and a chunked body is refused as soon as the
running total passes it (413 ``body_too_large``), so an oversized body is
never buffered whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.core.errors import GatewayError
from gateway.http.asgi import header
from gateway.pipeline.deadline import Deadline
from gateway.types import Receive


class ClientDisconnected(Exception):
    """The caller went away while we were reading its body."""


async def read_body(scope: dict[str, Any], receive: Receive, limit: int, timeout_s: float) -> bytes:
    """The whole body, or a refusal; it must arrive within ``timeout_s`` (a caller
    trickling a body holds a task and a buffer, so not for long)."""
    check_framing(scope, limit)
    pieces: list[bytes] = []
    size = 0
    try:
        # One timer for the whole read (the body is usually in hand already).
        async with Deadline(asyncio.get_running_loop().time() + timeout_s):
            more = True
            while more:
                chunk, more = _taken(await receive())
                size = _counted(size, chunk, limit)
                pieces.append(chunk)
    except TimeoutError as exc:
        raise _timed_out() from exc
    return b"".join(pieces)


async def body_pieces(
    scope: dict[str, Any], receive: Receive, limit: int, timeout_s: float
) -> AsyncIterator[bytes]:
    """The body as it arrives (uploads go to disk piece by piece), under the same
    framing, size and time rules as :func:`read_body`."""
    check_framing(scope, limit)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    size = 0
    more = True
    while more:
        try:
            # Per message: the consumer's own work between pieces is not timed here.
            async with asyncio.timeout_at(deadline):
                message = await receive()
        except TimeoutError as exc:
            raise _timed_out() from exc
        chunk, more = _taken(message)
        size = _counted(size, chunk, limit)
        if chunk:
            yield chunk


def _taken(message: dict[str, Any]) -> tuple[bytes, bool]:
    """A body message's bytes and whether more follow."""
    if message["type"] == "http.disconnect":
        raise ClientDisconnected
    return message.get("body", b""), bool(message.get("more_body", False))


def _counted(size: int, chunk: bytes, limit: int) -> int:
    size += len(chunk)
    if size > limit:
        raise GatewayError("body_too_large")
    return size


def _timed_out() -> GatewayError:
    # The rest of the body may still be in flight: this connection is done.
    return GatewayError("request_timeout", headers={"connection": "close"})


def declared_length(scope: dict[str, Any]) -> int | None:
    lengths = header(scope, b"content-length")
    return int(lengths[0]) if len(lengths) == 1 and lengths[0].isdigit() else None


def check_framing(scope: dict[str, Any], limit: int) -> None:
    lengths = header(scope, b"content-length")
    codings = header(scope, b"transfer-encoding")
    if len(lengths) > 1 or (lengths and codings):
        # Ambiguous framing is how request smuggling starts; refuse it outright.
        raise GatewayError("invalid_request", "Ambiguous request framing.")
    if codings and (len(codings) > 1 or codings[0].strip().lower() != b"chunked"):
        # The parser already framed the body; a coding on top of chunked would
        # hand us bytes we cannot read (and another hop might frame differently).
        raise GatewayError("invalid_request", "Unsupported transfer encoding.")
    if lengths:
        if not lengths[0].isdigit():
            raise GatewayError("invalid_request", "Invalid Content-Length.")
        if int(lengths[0]) > limit:
            raise GatewayError("body_too_large")


def json_depth_ok(value: Any, limit: int) -> bool:
    """Iterative depth check (no recursion on hostile nesting)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return False
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, dict | list))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, dict | list))
    return True


def parse_json(body: bytes, max_depth: int) -> Any:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise GatewayError("invalid_json") from exc
    if not json_depth_ok(value, max_depth):
        raise GatewayError("invalid_request", "The request JSON is nested too deeply.")
    return value
