"""Evidence staging: the one code path for HTTP uploads and ``evidence add``.

Theory of operation:

- An upload is checked (locator, size, sniffed type against the declared
  one, tenant modality) before anything touches the disk. The file is stored
  first and the record added after the rename, both inside the store's lock:
  a crash before the rename leaves no visible record and no final file; a
  crash between rename and insert leaves an unreferenced file that
  :meth:`EvidenceService.recover` removes at the next start.
- A file is removed only under the store's lock and only when the catalog
  says no record or lease names its digest, so an upload of the same bytes
  racing a delete either re-creates the file or keeps it.
- Deleting a record forgets it at once; its file stays while a lease holds
  it and goes when the last lease is released. Leases are all-or-nothing
  per request, and releasing is idempotent.
- A failure to remove a file that nothing references is logged, not raised:
  the caller's operation already took effect, and ``recover`` sweeps the file.

Synchronous and thread-safe; the app calls it through ``anyio.to_thread``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from gateway.config import StagingConfig
from gateway.errors import GatewayError
from gateway.evidence.catalog import Catalog, EvidenceRecord
from gateway.evidence.sniff import match_content_type
from gateway.evidence.store import EvidenceStore
from gateway.policy import Tenant

MAX_LOCATOR_CHARS = 1024

logger = logging.getLogger(__name__)


def locator_digest(locator: str | None) -> str | None:
    """SHA-256 hex of a locator's UTF-8, after checking it is short and printable."""
    if locator is None:
        return None
    if not 0 < len(locator) <= MAX_LOCATOR_CHARS or not locator.isprintable():
        raise GatewayError(
            "invalid_request",
            f"The evidence locator must be 1 to {MAX_LOCATOR_CHARS} printable characters.",
            param="x-evidence-locator",
        )
    return hashlib.sha256(locator.encode("utf-8")).hexdigest()


class EvidenceService:
    """Upload, look up, lease and release staged evidence; see the module docstring."""

    def __init__(
        self,
        store: EvidenceStore,
        catalog: Catalog,
        on_leases_change: Callable[[int], None] | None = None,
    ) -> None:
        self._store = store
        self._catalog = catalog
        # Only the serving process takes leases (recover() clears a crashed
        # run's), so they are counted here instead of asking SQLite each time:
        # request id -> leased records (distinct ids, as the catalog keeps them).
        self._held: dict[str, int] = {}
        self._held_lock = threading.Lock()
        self._on_leases_change = on_leases_change

    @classmethod
    def from_config(
        cls, staging: StagingConfig, on_leases_change: Callable[[int], None] | None = None
    ) -> EvidenceService:
        store = EvidenceStore(Path(staging.dir))
        return cls(store, Catalog(Path(staging.catalog)), on_leases_change)

    @property
    def store(self) -> EvidenceStore:
        return self._store

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    def close(self) -> None:
        self._catalog.close()

    def recover(self) -> None:
        """Server start: drop a crashed run's temps and leases, and files nothing names."""
        with self._store.exclusive():
            self._store.sweep_temp()
            self._catalog.clear_stale_leases()
            for sha256, ext in self._store.files():
                if not self._catalog.is_referenced(sha256):
                    self._store.remove(sha256, ext)

    def upload(
        self, tenant: Tenant, data: bytes, content_type: str | None, locator: str | None
    ) -> EvidenceRecord:
        locator_sha256 = locator_digest(locator)
        if len(data) > tenant.limits.max_media_bytes:
            raise GatewayError("body_too_large", "The media file exceeds the tenant's size limit.")
        media = match_content_type(content_type, data)
        if not tenant.allows_modality(media.modality):
            raise GatewayError(
                "modality_not_allowed", f"The {media.modality} modality is not allowed."
            )
        with self._store.exclusive():
            stored = self._store.put(data, media)
            return self._catalog.add(
                tenant=tenant.name,
                sha256=stored.sha256,
                media_type=media.mime,
                ext=stored.ext,
                size=stored.bytes,
                locator_sha256=locator_sha256,
            )

    def upload_inline(
        self, tenant: Tenant, payload: str, declared: str | None, kind: str
    ) -> EvidenceRecord:
        """Stage a request's inline ``data:`` URL (base64 ``payload``) for that
        request only; its part type ``kind`` must match what the bytes are."""
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise GatewayError("invalid_request", "Inline data is not valid base64.") from exc
        media = match_content_type(declared, data)
        if media.modality != kind:
            raise GatewayError(
                "modality_not_allowed", f"A {kind} part refers to {media.modality} data."
            )
        return self.upload(tenant, data, declared, None)

    def get(self, tenant: Tenant, evidence_id: str) -> EvidenceRecord:
        record = self._catalog.get(tenant.name, evidence_id)
        if record is None:
            raise GatewayError("evidence_not_found")
        return record

    def delete(self, tenant: Tenant, evidence_id: str) -> EvidenceRecord:
        record = self._catalog.delete(tenant.name, evidence_id)
        if record is None:
            raise GatewayError("evidence_not_found")
        self._drop_file_if_unreferenced(record.sha256, record.ext)
        return record

    def lease(
        self, request_id: str, tenant: Tenant, evidence_ids: Sequence[str]
    ) -> list[EvidenceRecord]:
        """Lease every ID for the request, in order, or none of them.

        Unknown and foreign IDs are 404 ``evidence_not_found``; a record whose
        modality the tenant no longer allows is 400 ``modality_not_allowed``.
        """
        records: list[EvidenceRecord] = []
        for evidence_id in evidence_ids:
            record = self.get(tenant, evidence_id)
            if not tenant.allows_modality(record.modality):
                raise GatewayError(
                    "modality_not_allowed", f"The {record.modality} modality is not allowed."
                )
            records.append(record)
        if records:
            self._catalog.take_leases(request_id, records)
            self._count_leases(request_id, len({r.id for r in records}))
        return records

    def release(self, request_id: str) -> None:
        """Drop the request's leases and files nothing else holds; idempotent."""
        released = self._catalog.release_leases(request_id)
        self._count_leases(request_id, None)
        for sha256, ext in released:
            self._drop_file_if_unreferenced(sha256, ext)

    def read_bytes(self, record: EvidenceRecord) -> bytes:
        return self._store.read(record.sha256, record.ext)

    def active_leases(self) -> int:
        return self._catalog.active_leases()

    def _count_leases(self, request_id: str, taken: int | None) -> None:
        """``taken`` leases for the request, or None when they were released."""
        with self._held_lock:
            if taken is None:
                if self._held.pop(request_id, None) is None:
                    return
            else:
                self._held[request_id] = self._held.get(request_id, 0) + taken
            count = sum(self._held.values())
        if self._on_leases_change is not None:
            self._on_leases_change(count)

    def _drop_file_if_unreferenced(self, sha256: str, ext: str) -> None:
        try:
            with self._store.exclusive():
                if not self._catalog.is_referenced(sha256):
                    self._store.remove(sha256, ext)
        except GatewayError:
            logger.warning("evidence file %s.%s not removed; recover() will retry", sha256, ext)
