"""Staged evidence: sniffed media, digest-addressed files, a tenant-scoped catalog.

No HTTP here; the app and the CLI both go through :class:`EvidenceService`.
The ``sniff`` function is not re-exported, so ``gateway.books.evidence.sniff``
stays the module; nor is the SQLite catalog (``gateway.books.state.sqlite``),
which imports the records from here: importing it first must not find this
package half-built.
"""

from gateway.books.evidence.records import EvidenceRecord, is_evidence_id
from gateway.books.evidence.service import EvidenceService
from gateway.books.evidence.sniff import MediaType, match_content_type, media_type_for
from gateway.books.evidence.store import EvidenceStore, StoredFile

__all__ = [
    "EvidenceRecord",
    "EvidenceService",
    "EvidenceStore",
    "MediaType",
    "StoredFile",
    "is_evidence_id",
    "match_content_type",
    "media_type_for",
]
