"""Tenant files: what a tenant's agent runs (and ``url`` images) produced (spec §22 "Files").

Theory of operation:

- :meth:`FileBook.put` takes bytes in hand and returns the record a caller
  is shown: its type is sniffed from the bytes (``sniff.py``, never the
  producer's word), its id is ``file_`` and 128 random bits, its name a
  plain file name. The bytes become a blob named by their digest in the file
  store (an :class:`~gateway.books.evidence.store.EvidenceStore` on
  ``<staging.dir>/files``: temp file, read-only 0o440, fsync, rename), then
  the record is added; both inside the store's lock, as evidence does, so a
  sweep never takes a blob whose record is being added. A crash between the
  two leaves a blob nothing names, which :meth:`FileBook.sweep` removes.
- The file store is a directory of its own, beside the evidence files and
  never among them: each store's sweeps list only their own directory and
  ask only their own catalog, so the evidence sweeps can never take a
  file's blob and this one never an evidence blob, whatever the other's
  rules. The price: bytes both uploaded as evidence and produced as a file
  are stored twice.
- Every lookup is the tenant's (another tenant's id is an unknown one,
  ``file_not_found``); a malformed id is not looked up at all.
- Tenants are named; their policy is read at each call (``policy_of``: the
  runtime's current policies, so a reload applies at once).
- A tenant's files live for its ``evidence.ttl_s`` (0: until deleted):
  older ones are invisible at once and forgotten by :meth:`FileBook.expire`,
  the runtime's periodic sweep. What a tenant keeps is bounded by the same
  numbers as its evidence (``evidence.max_records`` files,
  ``evidence.max_bytes`` bytes), counted apart from its evidence: past
  either, its oldest files are forgotten as a new one is added (there is no
  listing a caller could use to find files to delete, so refusing new ones
  would strand the tenant).
- A blob goes once no record names its digest (checked again under the
  store's lock). A download holds the blob open from before its first byte,
  so a delete or an expiry meanwhile never cuts it short.
- Content is read in :data:`PIECE` pieces in worker threads, after a first
  pass checked the blob still hashes to the record's digest: a blob changed
  on disk is ``storage_error`` before any byte is sent.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import anyio.to_thread

from gateway.books.evidence.store import EvidenceStore
from gateway.books.files.records import FileRecord, is_file_id, new_file_id, plain_name
from gateway.books.files.sniff import FILE_EXTENSIONS, sniff_file
from gateway.books.protocols import FileCatalog
from gateway.books.volume import VolumeWatch
from gateway.config.policy import EvidencePolicy
from gateway.core.errors import GatewayError

log = logging.getLogger("gateway.files")

#: bytes read per thread hop when serving or checking a file
PIECE = 1 << 18
#: the file store's directory under ``staging.dir``
FILES_DIR = "files"
#: a temp file untouched this long is a crashed writer's (a put writes its
#: bytes in hand within seconds); at a one-replica start every temp is one
_TEMP_AGE_S = 3600.0
#: stored blobs checked against the catalog in one call of a sweep
_SWEEP_BATCH = 1000

__all__ = ["FILES_DIR", "PIECE", "FileBook", "FileContent", "file_store"]


def _defaults(tenant: str) -> EvidencePolicy:
    return EvidencePolicy()


def file_store(staging_dir: Path, volume: VolumeWatch | None = None) -> EvidenceStore:
    """The digest-addressed store of tenant files' blobs (on the state volume:
    a full one is ``state_unavailable``, noted with the state's other writers)."""
    return EvidenceStore(staging_dir / FILES_DIR, volume, extensions=FILE_EXTENSIONS)


class FileContent:
    """A file's bytes held open for one download (see the module docstring)."""

    def __init__(self, fd: int, record: FileRecord) -> None:
        self._fd: int | None = fd
        self.record = record

    async def verify(self) -> None:
        """Check the whole blob against the record's digest (before a byte goes out)."""
        hasher = hashlib.sha256()
        async for piece in self.pieces():
            hasher.update(piece)
        if hasher.hexdigest() != self.record.sha256:
            raise GatewayError("storage_error", "A stored file failed its digest check.")

    async def pieces(self) -> AsyncIterator[bytes]:
        """The bytes, at most :data:`PIECE` at a time; exactly ``record.bytes``."""
        offset, size = 0, self.record.bytes
        while offset < size:
            piece = await anyio.to_thread.run_sync(self._pread, min(PIECE, size - offset), offset)
            if not piece:
                raise GatewayError("storage_error", "A stored file is shorter than its record.")
            offset += len(piece)
            yield piece

    def _pread(self, size: int, offset: int) -> bytes:
        if self._fd is None:
            raise GatewayError("storage_error", "The file is closed.")
        try:
            return os.pread(self._fd, size, offset)
        except OSError as exc:
            raise GatewayError("storage_error") from exc

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


class FileBook:
    """Put, look up, read, delete and expire tenant files; see the module docstring."""

    def __init__(
        self,
        store: EvidenceStore,
        catalog: FileCatalog,
        *,
        policy_of: Callable[[str], EvidencePolicy] = _defaults,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._catalog = catalog
        #: a tenant's TTL and bound, as its policy says now
        self._policy_of = policy_of
        self._clock = clock

    @property
    def store(self) -> EvidenceStore:
        return self._store

    async def put(self, tenant: str, data: bytes, name: str) -> FileRecord:
        """Keep ``data`` as one of the tenant's files named ``name``; its record."""
        policy = self._policy_of(tenant)
        if len(data) > policy.max_bytes:
            raise GatewayError(
                "evidence_quota_exceeded", "The file is larger than the tenant may keep."
            )
        kind = sniff_file(data)
        upload = await anyio.to_thread.run_sync(self._store.stage, data)
        record = FileRecord(
            id=new_file_id(),
            tenant=tenant,
            name=plain_name(name),
            sha256=upload.sha256,
            mime_type=kind.mime,
            ext=kind.ext,
            bytes=len(data),
            created=int(self._clock()),
        )
        try:
            async with self._store.locked():
                await anyio.to_thread.run_sync(self._store.adopt, upload, kind)
                try:
                    forgotten = await self._catalog.add(
                        record, (policy.max_records, policy.max_bytes)
                    )
                except GatewayError:
                    # The add's own error is the answer; a blob left here is the sweep's.
                    with contextlib.suppress(GatewayError):
                        await self._remove_if_unreferenced(record.sha256, record.ext)
                    raise
        finally:
            upload.discard()
        if forgotten:
            log.info("files: %d of a tenant's oldest files forgotten (its bound)", len(forgotten))
            await self._drop_blobs(forgotten)
        return record

    async def get(self, tenant: str, file_id: str) -> FileRecord:
        """The tenant's live file; ``file_not_found`` otherwise (another tenant's too)."""
        record = None
        if is_file_id(file_id):
            record = await self._catalog.get(tenant, file_id, self._not_before(tenant))
        if record is None:
            raise GatewayError("file_not_found")
        return record

    async def open(self, record: FileRecord) -> FileContent:
        """The file's bytes held open (the caller closes it); ``file_not_found``
        when its blob went meanwhile (deleted or expired since the lookup)."""
        path = self._store.path_for(record.sha256, record.ext)
        try:
            fd = await anyio.to_thread.run_sync(os.open, path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise GatewayError("file_not_found") from None
        except OSError as exc:
            raise GatewayError("storage_error") from exc
        return FileContent(fd, record)

    async def read(self, record: FileRecord) -> bytes:
        """The whole file, digest-checked (for files small enough to hold)."""
        return await anyio.to_thread.run_sync(self._store.read, record.sha256, record.ext)

    async def delete(self, tenant: str, file_id: str) -> FileRecord:
        """Forget the tenant's file at once, through every replica; its blob goes
        once nothing names it."""
        record = None
        if is_file_id(file_id):
            record = await self._catalog.delete(tenant, file_id)
        if record is None:
            raise GatewayError("file_not_found")
        await self._drop_blobs([record])
        return record

    async def expire(self, tenant: str) -> int:
        """Forget the tenant's files past its ``evidence.ttl_s``; how many."""
        not_before = self._not_before(tenant)
        if not not_before:
            return 0
        records = await self._catalog.expire(tenant, not_before)
        await self._drop_blobs(records)
        return len(records)

    async def sweep(self, *, at_start: bool = False) -> int:
        """Remove blobs no record names and temps a crashed writer left (at a
        one-replica start: every temp); how many blobs went. Never raises: a
        store that is down is logged and the next sweep tries again."""
        removed = 0
        try:
            async with self._store.locked():
                age = 0.0 if at_start else _TEMP_AGE_S
                await anyio.to_thread.run_sync(self._store.sweep_temp, age)
            blobs = await anyio.to_thread.run_sync(self._store.files)
            for start in range(0, len(blobs), _SWEEP_BATCH):
                batch = blobs[start : start + _SWEEP_BATCH]
                named = await self._catalog.referenced([sha256 for sha256, _ in batch])
                for sha256, ext in batch:
                    if sha256 not in named:
                        async with self._store.locked():
                            removed += await self._remove_if_unreferenced(sha256, ext)
        except GatewayError as exc:
            log.warning("files: the sweep failed (%s); the next one retries", exc.code)
        if removed:
            log.info("files: %d blobs no record named were removed", removed)
        return removed

    def _not_before(self, tenant: str) -> int:
        """Files created before this (unix seconds) are past the tenant's TTL."""
        ttl = self._policy_of(tenant).ttl_s
        return int(self._clock() - ttl) if ttl else 0

    async def _drop_blobs(self, records: Sequence[FileRecord]) -> None:
        for sha256, ext in sorted({(r.sha256, r.ext) for r in records}):
            try:
                # Most digests named twice are still named: one lookup, no lock.
                if await self._catalog.is_referenced(sha256):
                    continue
                async with self._store.locked():
                    await self._remove_if_unreferenced(sha256, ext)
            except GatewayError as exc:
                log.warning("files: a blob was not removed (%s); the sweep retries", exc.code)

    async def _remove_if_unreferenced(self, sha256: str, ext: str) -> int:
        """Under the store's lock: a put of the same bytes cannot slip in between."""
        if await self._catalog.is_referenced(sha256):
            return 0
        await anyio.to_thread.run_sync(self._store.remove, sha256, ext)
        return 1
