"""The forwarded body as a layout: JSON bytes with media slots between them. Pure.

A plan's body carries a placeholder string where each media URL goes
(:func:`placeholder`, with a per-request nonce a caller cannot guess).
:func:`layout` dumps the body once and splits it at the placeholders, so the
request can be sent piece by piece: the JSON around the media as it is, a
file URL as a JSON string, and staged evidence as a ``data:`` URL whose bytes
are read, digest-checked and base64-encoded only while the body is sent
(``gateway/books/evidence/encode.py``) -- after admission, in bounded pieces.

The size of every piece is known beforehand (base64 of ``n`` bytes is
``4 * ceil(n / 3)`` characters, none of which JSON escapes), so the exact
``Content-Length`` is sent and the worker's body limit is checked before any
media byte is read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.core.errors import GatewayError


def placeholder(nonce: str, slot: int) -> str:
    """The string a media slot holds in the planned body until the layout fills it."""
    return f"gw-media:{nonce}:{slot}"


@dataclass(frozen=True, slots=True)
class MediaSlot:
    """Staged evidence sent as a JSON string ``"data:<type>;base64,<bytes>"``."""

    media_type: str
    raw_bytes: int
    sha256: str
    ext: str

    @property
    def prefix(self) -> bytes:
        return b'"data:' + self.media_type.encode("ascii") + b";base64,"

    @property
    def size(self) -> int:
        return len(self.prefix) + 4 * -(-self.raw_bytes // 3) + 1


Segment = bytes | MediaSlot


@dataclass(frozen=True, slots=True)
class Layout:
    segments: tuple[Segment, ...]
    size: int
    #: the segment index of each media slot, in slot order
    slots: tuple[int, ...] = ()

    @property
    def media(self) -> bool:
        return any(isinstance(s, MediaSlot) for s in self.segments)

    def refill(self, fills: Sequence[bytes | MediaSlot]) -> Layout:
        """The same body with its media slots filled anew (inline data once
        staged): the JSON around them is not dumped again."""
        if len(fills) != len(self.slots):
            raise ValueError("one fill per media slot")
        segments = list(self.segments)
        size = self.size
        for at, fill in zip(self.slots, fills, strict=True):
            size -= _size(segments[at])
            segments[at] = fill
            size += _size(fill)
        return Layout(tuple(segments), size, self.slots)


def _size(segment: Segment) -> int:
    return segment.size if isinstance(segment, MediaSlot) else len(segment)


def url_literal(url: str, dumps: Callable[[Any], bytes]) -> bytes:
    """A URL built by the gateway (a ``file://`` reference) as a JSON string."""
    return dumps(url)


def layout(
    body: dict[str, Any],
    nonce: str,
    fills: Sequence[bytes | MediaSlot],
    dumps: Callable[[Any], bytes],
) -> Layout:
    """Dump ``body`` and put ``fills[i]`` where slot ``i``'s placeholder is."""
    try:
        raw = dumps(body)
    except (TypeError, ValueError) as exc:
        # Values JSON cannot carry on the wire (lone surrogates, integers past 64 bits).
        raise GatewayError(
            "invalid_request", "The request contains values that cannot be encoded."
        ) from exc
    cuts: list[tuple[int, int, int, bytes | MediaSlot]] = []
    for slot, fill in enumerate(fills):
        marker = b'"' + placeholder(nonce, slot).encode("ascii") + b'"'
        at = raw.find(marker)
        if at < 0 or raw.find(marker, at + 1) >= 0:
            raise ValueError("each media placeholder must appear exactly once")
        cuts.append((at, at + len(marker), slot, fill))
    cuts.sort(key=lambda cut: cut[0])
    segments: list[Segment] = []
    where = [0] * len(fills)
    pos = 0
    for start, end, slot, fill in cuts:
        if start > pos:
            segments.append(raw[pos:start])
        where[slot] = len(segments)
        segments.append(fill)
        pos = end
    if pos < len(raw):
        segments.append(raw[pos:])
    return Layout(tuple(segments), sum(_size(s) for s in segments), tuple(where))


def check_size(size: int, max_request_bytes: int) -> None:
    if size > max_request_bytes:
        raise GatewayError(
            "media_limit_exceeded", "The request would exceed the worker's body limit."
        )


def data_url_size(media_type: str, raw_bytes: int) -> int:
    """Bytes a data: URL slot adds to the body (for checks before staging)."""
    return MediaSlot(media_type, raw_bytes, "0" * 64, "bin").size
