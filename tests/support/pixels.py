"""Media whose headers declare any size (pixel bombs and honest files): only the
header is real, which is all the gateway reads of them (spec §24)."""

from __future__ import annotations

import struct
import zlib


def _chunk(kind: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


def png(width: int, height: int, idat: bytes = b"") -> bytes:
    """A PNG declaring ``width`` x ``height``: IHDR, one IDAT (as given) and IEND.
    A bomb's IDAT compresses well: 35 KB of it would decode to gigabytes."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")
    )


def png_bomb(width: int = 60_000, height: int = 60_000, idat_bytes: int = 35_000) -> bytes:
    """The issue's bomb: zeros deflated to ``idat_bytes`` or so, a huge canvas declared."""
    zeros = zlib.compressobj(9)
    idat = b""
    while len(idat) < idat_bytes:
        idat += zeros.compress(b"\0" * (1 << 20))
    return png(width, height, idat + zeros.flush())


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00;"


def _riff_webp(kind: bytes, body: bytes) -> bytes:
    chunk = kind + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def webp_vp8(width: int, height: int) -> bytes:
    return _riff_webp(
        b"VP8 ", b"\x10\x02\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", width, height) + bytes(8)
    )


def webp_vp8l(width: int, height: int) -> bytes:
    bits = (width - 1) | ((height - 1) << 14)
    return _riff_webp(b"VP8L", b"\x2f" + struct.pack("<I", bits) + bytes(8))


def webp_vp8x(width: int, height: int) -> bytes:
    size = (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return _riff_webp(b"VP8X", b"\x00" + bytes(3) + size)


def jpeg(width: int, height: int, *, app_bytes: int = 16, sof: int = 0xC0) -> bytes:
    """SOI, an APP1 segment of ``app_bytes`` (EXIF sits there, up to 64 KiB each),
    a DQT, the start of frame, a scan header, EOI."""

    def segment(marker: int, payload: bytes) -> bytes:
        return bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload

    app = b""
    left = app_bytes
    while left > 0:  # several APP segments when one would be over 64 KiB
        take = min(left, 65_000)
        app += segment(0xE1, b"Exif\0\0" + bytes(max(take - 6, 0)))
        left -= take
    frame = struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00"
    return (
        b"\xff\xd8"
        + app
        + segment(0xDB, bytes(65))
        + b"\xff"  # a fill byte before a marker is allowed
        + segment(sof, frame)
        + segment(0xDA, b"\x01\x01\x00\x00\x3f\x00")
        + b"\x00" * 8
        + b"\xff\xd9"
    )


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def _tkhd(width: int, height: int) -> bytes:
    # version 0: times, track id, reserved, duration; reserved, layer, group,
    # volume, reserved; the matrix; the presentation size in 16.16.
    return _box(
        b"tkhd",
        b"\x00\x00\x00\x07"
        + struct.pack(">IIIII", 0, 0, 1, 0, 0)
        + bytes(16)
        + struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)
        + struct.pack(">II", width << 16, height << 16),
    )


def _stsd(kind: bytes, width: int, height: int) -> bytes:
    entry = _box(
        kind, bytes(6) + b"\x00\x01" + bytes(16) + struct.pack(">HH", width, height) + bytes(50)
    )
    return _box(b"stsd", b"\x00\x00\x00\x00" + struct.pack(">I", 1) + entry)


def mp4(
    width: int, height: int, *, coded: tuple[int, int] | None = None, handler: bytes = b"vide"
) -> bytes:
    """ftyp, a moov with one track (``tkhd`` of width x height, a ``handler``
    media whose sample entry codes ``coded``, the same size by default), mdat."""
    coded_w, coded_h = coded or (width, height)
    hdlr = _box(b"hdlr", bytes(4) + bytes(4) + handler + bytes(12) + b"\0")
    stbl = _box(b"stbl", _stsd(b"avc1" if handler == b"vide" else b"mp4a", coded_w, coded_h))
    trak = _box(b"trak", _tkhd(width, height) + _box(b"mdia", hdlr + _box(b"minf", stbl)))
    ftyp = _box(b"ftyp", b"isom" + struct.pack(">I", 0x200) + b"isom")
    return ftyp + _box(b"moov", trak) + _box(b"mdat", bytes(16))
