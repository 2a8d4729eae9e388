"""What a produced file is, from its bytes alone (spec §22 "Files"). Pure.

The worker's (and the model's) word for a file's type is never used: a
model can name an HTML page ``report.png``. The type callers are told, and
the ``Content-Type`` its content is served with, is decided here:

- the media types evidence knows (``gateway/books/evidence/sniff.py``: PNG,
  JPEG, GIF, WebP, WAV, MP3, FLAC, Ogg, MP4, QuickTime) by their magic bytes;
- PDF, ZIP (and what is built on it: docx, xlsx, jar…) and gzip by theirs;
- bytes that are valid UTF-8 with no control character other than tab, line
  feed, form feed and carriage return: ``text/plain`` (CSV, JSON, Markdown,
  source code, and also HTML and SVG: served as text, never as a document a
  browser would run);
- anything else: ``application/octet-stream``.

Each type has the extension its blob is stored under (``<sha256>.<ext>``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from gateway.books.evidence.sniff import MEDIA_TYPES, sniff


@dataclass(frozen=True, slots=True)
class FileType:
    mime: str
    ext: str


PDF: Final = FileType("application/pdf", "pdf")
ZIP: Final = FileType("application/zip", "zip")
GZIP: Final = FileType("application/gzip", "gz")
TEXT: Final = FileType("text/plain", "txt")
BINARY: Final = FileType("application/octet-stream", "bin")

_MEDIA: Final = MappingProxyType({m.mime: FileType(m.mime, m.ext) for m in MEDIA_TYPES})
_OTHERS: Final = (PDF, ZIP, GZIP, TEXT, BINARY)

#: every extension a file blob can have
FILE_EXTENSIONS: Final = frozenset(t.ext for t in (*_MEDIA.values(), *_OTHERS))
#: every type a file can be recorded with
FILE_TYPES: Final = frozenset(t.mime for t in (*_MEDIA.values(), *_OTHERS))

#: C0 controls a text file does not hold (tab, LF, FF and CR are text)
_CONTROL: Final = re.compile(rb"[\x00-\x08\x0b\x0e-\x1f\x7f]")


def _is_text(data: bytes) -> bool:
    if _CONTROL.search(data):
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def sniff_file(data: bytes) -> FileType:
    """The type the bytes are; :data:`BINARY` when nothing more is known."""
    media = sniff(data)
    if media is not None:
        return _MEDIA[media.mime]
    if data.startswith(b"%PDF-"):
        return PDF
    # Local file header, an empty archive's end record, a spanned archive's marker.
    if data.startswith((b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08")):
        return ZIP
    if data.startswith(b"\x1f\x8b\x08"):
        return GZIP
    # An empty file is an empty text: what a tool that wrote nothing left.
    return TEXT if _is_text(data) else BINARY


def content_type(mime: str) -> str:
    """The ``Content-Type`` a file of ``mime`` is served with: text says its
    charset (a browser never guesses one, so never UTF-7)."""
    return "text/plain; charset=utf-8" if mime == TEXT.mime else mime
