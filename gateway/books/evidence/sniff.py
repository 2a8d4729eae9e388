"""Media types from magic bytes (spec §5 "Media parts and evidence").

Pure: takes bytes and strings, returns values or raises. The gateway trusts
only what it sniffed: a declared ``Content-Type`` is accepted when it names
the same type as the bytes (directly or by a common alias), never instead of
them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from gateway.core.errors import GatewayError

MediaModality = Literal["image", "audio", "video"]


@dataclass(frozen=True, slots=True)
class MediaType:
    mime: str
    ext: str
    modality: MediaModality


PNG = MediaType("image/png", "png", "image")
JPEG = MediaType("image/jpeg", "jpg", "image")
WEBP = MediaType("image/webp", "webp", "image")
GIF = MediaType("image/gif", "gif", "image")
WAV = MediaType("audio/wav", "wav", "audio")
MP3 = MediaType("audio/mpeg", "mp3", "audio")
FLAC = MediaType("audio/flac", "flac", "audio")
OGG = MediaType("audio/ogg", "ogg", "audio")
MP4 = MediaType("video/mp4", "mp4", "video")
MOV = MediaType("video/quicktime", "mov", "video")

MEDIA_TYPES: tuple[MediaType, ...] = (PNG, JPEG, WEBP, GIF, WAV, MP3, FLAC, OGG, MP4, MOV)

#: every extension a stored file can have (spec §12 "Evidence")
EXTENSIONS: frozenset[str] = frozenset(m.ext for m in MEDIA_TYPES)

_ALIASES: Mapping[str, MediaType] = MappingProxyType(
    {
        **{m.mime: m for m in MEDIA_TYPES},
        "image/jpg": JPEG,
        "image/pjpeg": JPEG,
        "audio/x-wav": WAV,
        "audio/wave": WAV,
        "audio/vnd.wave": WAV,
        "audio/mp3": MP3,
        "audio/x-flac": FLAC,
        "application/ogg": OGG,
    }
)


def media_type_for(mime: str) -> MediaType | None:
    """The table entry a MIME type (or alias, parameters ignored) names, if any."""
    return _ALIASES.get(_essence(mime))


def _essence(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _is_mp3_frame(data: bytes) -> bool:
    # MPEG audio frame header: 11 sync bits, then fields whose all-ones or
    # all-zero values are reserved. Layer bits 00 would be AAC/ADTS, not MP3.
    if len(data) < 4 or data[0] != 0xFF or data[1] & 0xE0 != 0xE0:
        return False
    version = (data[1] >> 3) & 0b11
    layer = (data[1] >> 1) & 0b11
    bitrate = data[2] >> 4
    sample_rate = (data[2] >> 2) & 0b11
    return version != 0b01 and layer != 0b00 and bitrate != 0b1111 and sample_rate != 0b11


def _iso_bmff(data: bytes) -> MediaType | None:
    if len(data) < 12 or data[4:8] != b"ftyp":
        return None
    # An ftyp box holds at least major brand and minor version (16 bytes).
    if int.from_bytes(data[0:4], "big") < 16:
        return None
    return MOV if data[8:12] == b"qt  " else MP4


def sniff(data: bytes) -> MediaType | None:
    """The media type the bytes start like, or None when unknown."""
    head = data[:16]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return PNG
    if head.startswith(b"\xff\xd8\xff"):
        return JPEG
    if head.startswith((b"GIF87a", b"GIF89a")):
        return GIF
    if head.startswith(b"RIFF") and len(head) >= 12:
        form = head[8:12]
        if form == b"WEBP":
            return WEBP
        if form == b"WAVE":
            return WAV
        return None
    if head.startswith(b"fLaC"):
        return FLAC
    if head.startswith(b"OggS"):
        return OGG
    if head.startswith(b"ID3") or _is_mp3_frame(head):
        return MP3
    return _iso_bmff(head)


def match_content_type(content_type: str | None, data: bytes) -> MediaType:
    """The sniffed type, checked against the declared one (None: trust the sniff).

    Raises 415 ``unsupported_media_type`` for unknown bytes or a mismatch.
    """
    sniffed = sniff(data)
    if sniffed is None:
        raise GatewayError(
            "unsupported_media_type", "The bytes are not a supported image, audio or video type."
        )
    if content_type is None:
        return sniffed
    if media_type_for(content_type) != sniffed:
        raise GatewayError(
            "unsupported_media_type", "The bytes do not match the declared Content-Type."
        )
    return sniffed
