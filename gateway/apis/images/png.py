"""A PNG given as base64, checked without holding its decoded bytes. Pure.

:func:`check_png` decodes the base64 in pieces of :data:`_PIECE` characters
(``binascii.a2b_base64`` in strict mode: the alphabet, padding only at the
end), hashing and counting the bytes as they come, and keeps only the head
(signature and ``IHDR``) and the last 12 bytes (``IEND``). The image must be:

- at most ``max_bytes`` decoded bytes (known from the base64 length before
  anything is decoded);
- the PNG signature, then an ``IHDR`` chunk of 13 bytes whose CRC-32 is
  right, with the width and height asked for;
- ended by the ``IEND`` chunk (a cut file is not an image).

:func:`decoded` gives the bytes again, piece by piece, for a ``url`` answer's
file: written as they come, the image is never held decoded whole beside
its base64.
"""

from __future__ import annotations

import binascii
import hashlib
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from gateway.core.sse import violation

SIGNATURE = b"\x89PNG\r\n\x1a\n"
IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"
#: signature (8), IHDR length and type (8), width and height (8), 5 bytes, CRC (4)
_HEAD = 33
#: base64 characters decoded at a time: a multiple of 4 (whole groups)
_PIECE = 1 << 20


@dataclass(frozen=True, slots=True)
class Png:
    sha256: str
    size: int
    width: int
    height: int


def decoded_size(b64: memoryview) -> int:
    """The bytes ``b64`` decodes to (its padding counted off)."""
    n = b64.nbytes
    if n == 0:
        return 0
    pad = (b64[n - 1] == 0x3D) + (n > 1 and b64[n - 2] == 0x3D)
    return n // 4 * 3 - pad


def decoded(b64: memoryview) -> Iterator[bytes]:
    """The bytes of an image :func:`check_png` passed, in pieces of 768 KiB."""
    for at in range(0, b64.nbytes, _PIECE):
        yield binascii.a2b_base64(b64[at : at + _PIECE], strict_mode=True)


def check_png(b64: memoryview, width: int, height: int, max_bytes: int) -> Png:
    """The image ``b64`` holds, checked (module docstring); else ``upstream_protocol_error``."""
    if b64.nbytes % 4:
        raise violation("Upstream image is not valid base64.")
    size = decoded_size(b64)
    if size > max_bytes:
        raise violation("Upstream image exceeds the size limit.")
    hasher = hashlib.sha256()
    head = bytearray()
    tail = b""
    for at in range(0, b64.nbytes, _PIECE):
        try:
            piece = binascii.a2b_base64(b64[at : at + _PIECE], strict_mode=True)
        except binascii.Error:
            raise violation("Upstream image is not valid base64.") from None
        hasher.update(piece)
        if len(head) < _HEAD:
            head += piece[: _HEAD - len(head)]
        tail = (tail + piece)[-len(IEND) :]
    found = _dimensions(bytes(head))
    if found != (width, height):
        raise violation("Upstream image is not the size asked for.")
    if tail != IEND:
        raise violation("Upstream image does not end like a PNG.")
    return Png(hasher.hexdigest(), size, width, height)


def _dimensions(head: bytes) -> tuple[int, int]:
    if len(head) < _HEAD or not head.startswith(SIGNATURE):
        raise violation("Upstream image is not a PNG.")
    length, kind = struct.unpack(">I4s", head[8:16])
    (crc,) = struct.unpack(">I", head[29:33])
    if length != 13 or kind != b"IHDR" or zlib.crc32(head[12:29]) != crc:
        raise violation("Upstream image has no valid PNG header.")
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)
