"""A worker's speech body, checked before a byte of it is relayed. Pure.

Both formats are 16-bit signed little-endian PCM (agents-media §2):

- ``wav``: a RIFF/WAVE file: ``RIFF``, the file's size - 8, ``WAVE``, then
  chunks (each ``id``, a 32-bit size, the data padded to even size): a
  ``fmt `` chunk of at least 16 bytes with format tag 1 (PCM), 1 to
  :data:`MAX_CHANNELS` channels, a rate from 1 to :data:`MAX_RATE` Hz, 16 bits
  a sample and the byte rate and block align that follow; then a ``data``
  chunk that runs exactly to the file's end, a whole number of frames. At
  most :data:`MAX_CHUNKS` chunks are looked at.
- ``pcm``: the samples alone; the rate and channels are the response head's
  (``audio/pcm; codecs=1; format=s16le; rate=<hz>; channels=<n>``), the
  length a whole number of frames (so even).

The head's parameters are read by :func:`media_type`; a ``wav`` head that
names a rate or channels must agree with the file's own.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from gateway.core.sse import violation

MAX_RATE = 384_000
MAX_CHANNELS = 16
MAX_CHUNKS = 64
_BITS = 16


@dataclass(frozen=True, slots=True)
class Head:
    """The worker's ``Content-Type``: its media type and the parameters that matter."""

    media_type: str
    rate: int | None = None
    channels: int | None = None


@dataclass(frozen=True, slots=True)
class Audio:
    """A checked body: where its samples lie, their format and their length."""

    rate: int
    channels: int
    data_start: int
    data_bytes: int

    @property
    def duration_ms(self) -> int:
        frames = self.data_bytes // (2 * self.channels)
        return frames * 1000 // self.rate


def _number(value: str, low: int, high: int) -> int:
    if not value.isdigit() or len(value) > 7 or not low <= int(value) <= high:
        raise violation("Upstream audio parameters are malformed.")
    return int(value)


def media_type(content_type: bytes) -> Head:
    """The head's media type (lower case) and its ``rate`` and ``channels``;
    ``format`` and ``codecs``, when named, must say s16le PCM."""
    text = content_type.decode("latin-1").lower()
    kind, *params = (part.strip() for part in text.split(";"))
    values: dict[str, str] = {}
    for param in params:
        name, _, value = param.partition("=")
        values[name.strip()] = value.strip().strip('"')
    if values.get("format", "s16le") != "s16le" or values.get("codecs", "1") != "1":
        raise violation("Upstream audio is not 16-bit PCM.")
    rate = _number(values["rate"], 1, MAX_RATE) if "rate" in values else None
    channels = _number(values["channels"], 1, MAX_CHANNELS) if "channels" in values else None
    return Head(kind, rate, channels)


def check_pcm(size: int, head: Head) -> Audio:
    if head.rate is None or head.channels is None:
        raise violation("Upstream PCM audio does not say its rate and channels.")
    if size % (2 * head.channels):
        raise violation("Upstream PCM audio is not a whole number of 16-bit frames.")
    return Audio(head.rate, head.channels, 0, size)


def check_wav(body: bytes | memoryview, head: Head) -> Audio:
    view = memoryview(body)
    if view.nbytes < 12 or bytes(view[:4]) != b"RIFF" or bytes(view[8:12]) != b"WAVE":
        raise violation("Upstream audio is not a RIFF/WAVE file.")
    (riff_size,) = struct.unpack("<I", view[4:8])
    if riff_size != view.nbytes - 8:
        raise violation("Upstream WAV size does not match its body.")
    at, fmt = 12, None
    for _ in range(MAX_CHUNKS):
        if at + 8 > view.nbytes:
            break
        kind = bytes(view[at : at + 4])
        (size,) = struct.unpack("<I", view[at + 4 : at + 8])
        start = at + 8
        if kind == b"fmt ":
            fmt = _fmt(view[start : start + size], size)
        elif kind == b"data":
            if fmt is None:
                raise violation("Upstream WAV has samples before their format.")
            rate, channels = fmt
            if start + size != view.nbytes or size % (2 * channels):
                raise violation("Upstream WAV data size does not match its body.")
            if head.rate not in (None, rate) or head.channels not in (None, channels):
                raise violation("Upstream WAV disagrees with its content type.")
            return Audio(rate, channels, start, size)
        at = start + size + (size & 1)
    raise violation("Upstream WAV has no data chunk.")


def _fmt(chunk: memoryview, size: int) -> tuple[int, int]:
    if size < 16 or chunk.nbytes < 16:
        raise violation("Upstream WAV format chunk is malformed.")
    tag, channels, rate, byte_rate, align, bits = struct.unpack("<HHIIHH", chunk[:16])
    if tag != 1 or bits != _BITS:
        raise violation("Upstream WAV is not 16-bit PCM.")
    if not (1 <= channels <= MAX_CHANNELS and 1 <= rate <= MAX_RATE):
        raise violation("Upstream WAV format chunk is malformed.")
    if align != 2 * channels or byte_rate != rate * align:
        raise violation("Upstream WAV format chunk is malformed.")
    return int(rate), int(channels)
