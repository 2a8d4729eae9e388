"""Pixel dimensions from headers (spec §24): every format, bombs and honest files,
bounded reads on any bytes."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from gateway.books.evidence.sniff import sniff
from gateway.core.dimensions import (
    MAX_BOXES,
    PixelBounds,
    check_frames,
    frames_of,
)
from gateway.core.errors import GatewayError
from gateway.testing.samples import build_mp4, build_png
from tests.support import pixels

#: a builder of a file declaring (width, height)
Build = Callable[[int, int], bytes]


class Reader:
    """``read(offset, size)`` over bytes, counting the reads and the bytes read."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.reads = 0
        self.bytes = 0

    def __call__(self, offset: int, size: int) -> bytes:
        assert offset >= 0 and 0 < size <= 64
        self.reads += 1
        piece = self.data[offset : offset + size]
        self.bytes += len(piece)
        return piece


def frames(data: bytes) -> list[tuple[int, int]]:
    media = sniff(data)
    assert media is not None
    return frames_of(media.ext, Reader(data), len(data))


@pytest.mark.parametrize(
    "build",
    [
        pixels.png,
        pixels.gif,
        pixels.webp_vp8,
        pixels.webp_vp8l,
        pixels.webp_vp8x,
        pixels.jpeg,
        lambda w, h: pixels.jpeg(w, h, sof=0xC2),  # progressive
        lambda w, h: pixels.jpeg(w, h, app_bytes=200_000),  # EXIF past any head read
        pixels.mp4,
    ],
    ids=["png", "gif", "vp8", "vp8l", "vp8x", "jpeg", "jpeg-progressive", "jpeg-exif", "mp4"],
)
@pytest.mark.parametrize("size", [(2, 3), (1920, 1080), (16_383, 9)])
def test_each_format_declares_its_size(build: Build, size: tuple[int, int]) -> None:
    width, height = size
    assert frames(build(width, height)) == [(width, height)] * (
        2 if build is pixels.mp4 else 1
    )  # a video track: its presentation size and its coded frames


def test_the_project_samples_pass() -> None:
    assert frames(build_png()) == [(2, 2)]
    assert frames(build_mp4()) == []  # no track: nothing declared


def test_a_videos_coded_frames_are_bounded_too() -> None:
    bomb = pixels.mp4(640, 480, coded=(60_000, 60_000))
    assert (60_000, 60_000) in frames(bomb)
    with pytest.raises(GatewayError) as info:
        check_frames(frames(bomb), PixelBounds())
    assert info.value.code == "media_limit_exceeded" and info.value.status == 400


def test_an_audio_tracks_entry_is_not_a_frame() -> None:
    audio = pixels.mp4(0, 0, coded=(48_000, 65_535), handler=b"soun")
    assert frames(audio) == [(0, 0)]


@pytest.mark.parametrize(
    ("size", "refused"),
    [
        ((16_384, 2_441), False),  # a side at the bound, pixels under it
        ((16_385, 1), True),  # one pixel too wide
        ((1, 16_385), True),
        ((6_400, 6_250), False),  # exactly 40,000,000
        ((6_401, 6_250), True),
        ((60_000, 60_000), True),  # the issue's bomb
    ],
)
def test_bounds(size: tuple[int, int], refused: bool) -> None:
    if refused:
        with pytest.raises(GatewayError) as info:
            check_frames([size], PixelBounds())
        assert info.value.code == "media_limit_exceeded"
        assert "pixels" in info.value.message
    else:
        check_frames([size], PixelBounds())


def test_the_issues_bomb_is_small_and_read_in_a_few_bytes() -> None:
    bomb = pixels.png_bomb()
    assert len(bomb) < 100_000  # a few tens of KB, gigabytes decoded
    reader = Reader(bomb)
    assert frames_of("png", reader, len(bomb)) == [(60_000, 60_000)]
    assert reader.bytes <= 16


@pytest.mark.parametrize(
    "data",
    [
        b"\x89PNG\r\n\x1a\n",  # no IHDR
        b"\x89PNG\r\n\x1a\n" + bytes(4) + b"IDAT" + bytes(8),  # another chunk first
        pixels.png(0, 10),  # a zero side
        b"GIF89a\x01",  # truncated screen
        b"\xff\xd8\xff\xda\x00\x08" + bytes(6),  # a scan before any frame header
        b"\xff\xd8\xff\xe1\x00\x01",  # a length under 2
        pixels.jpeg(10, 0),  # height by DNL: not declared up front
        pixels.webp_vp8(10, 10).replace(b"\x9d\x01\x2a", b"\x00\x00\x00"),  # no key frame
    ],
)
def test_an_image_that_declares_no_size_is_refused(data: bytes) -> None:
    with pytest.raises(GatewayError) as info:
        frames(data)
    assert info.value.code == "unsupported_media_type"


def test_a_jpeg_of_endless_segments_stops_within_its_bound() -> None:
    endless = b"\xff\xd8" + b"\xff\xfe\x00\x02" * 10_000  # comments, never a frame
    reader = Reader(endless)
    with pytest.raises(GatewayError):
        frames_of("jpg", reader, len(endless))
    assert reader.reads <= 4096 + 1


def test_a_container_of_endless_boxes_stops_within_its_bound() -> None:
    free = b"\x00\x00\x00\x08free" * (MAX_BOXES + 10)
    data = b"\x00\x00\x00\x10ftypisom\x00\x00\x02\x00" + free
    reader = Reader(data)
    with pytest.raises(GatewayError) as info:
        frames_of("mp4", reader, len(data))
    assert info.value.code == "unsupported_media_type"
    assert reader.reads <= MAX_BOXES + 1


def test_any_bytes_after_a_magic_end_in_frames_or_a_gateway_error() -> None:
    rng = random.Random(36)
    heads = {
        "png": b"\x89PNG\r\n\x1a\n",
        "jpg": b"\xff\xd8\xff",
        "gif": b"GIF89a",
        "webp": b"RIFF\x00\x00\x00\x00WEBP",
        "mp4": b"\x00\x00\x00\x10ftypisom",
    }
    for _ in range(2000):
        ext, head = rng.choice(sorted(heads.items()))
        data = head + rng.randbytes(rng.randrange(0, 200))
        reader = Reader(data)
        try:
            found = frames_of(ext, reader, len(data))
        except GatewayError as exc:
            assert exc.code == "unsupported_media_type"
        else:
            assert all(w >= 0 and h >= 0 for w, h in found)
        assert reader.reads <= MAX_BOXES + 1
