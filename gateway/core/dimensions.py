"""Pixel dimensions from media headers, never from decoding (spec §24). Pure.

A 35 KB PNG may declare 60,000 x 60,000 pixels (10.8 GB once decoded): what a
worker would allocate is in the header, so the header is what is bounded. This
module reads the dimensions each format declares, through a ``read(offset,
size)`` callable (a file's ``pread``, or a slice of bytes in hand), in small
reads whose number is bounded, and :func:`check_frames` holds them to a
:class:`PixelBounds`:

- PNG: ``IHDR`` (the first chunk), width and height;
- GIF: the logical screen (every frame is drawn within it);
- WebP: the ``VP8`` key frame, the ``VP8L`` header or the ``VP8X`` canvas;
- JPEG: the first start-of-frame marker (``SOF0``-``SOF15`` but ``DHT``,
  ``JPG`` and ``DAC``), walking the segments before it by their lengths only;
- MP4 and QuickTime (the video containers the gateway stages, ``sniff.py``):
  every track's ``tkhd`` presentation size and every visual sample entry's
  coded size in ``stsd`` (the frames the decoder allocates), walking boxes by
  their sizes only.

An image whose header does not declare its size (truncated, no ``SOF`` before
the scan, a zero side) cannot be bounded and is refused as not the image it
claims to be (``unsupported_media_type``); so is a container whose boxes run
past the walk's bound. A video that declares no visual track (an audio-only
MP4, a file without ``moov``) has no frames to bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gateway.core.errors import GatewayError

#: ``read(offset, size)``: up to ``size`` bytes at ``offset`` (fewer at the end)
ReadAt = Callable[[int, int], bytes]
#: (width, height) of one image or one declared video frame
Frame = tuple[int, int]

#: JPEG segments walked before the first SOF at most
MAX_JPEG_SEGMENTS = 4096
#: ISO BMFF boxes visited at most (every level together)
MAX_BOXES = 65_536
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
#: JPEG markers that stand alone (no length): TEM, RST0-7, SOI, EOI
_STANDALONE = frozenset({0x01, *range(0xD0, 0xDA)})
#: boxes on the way from the file to a track's headers
_CONTAINERS = frozenset({b"moov", b"trak", b"mdia", b"minf", b"stbl"})


@dataclass(frozen=True, slots=True)
class PixelBounds:
    """``staging.max_image_pixels`` and ``staging.max_image_side``."""

    max_pixels: int = 40_000_000
    max_side: int = 16_384


def unreadable(what: str) -> GatewayError:
    return GatewayError("unsupported_media_type", f"The {what} header does not declare its size.")


def check_frames(frames: list[Frame], bounds: PixelBounds) -> None:
    """Every declared frame within the bounds, else 400 ``media_limit_exceeded``."""
    for width, height in frames:
        if max(width, height) > bounds.max_side or width * height > bounds.max_pixels:
            raise GatewayError(
                "media_limit_exceeded",
                f"The media declares {width}x{height} pixels; this gateway takes at most "
                f"{bounds.max_side} a side and {bounds.max_pixels} in all.",
            )


def frames_of(ext: str, read: ReadAt, size: int) -> list[Frame]:
    """The frames a file of type ``ext`` (``sniff.MediaType.ext``) declares;
    [] for audio. Raises ``unsupported_media_type`` for an image that declares none."""
    if ext in ("mp4", "mov"):
        return list(_iso_frames(read, size))
    reader = _IMAGES.get(ext)
    if reader is None:
        return []
    frame = reader(read)
    if frame is None or 0 in frame:
        raise unreadable("image")
    return [frame]


def _exact(read: ReadAt, offset: int, size: int) -> bytes | None:
    data = read(offset, size)
    return data if len(data) == size else None


def _be(data: bytes) -> int:
    return int.from_bytes(data, "big")


def _le(data: bytes) -> int:
    return int.from_bytes(data, "little")


def _png(read: ReadAt) -> Frame | None:
    head = _exact(read, 8, 16)
    if head is None or head[4:8] != b"IHDR":
        return None
    return _be(head[8:12]), _be(head[12:16])


def _gif(read: ReadAt) -> Frame | None:
    screen = _exact(read, 6, 4)
    return None if screen is None else (_le(screen[0:2]), _le(screen[2:4]))


def _webp(read: ReadAt) -> Frame | None:
    head = _exact(read, 12, 18)
    if head is None:
        return None
    kind, body = head[0:4], head[8:]
    if kind == b"VP8 ":
        # A key frame: 3 bytes of frame tag, the start code, then 14-bit sides.
        if body[3:6] != b"\x9d\x01\x2a":
            return None
        return _le(body[6:8]) & 0x3FFF, _le(body[8:10]) & 0x3FFF
    if kind == b"VP8L":
        if body[0] != 0x2F:
            return None
        bits = _le(body[1:5])
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8X":
        return _le(body[4:7]) + 1, _le(body[7:10]) + 1
    return None


def _jpeg(read: ReadAt) -> Frame | None:
    offset = 2  # after SOI
    for _ in range(MAX_JPEG_SEGMENTS):
        head = _exact(read, offset, 4)
        if head is None or head[0] != 0xFF:
            return None
        marker = head[1]
        if marker == 0xFF:  # a fill byte before the marker
            offset += 1
            continue
        if marker in _STANDALONE:
            offset += 2
            continue
        if marker == 0xDA:  # the scan began: no frame header before it
            return None
        if marker in _SOF:
            frame = _exact(read, offset + 4, 5)
            if frame is None:
                return None
            return _be(frame[3:5]), _be(frame[1:3])  # precision, height, width
        length = _be(head[2:4])
        if length < 2:
            return None
        offset += 2 + length
    return None


_IMAGES: dict[str, Callable[[ReadAt], Frame | None]] = {
    "png": _png,
    "gif": _gif,
    "webp": _webp,
    "jpg": _jpeg,
}


class _Walk:
    """ISO BMFF boxes by their sizes, within one bound for the whole file."""

    def __init__(self, read: ReadAt) -> None:
        self.read = read
        self.visited = 0

    def boxes(self, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
        """(type, payload start, box end) of each box in [start, end)."""
        offset = start
        while offset + 8 <= end:
            self.visited += 1
            if self.visited > MAX_BOXES:
                raise unreadable("video")
            head = _exact(self.read, offset, 16 if end - offset >= 16 else 8)
            if head is None:
                return
            size, kind, payload = _be(head[0:4]), head[4:8], offset + 8
            if size == 1:  # a 64-bit size follows the type
                if len(head) < 16:
                    return
                size, payload = _be(head[8:16]), offset + 16
            elif size == 0:  # to the end of its container
                size = end - offset
            if size < payload - offset or offset + size > end:
                return  # truncated: what is there was read
            yield kind, payload, offset + size
            offset += size


def _iso_frames(read: ReadAt, size: int) -> Iterator[Frame]:
    walk = _Walk(read)
    for kind, payload, end in walk.boxes(0, size):
        if kind == b"moov":
            yield from _tracks(walk, payload, end)
            return  # one movie header; what follows is media data


def _tracks(walk: _Walk, start: int, end: int) -> Iterator[Frame]:
    for kind, payload, box_end in walk.boxes(start, end):
        if kind == b"trak":
            yield from _track(walk, payload, box_end)


def _track(walk: _Walk, start: int, end: int) -> Iterator[Frame]:
    """The track's presentation size (``tkhd``) and, for a video track, its
    sample entries' coded sizes (``mdia/minf/stbl/stsd``)."""
    stack = [(start, end)]
    video = False
    entries: list[Frame] = []
    while stack:
        begin, finish = stack.pop()
        for kind, payload, box_end in walk.boxes(begin, finish):
            if kind in _CONTAINERS:
                stack.append((payload, box_end))
            elif kind == b"tkhd":
                frame = _tkhd(walk.read, payload)
                if frame is not None:
                    yield frame
            elif kind == b"hdlr":
                handler = _exact(walk.read, payload + 8, 4)
                video = video or handler == b"vide"
            elif kind == b"stsd":
                entries += _stsd(walk, payload, box_end)
    if video:
        yield from entries


def _tkhd(read: ReadAt, payload: int) -> Frame | None:
    version = _exact(read, payload, 1)
    if version is None:
        return None
    # FullBox, times, track id, duration (32 or 64-bit), then 52 bytes to the size.
    at = payload + (4 + 32 + 52 if version[0] == 1 else 4 + 20 + 52)
    size = _exact(read, at, 8)
    if size is None:
        return None
    return _be(size[0:4]) >> 16, _be(size[4:8]) >> 16  # 16.16 fixed point


def _stsd(walk: _Walk, payload: int, end: int) -> list[Frame]:
    frames = []
    # FullBox and entry count, then the sample entries as boxes.
    for _kind, entry, _entry_end in walk.boxes(payload + 8, end):
        # SampleEntry (8 bytes), then pre_defined and reserved (16): width, height.
        size = _exact(walk.read, entry + 24, 4)
        if size is not None:
            frames.append((_be(size[0:2]), _be(size[2:4])))
    return frames
