"""A tenant file's record and its id: what every file catalog backend stores
and returns (``gateway/books/state/sqlite/files.py``, ``postgres/files.py``),
and the shapes callers see of it (spec §22 "Files")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from gateway.apis.agents.frames import new_file_id

#: ``file_`` and 128 random bits in hex (``new_file_id``)
FILE_ID: Final = re.compile(r"file_[0-9a-f]{32}")
#: what the OpenAI file object says a file is for: the output of an agent's tool
PURPOSE: Final = "agent_output"
_UNSAFE: Final = re.compile(r"[\x00-\x1f\x7f]")
_MAX_NAME: Final = 255

__all__ = ["FILE_ID", "PURPOSE", "FileRecord", "is_file_id", "new_file_id", "plain_name"]


def is_file_id(value: str) -> bool:
    return FILE_ID.fullmatch(value) is not None


def plain_name(name: str) -> str:
    """A producer's name as a plain file name, only ever shown: its last path
    part, control characters as ``_``, at most 255 characters, never empty."""
    last = re.split(r"[/\\]", name)[-1]
    plain = _UNSAFE.sub("_", last)[:_MAX_NAME]
    return plain if plain not in ("", ".", "..") else "file"


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: str
    tenant: str
    #: the producer's name for it (a plain file name; shown, never used as a path)
    name: str
    sha256: str
    #: sniffed from the bytes (``gateway/books/files/sniff.py``)
    mime_type: str
    #: the blob's extension (``<sha256>.<ext>`` in the file store)
    ext: str
    bytes: int
    #: unix seconds
    created: int

    def to_api(self) -> dict[str, Any]:
        """``GET /v1/files/{id}``: the OpenAI file object, plus the digest and the
        sniffed type; no tenant, no storage details."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created,
            "filename": self.name,
            "purpose": PURPOSE,
            "mime_type": self.mime_type,
            "sha256": self.sha256,
        }

    def to_event(self) -> dict[str, Any]:
        """What a caller is shown of a produced file in a stream or an answer
        (spec §22: ``{"id", "name", "bytes", "sha256", "mime_type"}``)."""
        return {
            "id": self.id,
            "name": self.name,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "mime_type": self.mime_type,
        }
