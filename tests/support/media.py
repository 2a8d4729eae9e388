"""Real PNG and WAV bytes of any size for the image and speech tests (stdlib only)."""

from __future__ import annotations

import base64
import struct
import zlib

import orjson

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, *, pad: int = 0) -> bytes:
    """A ``width`` x ``height`` grey PNG; ``pad`` bytes of an ancillary chunk make it larger."""
    ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
    pixels = zlib.compress((b"\x00" + b"\x80" * width) * height)
    padding = chunk(b"teXt", b"\x00" * pad) if pad else b""
    return PNG_SIGNATURE + ihdr + padding + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def image_answer(data: bytes, *, created: int = 1_700_000_000) -> bytes:
    """The worker's B64Json answer for one image (agents-media §1)."""
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return orjson.dumps({"created": created, "data": [{"url": None, "b64_json": url}]})


def wav_header(data_bytes: int, rate: int = 24_000, channels: int = 1, *, tag: int = 1) -> bytes:
    align = 2 * channels
    return (
        b"RIFF"
        + struct.pack("<I", 36 + data_bytes)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, tag, channels, rate, rate * align, align, 16)
        + b"data"
        + struct.pack("<I", data_bytes)
    )


def wav(frames: int, rate: int = 24_000, channels: int = 1) -> bytes:
    samples = struct.pack("<h", 1000) * frames * channels
    return wav_header(len(samples), rate, channels) + samples
