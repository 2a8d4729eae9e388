"""Interim tenant files: what a ``url`` image answer links to (spec §23).

Spec §22's file store (per tenant, on the state store, ``GET
/v1/files/{id}[/content]`` and ``DELETE``) is built for agents beside this
one; until it lands, :class:`InterimFiles` keeps just what the image links
need. It has that store's shape (``pipeline/services.py`` ``TenantFiles``:
``put(tenant, data, name)`` → a ``KeptFile`` record, the type sniffed from
the bytes) and one freedom more, the bytes in pieces (``ImageFiles``), so it
can be swapped for that store (once it takes pieces) without a change
elsewhere.

Rules:

- A file is ``<dir>/<id>`` with its record beside it (``<id>.json``: tenant,
  name, media type, bytes, created); both written to a temporary name and
  renamed, mode 0640 (never world-readable), in a worker thread.
- Ids are ``file_`` + 128 random bits (URL-safe base64): unguessable, and a
  link's signature names one.
- A file lives ``keep_s`` (the links' TTL): past it :meth:`get` does not see
  it, and each :meth:`put` looks at most :data:`_SCAN` directory entries and
  removes at most :data:`_SWEEP` of those older than that (files, records and
  writes cut short; bounded work per request; a quiet gateway keeps what
  expired until the next put).
- The bytes are written first, the record last: a file is served only once
  whole (a record names it), and the bytes may come in pieces, never joined.
- Errors are the store's: ``state_unavailable`` when the disk refuses (a full
  volume, spec §24), never a path in a message or a log line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio.to_thread

from gateway.core.errors import GatewayError
from gateway.core.signed_urls import FILE_ID

log = logging.getLogger("gateway.files")
#: expired files removed per put, and directory entries looked at for them
_SWEEP = 64
_SCAN = 1024
#: bytes a file's type is sniffed from
_HEAD = 16
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_MODE = 0o640


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: str
    tenant: str
    name: str
    mime_type: str
    bytes: int
    sha256: str
    created: int


def sniff(head: bytes) -> str:
    """The media type of a file from its first bytes (what it is, not what it says)."""
    return "image/png" if head.startswith(PNG_SIGNATURE) else "application/octet-stream"


class InterimFiles:
    def __init__(self, root: Path, keep_s: int) -> None:
        self.root = root
        self.keep_s = keep_s

    async def put(self, tenant: str, data: bytes | Iterable[bytes], name: str) -> FileRecord:
        """Keep ``data``: its bytes, or their pieces in order (written as they come,
        never joined: a ``url`` image is decoded piece by piece into its file)."""
        file_id = "file_" + secrets.token_urlsafe(16)
        pieces = (data,) if isinstance(data, bytes) else data
        try:
            written = await anyio.to_thread.run_sync(self._put, file_id, pieces)
            size, digest, head = written
            record = FileRecord(file_id, tenant, name, sniff(head), size, digest, int(time.time()))
            await anyio.to_thread.run_sync(self._keep, record)
        except OSError as exc:
            log.warning("files: a file could not be written (%s)", type(exc).__name__)
            raise GatewayError("state_unavailable") from exc
        return record

    async def get(self, file_id: str) -> tuple[FileRecord, bytes] | None:
        """The file and its bytes, or None (unknown, malformed id, or expired)."""
        if FILE_ID.fullmatch(file_id) is None:
            return None
        try:
            return await anyio.to_thread.run_sync(self._get, file_id)
        except OSError as exc:
            log.warning("files: a file could not be read (%s)", type(exc).__name__)
            raise GatewayError("state_unavailable") from exc

    # -- in a worker thread ---------------------------------------------------

    def _put(self, file_id: str, pieces: Iterable[bytes]) -> tuple[int, str, bytes]:
        """(size, SHA-256, first bytes) of the file written."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o750)
        hasher = hashlib.sha256()
        head = bytearray()

        def seen(piece: bytes) -> bytes:
            hasher.update(piece)
            if len(head) < _HEAD:
                head.extend(piece[: _HEAD - len(head)])
            return piece

        size = self._write(self.root / file_id, map(seen, pieces))
        return size, hasher.hexdigest(), bytes(head)

    def _keep(self, record: FileRecord) -> None:
        """The record last: a file without one is never served (and swept by mtime)."""
        self._write(self.root / f"{record.id}.json", (json.dumps(asdict(record)).encode(),))
        self._sweep()

    def _write(self, path: Path, pieces: Iterable[bytes]) -> int:
        temp = path.with_name(path.name + ".part")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _MODE)
        size = 0
        try:
            for piece in pieces:
                view = memoryview(piece)
                size += view.nbytes
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(temp)
            raise
        os.close(fd)
        os.replace(temp, path)
        return size

    def _get(self, file_id: str) -> tuple[FileRecord, bytes] | None:
        try:
            meta = json.loads((self.root / f"{file_id}.json").read_bytes())
            record = FileRecord(**meta)
            if record.created + self.keep_s <= time.time():
                return None
            return record, (self.root / file_id).read_bytes()
        except FileNotFoundError:
            return None

    def _sweep(self) -> None:
        """Files, records and cut writes past ``keep_s`` (by mtime), a bounded few."""
        deadline = time.time() - self.keep_s
        removed = 0
        with os.scandir(self.root) as entries:
            for seen, entry in enumerate(entries):
                if removed >= _SWEEP or seen >= _SCAN:
                    break
                try:
                    if entry.stat().st_mtime > deadline:
                        continue
                    os.unlink(entry.path)
                except FileNotFoundError:
                    continue  # another replica swept it first
                removed += 1
