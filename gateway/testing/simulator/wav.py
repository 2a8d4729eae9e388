"""Real WAV (RIFF/WAVE, PCM s16le) and raw PCM bodies, made as they are
written. Pure.

The header is the worker's ``write_pcm_as_wav`` byte for byte: ``RIFF``,
size - 8, ``WAVE``, a 16-byte ``fmt `` block (format tag 1 = PCM, channels,
rate, bytes per second, block align, 16 bits), then ``data`` and its size.
The samples are a sine at ``rate / 100`` Hz (one period is exactly 100
frames), amplitude 0.25, truncated to i16 as Rust's ``as i16`` does, the same
value in every channel; one period is made once and repeated, so a 64 MiB
body costs one 64 KiB block of memory.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator

HEADER_BYTES = 44
_PERIOD = 100  # frames
_BLOCK = 64 * 1024


def wav_header(
    data_bytes: int,
    rate: int,
    channels: int,
    *,
    riff: bytes = b"RIFF",
    format_tag: int = 1,
    declared_data: int | None = None,
) -> bytes:
    """The 44-byte header for ``data_bytes`` of samples (the keywords make faults)."""
    declared = data_bytes if declared_data is None else declared_data
    return (
        riff
        + struct.pack("<I", 36 + declared)
        + b"WAVE"
        + b"fmt "
        + struct.pack(
            "<IHHIIHH", 16, format_tag, channels, rate, rate * 2 * channels, 2 * channels, 16
        )
        + b"data"
        + struct.pack("<I", declared)
    )


def _period(channels: int) -> bytes:
    frames = []
    for i in range(_PERIOD):
        value = int(0.25 * math.sin(2 * math.pi * i / _PERIOD) * 32767)
        frames.append(struct.pack("<h", value) * channels)
    return b"".join(frames)


def samples(size: int, channels: int) -> Iterator[bytes]:
    """``size`` bytes of sine samples, in blocks of about 64 KiB."""
    period = _period(channels)
    block = period * max(1, _BLOCK // len(period))
    while size > 0:
        piece = block[:size]
        yield piece
        size -= len(piece)
