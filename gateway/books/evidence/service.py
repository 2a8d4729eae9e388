"""Evidence staging: the one code path for HTTP uploads and ``evidence add``.

Theory of operation:

- An upload's bytes go to a temp file as they arrive (hashed on the way; its
  first bytes kept for sniffing), so no upload sits in memory whole. It is
  then checked (locator, size, sniffed type against the declared one, tenant
  modality); the same bytes under the same locator answer with the tenant's
  existing record; an image's or a video's declared pixels are held to
  ``staging.max_image_pixels`` and ``max_image_side`` (read from its header
  only: ``gateway/core/dimensions.py``, spec §24); the tenant's quota
  (``evidence.max_records``,
  ``max_bytes``) is checked before the file is kept and again in the insert's
  transaction. The file is renamed into place first and the record added
  after, both inside the store's lock: a crash before the rename leaves no
  visible record and no final file; a crash between rename and insert, or a
  state store lost at the insert (its COMMIT included) so that the file's
  removal cannot be checked either, leaves an unreferenced file that the
  periodic :meth:`EvidenceService.sweep_staged` removes (and
  :meth:`EvidenceService.recover` at the next start).
- Records older than the tenant's ``evidence.ttl_s`` are invisible at once and
  forgotten by :meth:`EvidenceService.expire` (the runtime's sweep) exactly as
  a delete forgets them: leased files stay until the lease ends.
- A file is removed only under the store's lock and only when the catalog
  says no record or lease names its digest, so an upload of the same bytes
  racing a delete either re-creates the file or keeps it.
- Deleting a record forgets it at once; its file stays while a lease holds
  it and goes when the last lease is released. Leases are all-or-nothing
  per request, and releasing is idempotent.
- A failure to remove a file that nothing references is logged, not raised:
  the caller's operation already took effect, and ``recover`` sweeps the file.

- The catalog is any :class:`~gateway.books.protocols.EvidenceCatalog`:
  SQLite for one replica, PostgreSQL shared by a fleet (spec §17). Leases
  expire ``lease_ttl_s`` after they are taken (``upstream.total_timeout_s`` +
  10 s), so a crashed replica's leases free their files by themselves; any
  replica's :meth:`EvidenceService.sweep` then removes what nothing holds.
- File work (hashing, renames, reads) runs in worker threads; the service
  itself is async.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio.to_thread

from gateway.books.evidence.records import EvidenceRecord, StorageFull, is_evidence_id
from gateway.books.evidence.sniff import MediaType, match_content_type
from gateway.books.evidence.store import EvidenceStore, TempUpload
from gateway.books.protocols import EvidenceCatalog
from gateway.config.policy import Tenant
from gateway.core.dimensions import PixelBounds, check_frames, frames_of
from gateway.core.errors import GatewayError

MAX_LOCATOR_CHARS = 1024
#: room kept next to the catalog so a delete can journal on a full volume
RESERVE_BYTES = 1 << 20
RESERVE_SUFFIX = ".reserve"

#: a temp file on a shared volume untouched this long is a crashed writer's
_SHARED_TEMP_AGE_S = 3600.0
#: stored files checked against the catalog in one call of a staged-file sweep
_SWEEP_BATCH = 1000

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
        catalog: EvidenceCatalog,
        on_leases_change: Callable[[int], None] | None = None,
        *,
        reserve: Path | None = None,
        lease_ttl_s: float = 610.0,
        shared: bool = False,
        clock: Callable[[], float] = time.time,
        pixels: PixelBounds | None = None,
    ) -> None:
        self._store = store
        self._pixels = pixels or PixelBounds()
        self._catalog = catalog
        self._reserve = reserve
        self._lease_ttl_s = lease_ttl_s
        #: other replicas share the catalog and the volume (their temps and leases are theirs)
        self._shared = shared
        self._clock = clock
        # This replica's leases, counted here instead of asking the catalog each
        # time: request id -> leased records (distinct ids, as the catalog keeps them).
        self._held: dict[str, int] = {}
        self._on_leases_change = on_leases_change
        #: records staged from a request's inline data (forgotten when it ends):
        #: never what an upload of the same bytes is answered with
        self._inline: set[str] = set()

    @property
    def store(self) -> EvidenceStore:
        return self._store

    @property
    def catalog(self) -> EvidenceCatalog:
        return self._catalog

    async def close(self) -> None:
        await self._catalog.close()

    async def recover(self) -> None:
        """Server start: drop a crashed run's temps and leases, and files nothing
        names; make the catalog's reserve."""
        await anyio.to_thread.run_sync(self.keep_reserve)
        async with self._store.locked():
            # A shared volume: another replica's upload may be writing its temp now.
            await anyio.to_thread.run_sync(
                self._store.sweep_temp, _SHARED_TEMP_AGE_S if self._shared else 0.0
            )
            await self._catalog.recover_leases()
            for sha256, ext in await anyio.to_thread.run_sync(self._store.files):
                if not await self._catalog.is_referenced(sha256):
                    await anyio.to_thread.run_sync(self._store.remove, sha256, ext)

    async def sweep(self) -> int:
        """Drop expired leases (a crashed replica's) and the files only they
        held; how many distinct files those leases held."""
        released = await self._catalog.sweep_leases()
        for sha256, ext in released:
            await self._drop_file_if_unreferenced(sha256, ext)
        return len(released)

    async def sweep_staged(self) -> int:
        """The periodic sweep of staged files (not only at start): remove
        stored files no record and no unexpired lease names, and temps a
        crashed writer left; how many stored files went. Never raises: a
        store that is down is logged and the next sweep tries again.

        The catalog is asked in batches (one call per :data:`_SWEEP_BATCH`
        files); each file it names nowhere is checked again under the store's
        lock, which an upload holds from its rename to its insert, so a file
        whose record is being added right now is never taken for an orphan."""
        removed = 0
        try:
            async with self._store.locked():
                await anyio.to_thread.run_sync(self._store.sweep_temp, _SHARED_TEMP_AGE_S)
            files = await anyio.to_thread.run_sync(self._store.files)
            for start in range(0, len(files), _SWEEP_BATCH):
                batch = files[start : start + _SWEEP_BATCH]
                named = await self._catalog.referenced([sha256 for sha256, _ in batch])
                for sha256, ext in batch:
                    if sha256 in named:
                        continue
                    async with self._store.locked():
                        if not await self._catalog.is_referenced(sha256):
                            await anyio.to_thread.run_sync(self._store.remove, sha256, ext)
                            removed += 1
        except GatewayError as exc:
            logger.warning("evidence: the staged-file sweep failed (%s); will retry", exc.code)
        if removed:
            logger.info("evidence: %d staged files no record named were removed", removed)
        return removed

    def begin_upload(self) -> TempUpload:
        """Where an upload's bytes go while they arrive (``commit_upload`` or discard)."""
        return self._store.begin_upload()

    async def commit_upload(
        self,
        tenant: Tenant,
        upload: TempUpload,
        content_type: str | None,
        locator: str | None,
        *,
        inline: bool = False,
    ) -> tuple[EvidenceRecord, bool]:
        """Check and store a finished upload; (record, True) when the tenant had
        these bytes under this locator already (nothing new is stored).

        The temp file is consumed either way. ``inline`` (a request's own
        inline data, forgotten when it ends) skips dedup and the quota."""
        try:
            locator_sha256 = locator_digest(locator)
            if upload.size > tenant.limits.max_media_bytes:
                raise GatewayError(
                    "body_too_large", "The media file exceeds the tenant's size limit."
                )
            media = match_content_type(content_type, upload.head)
            if not tenant.allows_modality(media.modality):
                raise GatewayError(
                    "modality_not_allowed", f"The {media.modality} modality is not allowed."
                )
            frames = await anyio.to_thread.run_sync(
                frames_of, media.ext, upload.read_at, upload.size
            )
            check_frames(frames, self._pixels)
            async with self._store.locked():
                return await self._commit_locked(tenant, upload, media, locator_sha256, inline)
        finally:
            upload.discard()

    async def _commit_locked(
        self,
        tenant: Tenant,
        upload: TempUpload,
        media: MediaType,
        locator_sha256: str | None,
        inline: bool,
    ) -> tuple[EvidenceRecord, bool]:
        policy = tenant.policy.evidence
        not_before = self._not_before(tenant)
        limits = None
        if not inline:
            same = await self._catalog.find_same(
                tenant.name,
                upload.sha256,
                locator_sha256,
                not_before,
                exclude=frozenset(self._inline),
            )
            if same is not None:
                return same, True
            limits = (policy.max_records, policy.max_bytes)
            # Checked before the file is kept, and again with the insert.
            count, used = await self._catalog.usage(tenant.name, not_before)
            if count + 1 > limits[0] or used + upload.size > limits[1]:
                raise GatewayError("evidence_quota_exceeded")
        stored = await anyio.to_thread.run_sync(self._store.adopt, upload, media)
        try:
            record = await self._catalog.add(
                tenant=tenant.name,
                sha256=stored.sha256,
                media_type=media.mime,
                ext=stored.ext,
                size=stored.bytes,
                locator_sha256=locator_sha256,
                quota=limits,
                not_before=not_before,
            )
        except GatewayError:
            # The insert's own error is the answer: a store lost at its COMMIT
            # cannot say whether anything names the file now either, and the
            # periodic sweep removes it once the store answers (spec §24).
            with contextlib.suppress(GatewayError):
                await self._remove_if_unreferenced(stored.sha256, stored.ext)
            raise
        if inline:
            # Marked under the lock: no upload deduplicates onto it before.
            self._inline.add(record.id)
        await anyio.to_thread.run_sync(self.keep_reserve)
        return record, False

    async def upload(
        self, tenant: Tenant, data: bytes, content_type: str | None, locator: str | None
    ) -> EvidenceRecord:
        """Stage bytes already in hand (``evidence add``) the way an HTTP upload is."""
        if len(data) > tenant.limits.max_media_bytes:
            raise GatewayError("body_too_large", "The media file exceeds the tenant's size limit.")
        upload = await anyio.to_thread.run_sync(self._store.stage, data)
        return (await self.commit_upload(tenant, upload, content_type, locator))[0]

    async def upload_inline(
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
        upload = await anyio.to_thread.run_sync(self._store.stage, data)
        # Its own record: never the tenant's (which the request's end would delete),
        # and never an upload's answer either (the request's end deletes it).
        record, _ = await self.commit_upload(tenant, upload, declared, None, inline=True)
        return record

    async def get(self, tenant: Tenant, evidence_id: str) -> EvidenceRecord:
        record = await self._catalog.get(tenant.name, evidence_id, self._not_before(tenant))
        if record is None:
            raise GatewayError("evidence_not_found")
        return record

    async def usage(self, tenant: Tenant) -> tuple[int, int]:
        """(records, bytes) of the tenant's live records."""
        return await self._catalog.usage(tenant.name, self._not_before(tenant))

    async def page(
        self, tenant: Tenant, limit: int, after: str | None
    ) -> tuple[list[EvidenceRecord], bool]:
        return await self._catalog.page(tenant.name, limit, after, self._not_before(tenant))

    async def delete(self, tenant: Tenant, evidence_id: str) -> EvidenceRecord:
        """Forget a record at once (through every replica); its file goes once
        nothing else holds it.

        Works on a full volume: SQLite needs room to journal even a delete, so
        when it finds none the catalog's reserve file (:meth:`keep_reserve`) is
        given up for it and made again later."""
        try:
            record = await self._catalog.delete(tenant.name, evidence_id)
        except StorageFull:
            self._release_reserve()
            record = await self._catalog.delete(tenant.name, evidence_id)
        if record is None:
            raise GatewayError("evidence_not_found")
        self._inline.discard(record.id)
        await self._drop_file_if_unreferenced(record.sha256, record.ext)
        return record

    async def expire(self, tenant: Tenant) -> int:
        """Forget the tenant's records past its ``ttl_s``, as DELETE does; how many."""
        not_before = self._not_before(tenant)
        if not not_before:
            return 0
        try:
            records = await self._catalog.expire(tenant.name, not_before)
        except StorageFull:
            self._release_reserve()
            records = await self._catalog.expire(tenant.name, not_before)
        self._inline.difference_update(r.id for r in records)
        for record in records:
            await self._drop_file_if_unreferenced(record.sha256, record.ext)
        return len(records)

    def keep_reserve(self) -> None:
        """Keep :data:`RESERVE_BYTES` next to the catalog for deletes on a full
        volume (best effort: a full volume at start just has none yet)."""
        if self._reserve is None or self._reserve.exists():
            return
        try:
            # The state's files are the gateway user's alone (spec §24).
            fd = os.open(self._reserve, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(b"\0" * RESERVE_BYTES)
                handle.flush()
                os.fsync(handle.fileno())
        except FileExistsError:
            return
        except OSError:
            with contextlib.suppress(OSError):
                self._reserve.unlink()

    def _release_reserve(self) -> None:
        if self._reserve is not None:
            with contextlib.suppress(OSError):
                self._reserve.unlink()
                logger.warning("evidence volume full: the catalog's reserve was used for a delete")

    def _not_before(self, tenant: Tenant) -> int:
        """Records created before this (unix seconds) are past the tenant's TTL."""
        ttl = tenant.policy.evidence.ttl_s
        return int(self._clock() - ttl) if ttl else 0

    async def lease(
        self, request_id: str, tenant: Tenant, evidence_ids: Sequence[str]
    ) -> list[EvidenceRecord]:
        """Lease every ID for the request, in order, or none of them: one
        catalog call for the lookups and the leases together.

        Unknown and foreign IDs are 404 ``evidence_not_found``; a record whose
        modality the tenant no longer allows is 400 ``modality_not_allowed``.
        """
        if not evidence_ids:
            return []
        if not all(is_evidence_id(i) for i in evidence_ids):
            raise GatewayError("evidence_not_found")
        found = await self._catalog.lease_records(
            request_id, tenant.name, evidence_ids, self._not_before(tenant), self._lease_ttl_s
        )
        records = [found[i] for i in evidence_ids]
        refused = next((r for r in records if not tenant.allows_modality(r.modality)), None)
        if refused is not None:
            # Leased with the lookup: given back, so the refusal changes nothing.
            await self._release_dropped(request_id)
            raise GatewayError(
                "modality_not_allowed", f"The {refused.modality} modality is not allowed."
            )
        self._count_leases(request_id, len(found))
        return records

    async def release(self, request_id: str) -> None:
        """Drop the request's leases and files nothing else holds; idempotent."""
        await self._release_dropped(request_id)
        self._count_leases(request_id, None)

    async def _release_dropped(self, request_id: str) -> None:
        for sha256, ext in await self._catalog.drop_leases(request_id):
            # Nothing named it as the leases went; checked again under the lock.
            try:
                async with self._store.locked():
                    await self._remove_if_unreferenced(sha256, ext)
            except GatewayError:
                logger.warning("evidence file %s.%s not removed; a sweep will retry", sha256, ext)

    async def read_bytes(self, record: EvidenceRecord) -> bytes:
        return await anyio.to_thread.run_sync(self._store.read, record.sha256, record.ext)

    async def active_leases(self) -> int:
        return await self._catalog.active_leases()

    def _count_leases(self, request_id: str, taken: int | None) -> None:
        """``taken`` leases for the request, or None when they were released."""
        if taken is None:
            if self._held.pop(request_id, None) is None:
                return
        else:
            self._held[request_id] = self._held.get(request_id, 0) + taken
        if self._on_leases_change is not None:
            self._on_leases_change(sum(self._held.values()))

    async def _drop_file_if_unreferenced(self, sha256: str, ext: str) -> None:
        try:
            # Most digests are still named by a record: one lookup, no lock.
            if await self._catalog.is_referenced(sha256):
                return
            async with self._store.locked():
                await self._remove_if_unreferenced(sha256, ext)
        except GatewayError:
            logger.warning("evidence file %s.%s not removed; a sweep will retry", sha256, ext)

    async def _remove_if_unreferenced(self, sha256: str, ext: str) -> None:
        """Under the store's lock: an upload of the same bytes cannot slip in between."""
        if not await self._catalog.is_referenced(sha256):
            await anyio.to_thread.run_sync(self._store.remove, sha256, ext)
