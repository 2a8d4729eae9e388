"""Staged evidence into the forwarded body: read, verify, encode -- in bounded pieces.

Runs only after the request holds its admission permit (spec §13). For each
media slot of a :class:`~gateway.core.body.Layout` the staged file is read in
pieces of :data:`PIECE_RAW` bytes (a multiple of 3, so the base64 of the
pieces joins into the base64 of the whole), each read, hashed and encoded in
a worker thread and handed to the upstream connection, which waits while the
worker's socket is full. One request therefore holds about one piece of
media at a time, whatever the size of its evidence.

Each distinct file is opened once per request and every pass over it is
digest-checked: the last piece of a pass is released only after the whole
pass hashed to the record's SHA-256. A file that changed on disk raises
``storage_error`` before its last piece, so the worker never receives a
complete body holding unverified bytes (the connection is closed on a
truncated body, which the worker discards).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator
from typing import Any

from gateway.books.evidence.store import EvidenceStore
from gateway.core.body import Layout, MediaSlot
from gateway.core.errors import GatewayError

#: raw bytes per piece: 768 KiB of media become 1 MiB of base64
PIECE_RAW = 786_432


class BodyProducer:
    """The pieces of one forwarded body, hashed as they go (``request_sha256``)."""

    def __init__(self, layout: Layout, store: EvidenceStore) -> None:
        self.layout = layout
        self.store = store
        self.hasher = hashlib.sha256()
        self.sent = 0
        #: seconds spent reading, checking and encoding media (receipt timings_ms.media)
        self.media_s = 0.0
        self._files: dict[str, int] = {}

    @property
    def complete(self) -> bool:
        return self.sent == self.layout.size

    async def pieces(self) -> AsyncIterator[bytes]:
        try:
            for segment in self.layout.segments:
                if isinstance(segment, bytes):
                    yield self._out(segment)
                    continue
                yield self._out(segment.prefix)
                async for piece in self._media(segment):
                    yield self._out(piece)
                yield self._out(b'"')
        finally:
            self.close()

    def _out(self, data: bytes) -> bytes:
        self.hasher.update(data)
        self.sent += len(data)
        return data

    async def _media(self, slot: MediaSlot) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        fd = self._files.get(slot.sha256)
        if fd is None:
            began = loop.time()
            fd = await loop.run_in_executor(None, self.store.open_read, slot.sha256, slot.ext)
            self.media_s += loop.time() - began
            self._files[slot.sha256] = fd
        digest = hashlib.sha256()
        offset = 0
        while offset < slot.raw_bytes or offset == 0:
            began = loop.time()
            piece = await loop.run_in_executor(None, self._piece, fd, offset, digest, slot)
            self.media_s += loop.time() - began
            offset += PIECE_RAW
            yield piece
            if offset >= slot.raw_bytes:
                return

    def _piece(self, fd: int, offset: int, digest: Any, slot: MediaSlot) -> bytes:
        want = min(PIECE_RAW, slot.raw_bytes - offset)
        data = self.store.pread(fd, want, offset)
        digest.update(data)
        if offset + want >= slot.raw_bytes:
            # The last piece of the pass: the file must end here and match.
            extra = self.store.pread(fd, 1, offset + want)
            if len(data) != want or extra or digest.hexdigest() != slot.sha256:
                raise GatewayError(
                    "storage_error", "A stored evidence file failed its digest check."
                )
        elif len(data) != want:
            raise GatewayError("storage_error", "A stored evidence file is truncated.")
        return base64.b64encode(data)

    def close(self) -> None:
        files, self._files = self._files, {}
        for fd in files.values():
            with contextlib.suppress(OSError):
                os.close(fd)
