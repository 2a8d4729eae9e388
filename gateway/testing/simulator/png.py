"""Real PNG files from the standard library (zlib, struct). Pure.

``solid_png`` makes an 8-bit RGB image of one colour: every row is filter
byte 0 and the same pixels, fed to one zlib stream a row at a time, so even
4096x4096 compresses to a few tens of KiB without the raw pixels ever being
held whole. Each chunk carries its CRC-32 (over type and data), as the format
requires. ``min_bytes`` pads the file up to at least that size with a private
ancillary chunk (``siMp``: lower-case first letter = ancillary, a decoder skips
it), so a padded file is still a valid PNG. Deterministic: equal arguments,
equal bytes.
"""

from __future__ import annotations

import struct
import zlib

SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: the simulator's bound on an image (the worker has none): 4096 x 4096
MAX_PIXELS = 4096 * 4096
MAX_SIDE = 16_384
_OVERHEAD = 12  # length, type, CRC


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def solid_png(width: int, height: int, rgb: bytes, *, min_bytes: int = 0) -> bytes:
    """A ``width`` x ``height`` PNG of colour ``rgb`` (3 bytes), at least ``min_bytes`` long."""
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE and width * height <= MAX_PIXELS):
        raise ValueError(f"image size {width}x{height} is over the simulator's bound")
    if len(rgb) != 3:
        raise ValueError("rgb must be 3 bytes")
    header = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    row = b"\x00" + rgb * width
    deflate = zlib.compressobj(9)
    pieces = [deflate.compress(row) for _ in range(height)]
    pieces.append(deflate.flush())
    head = SIGNATURE + header + chunk(b"IDAT", b"".join(pieces))
    tail = chunk(b"IEND", b"")
    short = min_bytes - len(head) - len(tail)
    if short > 0:
        head += chunk(b"siMp", b"\x00" * max(0, short - _OVERHEAD))
    return head + tail


def ihdr_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR; None if ``data`` does not start like a PNG."""
    if len(data) < 24 or not data.startswith(SIGNATURE) or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    return width, height
