"""Whole JSON replies over an ASGI ``send`` (every handler and the relay's
non-streamed answer), and replies already in pieces (:class:`Pieces`: an
image answer around the worker's base64, an audio body). Pure: it awaits the
callable it is given.

A :class:`Spliced` body (an embeddings answer: tens of MB of the worker's own
bytes) is not serialized into one payload: its envelope is, and the big value
goes out as its own bytes, in :data:`CHUNK_BYTES` pieces, so the reply costs
no second copy of the answer, and each ``send`` waits for the server's flow
control, so the transport never buffers the whole of it either.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.types import Send

#: one body message of a spliced reply: big enough to keep the socket busy,
#: small enough that its copy (and the transport's buffer) does not matter
CHUNK_BYTES = 1 << 20


class Spliced(dict[str, Any]):
    """A JSON object whose value at ``raw_key`` is ``orjson.Fragment(raw)``:
    ``orjson.dumps`` gives the same text as :func:`spliced_pieces` joined, but
    :func:`send_json` sends ``raw`` as it is instead of copying it."""

    __slots__ = ("raw", "raw_key")

    def __init__(self, raw_key: str, raw: bytes) -> None:
        super().__init__()
        self.raw_key = raw_key
        self.raw = raw


def spliced_pieces(body: Spliced) -> tuple[bytes, bytes, bytes]:
    """The reply's text as ``head``, the raw value (not copied), ``tail``."""
    before: list[bytes] = []
    after: list[bytes] = []
    side, found = before, False
    for key, value in body.items():
        if key == body.raw_key:
            side, found = after, True
            continue
        side.append(orjson.dumps(key) + b":" + orjson.dumps(value))
    assert found, "a spliced body holds its raw value"
    head = b"{" + b"".join(part + b"," for part in before) + orjson.dumps(body.raw_key) + b":"
    tail = b"".join(b"," + part for part in after) + b"}"
    return head, body.raw, tail


async def send_json(
    send: Send,
    status: int,
    body: Any,
    headers: Mapping[str, str] | None = None,
) -> None:
    pieces = spliced_pieces(body) if isinstance(body, Spliced) else (orjson.dumps(body),)
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(sum(map(len, pieces))).encode()),
    ]
    raw_headers += encode_headers(headers or {})
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    if len(pieces) == 1:
        await send({"type": "http.response.body", "body": pieces[0]})
        return
    head, raw, tail = pieces
    await send({"type": "http.response.body", "body": head, "more_body": True})
    with memoryview(raw) as view:
        for at in range(0, len(view), CHUNK_BYTES):
            chunk = bytes(view[at : at + CHUNK_BYTES])
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": tail})


@dataclass(frozen=True, slots=True)
class Pieces:
    """A reply body already made: its media type and its pieces (bytes or views
    into the worker's answer), sent one after the other, never joined: a 16 MiB
    image's base64 or a 64 MiB audio body costs no second copy."""

    media_type: bytes
    pieces: tuple[bytes | memoryview, ...]

    @property
    def size(self) -> int:
        return sum(memoryview(piece).nbytes for piece in self.pieces)


async def send_pieces(
    send: Send, status: int, body: Pieces, headers: Mapping[str, str] | None = None
) -> None:
    """``body`` with its ``Content-Length``, in messages of at most
    :data:`CHUNK_BYTES` (each ``send`` waits for the server's flow control)."""
    raw_headers = [
        (b"content-type", body.media_type),
        (b"content-length", str(body.size).encode()),
        *encode_headers(headers or {}),
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    for piece in body.pieces:
        with memoryview(piece) as view:
            for at in range(0, view.nbytes, CHUNK_BYTES):
                chunk = bytes(view[at : at + CHUNK_BYTES])
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def encode_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
