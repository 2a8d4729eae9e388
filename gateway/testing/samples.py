"""Tiny, valid media samples built in code (demo and test fixtures).

Deterministic (no timestamps, no randomness), stdlib only:

- PNG: a real 2x2 8-bit RGB image (red, green / blue, white).
- WAV: 0.05 s of 8 kHz mono 16-bit PCM, a 500 Hz square wave.
- MP4: a *minimal* ISO-BMFF file: ``ftyp`` (isom), a ``moov`` holding only an
  ``mvhd`` (no tracks) and an empty ``mdat``. Structurally valid boxes,
  enough for sniffing and staging; it is not playable video.

``fixtures/media/make_media.py`` writes these to the fixture folder.
"""

from __future__ import annotations

import struct
import zlib


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


def _zlib_stored(raw: bytes) -> bytes:
    # One uncompressed deflate block, written by hand: zlib builds (zlib-ng,
    # other levels) may compress differently, and the fixture must not drift.
    assert len(raw) < 0x10000
    header = b"\x78\x01"
    block = b"\x01" + struct.pack("<HH", len(raw), len(raw) ^ 0xFFFF) + raw
    return header + block + struct.pack(">I", zlib.adler32(raw) & 0xFFFFFFFF)


def build_png() -> bytes:
    rows = [
        bytes([255, 0, 0, 0, 255, 0]),
        bytes([0, 0, 255, 255, 255, 255]),
    ]
    # Each scanline starts with filter type 0 (None).
    raw = b"".join(b"\x00" + row for row in rows)
    ihdr = struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", _zlib_stored(raw))
        + _png_chunk(b"IEND", b"")
    )


def build_wav(sample_rate: int = 8000, seconds: float = 0.05) -> bytes:
    count = round(sample_rate * seconds)
    half_period = sample_rate // 1000  # 500 Hz: 8 samples high, 8 low
    samples = [8000 if (i // half_period) % 2 == 0 else -8000 for i in range(count)]
    data = struct.pack(f"<{count}h", *samples)
    channels, bits = 1, 16
    block_align = channels * bits // 8
    fmt = struct.pack(
        "<HHIIHH", 1, channels, sample_rate, sample_rate * block_align, block_align, bits
    )
    body = (
        b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", len(data))
        + data
    )
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def build_mp4() -> bytes:
    ftyp = _box(b"ftyp", b"isom" + struct.pack(">I", 0x200) + b"isom" + b"iso2" + b"mp41")
    identity_matrix = struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)
    mvhd = _box(
        b"mvhd",
        struct.pack(">B3x", 0)  # version 0, flags 0
        + struct.pack(">IIII", 0, 0, 1000, 0)  # created, modified, timescale, duration
        + struct.pack(">IH10x", 0x10000, 0x100)  # rate 1.0, volume 1.0, reserved
        + identity_matrix
        + bytes(24)  # pre_defined
        + struct.pack(">I", 1),  # next_track_ID
    )
    return ftyp + _box(b"moov", mvhd) + _box(b"mdat", b"")


SAMPLES = {"tiny.png": build_png, "tiny.wav": build_wav, "tiny.mp4": build_mp4}
