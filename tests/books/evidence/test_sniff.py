from __future__ import annotations

import importlib.util
import struct
import wave
import zlib
from io import BytesIO
from types import ModuleType

import pytest

from gateway.books.evidence.sniff import (
    EXTENSIONS,
    MEDIA_TYPES,
    MediaType,
    match_content_type,
    media_type_for,
    sniff,
)
from gateway.core.errors import GatewayError
from tests.books.evidence.support import MEDIA_DIR, fixture_bytes

JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
WEBP = b"RIFF" + struct.pack("<I", 26) + b"WEBPVP8 " + bytes(18)
GIF = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;"
GIF87 = b"GIF87a\x01\x00\x01\x00\x00\x00\x00;"
MP3_ID3 = b"ID3\x04\x00\x00\x00\x00\x00\x00" + bytes(8)
MP3_FRAME = b"\xff\xfb\x90\x64" + bytes(12)  # MPEG-1 layer III, 128 kbit/s, 44.1 kHz
FLAC = b"fLaC\x00\x00\x00\x22" + bytes(8)
OGG = b"OggS\x00\x02" + bytes(20)
MOV = struct.pack(">I", 20) + b"ftypqt  " + b"\x20\x05\x03\x00" + b"qt  "
M4A = struct.pack(">I", 20) + b"ftypM4A " + bytes(4) + b"M4A "

CASES: list[tuple[bytes, str, str, str]] = [
    (fixture_bytes("tiny.png"), "image/png", "png", "image"),
    (JPEG, "image/jpeg", "jpg", "image"),
    (WEBP, "image/webp", "webp", "image"),
    (GIF, "image/gif", "gif", "image"),
    (GIF87, "image/gif", "gif", "image"),
    (fixture_bytes("tiny.wav"), "audio/wav", "wav", "audio"),
    (MP3_ID3, "audio/mpeg", "mp3", "audio"),
    (MP3_FRAME, "audio/mpeg", "mp3", "audio"),
    (FLAC, "audio/flac", "flac", "audio"),
    (OGG, "audio/ogg", "ogg", "audio"),
    (fixture_bytes("tiny.mp4"), "video/mp4", "mp4", "video"),
    (M4A, "video/mp4", "mp4", "video"),
    (MOV, "video/quicktime", "mov", "video"),
]


@pytest.mark.parametrize(("data", "mime", "ext", "modality"), CASES)
def test_each_magic_type(data: bytes, mime: str, ext: str, modality: str) -> None:
    media = sniff(data)
    assert media == MediaType(mime, ext, modality)  # type: ignore[arg-type]
    assert match_content_type(mime, data) == media
    assert match_content_type(None, data) == media


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello, world",
        b"\x89PNG",  # truncated signature
        b"RIFF\x00\x00\x00\x00AVI LIST",  # RIFF, but neither WAVE nor WEBP
        b"RIFF",
        b"\xff\xf1\x50\x80\x00\x1f\xfc",  # AAC ADTS: sync bits, layer 00
        b"\xff\xff\xff\xff",  # reserved MPEG fields
        struct.pack(">I", 8) + b"ftypisom",  # ftyp box too small to hold a brand
        b"\x00\x00\x00\x18moov" + bytes(16),
        b"%PDF-1.7\n",
    ],
)
def test_unknown_bytes(data: bytes) -> None:
    assert sniff(data) is None
    with pytest.raises(GatewayError) as info:
        match_content_type(None, data)
    assert info.value.code == "unsupported_media_type"
    assert info.value.status == 415


@pytest.mark.parametrize(
    ("declared", "data"),
    [
        ("image/jpg", JPEG),
        ("IMAGE/JPEG", JPEG),
        ("image/jpeg; charset=binary", JPEG),
        (" image/png ; q=1", fixture_bytes("tiny.png")),
        ("audio/x-wav", fixture_bytes("tiny.wav")),
        ("audio/wave", fixture_bytes("tiny.wav")),
        ("audio/vnd.wave", fixture_bytes("tiny.wav")),
        ("audio/mpeg", MP3_FRAME),
        ("audio/mp3", MP3_ID3),
        ("audio/x-flac", FLAC),
        ("video/quicktime", MOV),
    ],
)
def test_aliases_and_parameters(declared: str, data: bytes) -> None:
    assert match_content_type(declared, data) == sniff(data)


@pytest.mark.parametrize(
    ("declared", "data"),
    [
        ("image/png", JPEG),
        ("image/jpeg", fixture_bytes("tiny.png")),
        ("audio/wav", WEBP),
        ("video/mp4", MOV),
        ("video/quicktime", fixture_bytes("tiny.mp4")),
        ("application/octet-stream", fixture_bytes("tiny.png")),
        ("", fixture_bytes("tiny.png")),
        ("text/plain", b"hello"),
    ],
)
def test_mismatch_is_415(declared: str, data: bytes) -> None:
    with pytest.raises(GatewayError) as info:
        match_content_type(declared, data)
    assert info.value.code == "unsupported_media_type"


def test_table() -> None:
    assert {m.ext for m in MEDIA_TYPES} == {
        "png",
        "jpg",
        "webp",
        "gif",
        "wav",
        "mp3",
        "flac",
        "ogg",
        "mp4",
        "mov",
    }
    assert frozenset(m.ext for m in MEDIA_TYPES) == EXTENSIONS
    for media in MEDIA_TYPES:
        assert media_type_for(media.mime) == media
    assert media_type_for("audio/x-wav; foo=bar") == media_type_for("audio/wav")
    assert media_type_for("text/plain") is None


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_media", MEDIA_DIR / "make_media.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fixtures_match_their_generator() -> None:
    assert _load_generator().main(["--check"]) == 0


def test_png_fixture_is_a_real_2x2_png() -> None:
    data = fixture_bytes("tiny.png")
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        payload = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + payload)
        chunks[kind] = payload
        pos += 12 + length
    assert list(chunks) == [b"IHDR", b"IDAT", b"IEND"]
    assert struct.unpack(">II", chunks[b"IHDR"][:8]) == (2, 2)
    assert len(zlib.decompress(chunks[b"IDAT"])) == 2 * (1 + 2 * 3)


def test_wav_fixture_is_pcm() -> None:
    with wave.open(BytesIO(fixture_bytes("tiny.wav"))) as wav:
        assert wav.getnchannels() == 1
        assert wav.getsampwidth() == 2
        assert wav.getnframes() / wav.getframerate() == pytest.approx(0.05)


def test_mp4_fixture_boxes() -> None:
    data = fixture_bytes("tiny.mp4")
    kinds, pos = [], 0
    while pos < len(data):
        (size,) = struct.unpack(">I", data[pos : pos + 4])
        assert size >= 8
        kinds.append(data[pos + 4 : pos + 8])
        pos += size
    assert pos == len(data)
    assert kinds == [b"ftyp", b"moov", b"mdat"]
