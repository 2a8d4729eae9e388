"""Digest-addressed evidence files (spec §5, §12 "Evidence").

Theory of operation:

- A file's name is ``<sha256>.<ext>`` of its bytes, flat in one directory, so
  identical bytes are stored once and a name can only ever hold those bytes.
- A file becomes visible only complete: bytes go to ``.tmp-<random>`` in the
  same directory (0o600), are made read-only for the gateway's user and group
  (0o440: never world-readable, spec §24) and fsynced, then renamed onto
  the final name, and the directory is fsynced so the rename survives a
  crash. A crash before the rename leaves only a temp file, which
  :meth:`EvidenceStore.sweep_temp` removes at the next start.
- Reads re-check the digest: a file changed on disk is a ``storage_error``,
  never bytes passed on as verified.
- Every mutation runs under :meth:`EvidenceStore.locked`, an ``flock`` on
  ``<dir>/.lock`` that serializes tasks, processes and replicas sharing the
  volume (the servers and the ``evidence add`` CLI) alike; the caller holds
  it across a store write and its catalog update (``adopt``, ``remove`` and
  ``sweep_temp`` do not take it themselves). The kernel drops the lock when
  a process dies.
- Disk errors become ``GatewayError("storage_error")``, except a write that
  finds the volume full: :class:`StorageFull` (503 ``state_unavailable``,
  noted in the store's :class:`~gateway.books.volume.VolumeWatch`, which a
  stored file clears); messages never name paths.

File work is synchronous: the service calls it through ``anyio.to_thread``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import re
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio.to_thread

from gateway.books.evidence.sniff import EXTENSIONS, MediaType
from gateway.books.volume import VolumeWatch
from gateway.core.errors import GatewayError

TEMP_PREFIX = ".tmp-"
_LOCK_NAME = ".lock"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_STORED_NAME = re.compile(r"^([0-9a-f]{64})\.([a-z0-9]{1,8})$")


@dataclass(frozen=True, slots=True)
class StoredFile:
    sha256: str
    ext: str
    bytes: int
    path: Path


#: bytes of an upload's start kept for sniffing (the sniffer reads far fewer)
HEAD_BYTES = 4096


class TempUpload:
    """An upload being written to a temp file in the store's directory, hashed
    as it goes: the body never sits in memory whole."""

    def __init__(self, fd: int, path: Path, volume: VolumeWatch) -> None:
        self.fd: int | None = fd
        self.path = path
        self.volume = volume
        self.adopted = False
        self.hasher = hashlib.sha256()
        self.size = 0
        self.head = b""

    def write(self, data: bytes) -> None:
        assert self.fd is not None
        if len(self.head) < HEAD_BYTES:
            self.head += data[: HEAD_BYTES - len(self.head)]
        self.hasher.update(data)
        self.size += len(data)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            raise self.volume.failed(exc) from exc

    @property
    def sha256(self) -> str:
        return self.hasher.hexdigest()

    def read_at(self, offset: int, size: int) -> bytes:
        """Up to ``size`` of the bytes written so far, at ``offset`` (header reads)."""
        assert self.fd is not None
        try:
            return os.pread(self.fd, size, offset)
        except OSError as exc:
            raise GatewayError("storage_error") from exc

    def discard(self) -> None:
        """Drop the temp file unless it became a stored file (idempotent)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        if not self.adopted:
            self.adopted = True  # nothing left to drop next time
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def _flock(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        raise GatewayError("storage_error") from exc


class EvidenceStore:
    """Files named by their SHA-256 in one directory; see the module docstring."""

    def __init__(self, directory: Path, volume: VolumeWatch | None = None) -> None:
        self._dir = directory
        #: whether the volume was last found full (shared with the state's other writers)
        self.volume = volume if volume is not None else VolumeWatch()
        #: tasks of this process take turns before one of them takes the flock
        self._local = asyncio.Lock()
        #: bytes of stored media read back so far (what tests assert on: a
        #: request refused before admission reads none)
        self.bytes_read = 0
        self._count_lock = threading.Lock()
        try:
            directory.mkdir(mode=0o750, parents=True, exist_ok=True)
        except OSError as exc:
            raise GatewayError("storage_error") from exc

    @property
    def directory(self) -> Path:
        return self._dir

    @contextlib.asynccontextmanager
    async def locked(self) -> AsyncIterator[None]:
        """Hold the store's lock: one task of this process at a time, and one
        process of all that mount the directory (an ``flock`` on ``.lock``,
        which NFSv4, CephFS and EFS honour across hosts). Not re-entrant."""
        async with self._local:
            try:
                fd = os.open(self._dir / _LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise self.volume.failed(exc) from exc
            try:
                # The descriptor is ours before the wait: a task cancelled while
                # the thread waits still closes it, and with it the lock.
                await anyio.to_thread.run_sync(_flock, fd)
                yield
            finally:
                os.close(fd)

    def path_for(self, sha256: str, ext: str) -> Path:
        if not _SHA256.match(sha256) or ext not in EXTENSIONS:
            raise GatewayError("storage_error", "Invalid evidence file name.")
        return self._dir / f"{sha256}.{ext}"

    def begin_upload(self) -> TempUpload:
        """A temp file for an upload (call :meth:`adopt` or ``discard`` on it)."""
        try:
            fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=self._dir)
        except OSError as exc:
            raise self.volume.failed(exc) from exc
        return TempUpload(fd, Path(temp), self.volume)

    def adopt(self, upload: TempUpload, media: MediaType) -> StoredFile:
        """Make a finished upload ``<sha256>.<ext>`` (or drop it if an intact copy is there)."""
        digest = upload.sha256
        target = self.path_for(digest, media.ext)
        stored = StoredFile(digest, media.ext, upload.size, target)
        fd = upload.fd
        assert fd is not None
        try:
            if self._intact(target, digest):
                upload.discard()
                self.volume.wrote()  # its bytes were written in full
                return stored
            # Read-only before it becomes visible: no moment exists where
            # the final name is writable (or readable by others).
            os.fchmod(fd, 0o440)
            os.fsync(fd)
            os.close(fd)
            upload.fd = None
            os.replace(upload.path, target)
            upload.adopted = True
            self._fsync_dir()
        except OSError as exc:
            upload.discard()
            raise self.volume.failed(exc) from exc
        self.volume.wrote()
        return stored

    def stage(self, data: bytes) -> TempUpload:
        """A temp upload holding bytes already in hand (discarded if the write fails)."""
        upload = self.begin_upload()
        try:
            upload.write(data)
        except BaseException:
            upload.discard()
            raise
        return upload

    def put(self, data: bytes, media: MediaType) -> StoredFile:
        """Store ``data`` as ``<sha256>.<ext>`` unless an intact copy is already there
        (a damaged copy under the name is replaced by the good bytes)."""
        return self.adopt(self.stage(data), media)

    def read(self, sha256: str, ext: str) -> bytes:
        """The stored bytes, after checking they still hash to ``sha256``."""
        path = self.path_for(sha256, ext)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise GatewayError("storage_error") from exc
        self._count(len(data))
        if hashlib.sha256(data).hexdigest() != sha256:
            raise GatewayError("storage_error", "A stored evidence file failed its digest check.")
        return data

    def open_read(self, sha256: str, ext: str) -> int:
        """A read-only descriptor on a stored file (the caller closes it)."""
        try:
            return os.open(self.path_for(sha256, ext), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise GatewayError("storage_error") from exc

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        try:
            data = os.pread(fd, size, offset)
        except OSError as exc:
            raise GatewayError("storage_error") from exc
        self._count(len(data))
        return data

    def _count(self, n: int) -> None:
        with self._count_lock:
            self.bytes_read += n

    def exists(self, sha256: str, ext: str) -> bool:
        return self.path_for(sha256, ext).exists()

    def remove(self, sha256: str, ext: str) -> None:
        path = self.path_for(sha256, ext)
        try:
            path.unlink(missing_ok=True)
            self._fsync_dir()
        except OSError as exc:
            raise GatewayError("storage_error") from exc

    def files(self) -> list[tuple[str, str]]:
        """(sha256, ext) of every stored file."""
        try:
            names = os.listdir(self._dir)
        except OSError as exc:
            raise GatewayError("storage_error") from exc
        found: list[tuple[str, str]] = []
        for name in sorted(names):
            match = _STORED_NAME.match(name)
            if match and match.group(2) in EXTENSIONS:
                found.append((match.group(1), match.group(2)))
        return found

    def sweep_temp(self, min_age_s: float = 0.0) -> int:
        """Remove temp files left by a crashed writer, those unchanged for
        ``min_age_s`` (replicas sharing the volume: another's upload may be
        under way); returns how many."""
        removed = 0
        cutoff = time.time() - min_age_s
        try:
            for name in os.listdir(self._dir):
                if name.startswith(TEMP_PREFIX):
                    path = self._dir / name
                    with contextlib.suppress(FileNotFoundError):
                        if min_age_s and path.stat().st_mtime > cutoff:
                            continue
                        path.unlink()
                        removed += 1
            if removed:
                self._fsync_dir()
        except OSError as exc:
            raise GatewayError("storage_error") from exc
        return removed

    @staticmethod
    def _intact(path: Path, digest: str) -> bool:
        hasher = hashlib.sha256()
        try:
            with path.open("rb") as handle:
                while piece := handle.read(1 << 20):
                    hasher.update(piece)
        except FileNotFoundError:
            return False
        return hasher.hexdigest() == digest

    def _fsync_dir(self) -> None:
        fd = os.open(self._dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
