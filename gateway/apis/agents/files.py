"""Files the worker's tools produced, bounded as they arrive (spec §22 "Files", §24). Pure.

A ``file_produced`` body is the text of a text file, or the base64 of any
other (reference §3.4). :func:`bounded_file` decodes it only when it fits:
the request's kept files stay within ``files.max_count`` files and
``files.max_bytes`` decoded bytes together; past either, the file is
dropped (``too_many``, ``too_large``) without decoding it, and so is a body
the worker elided (over its 8 MiB embed limit: the gateway never calls the
worker's ``/v1/files``) or a placeholder for a file never written. A drop
is counted by the caller and the run goes on; a body that is not what it
claims (bad base64, a size other than declared, text that is not UTF-8) is a
violation.

The name is the worker's (the model's) and is only ever shown: it is cut to
its last path part, control characters become ``_``, at most 255 characters.
The declared MIME type is carried for the record only; what callers are told
is sniffed from the bytes.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Final, Literal

from gateway.apis.agents.wire import FileBody
from gateway.core.sse import violation

__all__ = ["DropReason", "FileProduced", "bounded_file"]

DropReason = Literal["elided", "placeholder", "too_many", "too_large"]
_UNSAFE_NAME: Final = re.compile(r"[\x00-\x1f\x7f]")
_MAX_FILE_NAME: Final = 255


@dataclass(frozen=True, slots=True)
class FileProduced:
    """A file the round's tool wrote: its decoded bytes, or why it was dropped."""

    round: int
    #: the worker's name for it, as a plain file name (last path part, no control characters)
    name: str
    #: the worker's word for its type: informative only (callers get sniffed types)
    declared_mime: str | None
    data: bytes | None
    dropped: DropReason | None


def bounded_file(body: FileBody, *, room: int, full: bool) -> FileProduced:
    """The file with its decoded bytes, or dropped; ``room`` is how many decoded
    bytes the request may still keep, ``full`` whether it keeps its last file."""
    data, dropped = _body(body, room, full)
    return FileProduced(body.round, _plain_name(body.name), body.mime_type, data, dropped)


def _body(body: FileBody, room: int, full: bool) -> tuple[bytes | None, DropReason | None]:
    if body.placeholder:
        return None, "placeholder"
    if body.text is None and body.data_base64 is None:
        return None, "elided"
    if full:
        return None, "too_many"
    if body.text is not None:
        # A body that cannot fit is dropped before any copy is made of it.
        if len(body.text) > room:
            return None, "too_large"
        try:
            data = body.text.encode("utf-8")
        except UnicodeEncodeError:
            raise violation("Upstream sent a text file that is not UTF-8.") from None
    else:
        assert body.data_base64 is not None
        encoded = body.data_base64
        if len(encoded) % 4:
            raise violation("Upstream sent a file whose base64 is malformed.")
        size = len(encoded) // 4 * 3 - (len(encoded) - len(encoded.rstrip("=")))
        if size > room:
            return None, "too_large"
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise violation("Upstream sent a file whose base64 is malformed.") from None
    if len(data) != body.declared_bytes:
        raise violation("Upstream sent a file whose size is not the one it declared.")
    if len(data) > room:
        return None, "too_large"
    return data, None


def _plain_name(name: str) -> str:
    last = re.split(r"[/\\]", name)[-1]
    plain = _UNSAFE_NAME.sub("_", last)[:_MAX_FILE_NAME]
    return plain if plain not in ("", ".", "..") else "file"
