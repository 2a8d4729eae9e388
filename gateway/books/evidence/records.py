"""An evidence record and its id: what every catalog backend stores and
returns (``gateway/books/state/sqlite``, ``postgres``), and the full-volume
error both translate to."""

from __future__ import annotations

import base64
import re
import secrets
from dataclasses import dataclass
from typing import Any

from gateway.books.evidence.sniff import MediaModality, media_type_for
from gateway.core.errors import GatewayError

EVIDENCE_ID = re.compile(r"^ev_[a-z2-7]{26}$")


class StorageFull(GatewayError):
    """The catalog's volume is full (SQLite could not grow its journal or file):
    ``state_unavailable`` (spec §17), never a 500."""

    def __init__(self) -> None:
        super().__init__("state_unavailable", "The state volume is full.")


def new_evidence_id() -> str:
    # 16 random bytes are 26 base32 characters once the padding is dropped.
    return "ev_" + base64.b32encode(secrets.token_bytes(16)).decode("ascii").rstrip("=").lower()


def is_evidence_id(value: str) -> bool:
    return EVIDENCE_ID.match(value) is not None


@dataclass(frozen=True, slots=True)
class EvidenceRecord:
    id: str
    tenant: str
    sha256: str
    media_type: str
    ext: str
    bytes: int
    locator_sha256: str | None
    created: int

    @property
    def modality(self) -> MediaModality:
        media = media_type_for(self.media_type)
        if media is None:
            raise GatewayError("storage_error", "A catalog record has an unknown media type.")
        return media.modality

    def to_api(self) -> dict[str, Any]:
        """The public record (spec §12): no tenant, no storage details."""
        return {
            "id": self.id,
            "object": "evidence",
            "sha256": self.sha256,
            "media_type": self.media_type,
            "bytes": self.bytes,
            "created": self.created,
            "locator_sha256": self.locator_sha256,
        }
