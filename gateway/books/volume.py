"""The state volume's fullness, as every writer on it finds it (spec §24).

Evidence files (``evidence/store.py``), evidence records and kept responses
(the SQLite file beside them, ``state/sqlite``) share one volume. A write
that finds it full (``ENOSPC``, ``EDQUOT``; SQLite's ``SQLITE_FULL``) is
:class:`~gateway.books.evidence.records.StorageFull`, 503
``state_unavailable`` for the request that needed it, never a 500; and
:attr:`VolumeWatch.full` stays true until a write succeeds again, which
``/readyz`` lists (``"degraded": ["state_volume_full"]``, status still 200:
the volume is shared, and what needs no state keeps being served).

One object per runtime, shared by the writers (``state/factory.py``); they
call it from worker threads, where setting a flag is all it does.
"""

from __future__ import annotations

import errno
import logging

from gateway.books.evidence.records import StorageFull
from gateway.core.errors import ErrorCode, GatewayError

log = logging.getLogger("gateway.state")

#: what a write on a full volume fails with: no room, or the owner's quota spent
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class VolumeWatch:
    def __init__(self) -> None:
        self.full = False

    def failed(self, exc: OSError, code: ErrorCode = "storage_error") -> GatewayError:
        """What a failed write is for its caller: :class:`StorageFull` when the
        volume is full (noted), else ``code``."""
        if exc.errno in FULL_ERRNOS:
            return self.found_full()
        return GatewayError(code)

    def found_full(self) -> StorageFull:
        if not self.full:
            # Once per episode: a full volume refuses every write until room is made.
            log.error("state volume full: writes get state_unavailable until one succeeds")
            self.full = True
        return StorageFull()

    def wrote(self) -> None:
        if self.full:
            log.info("state volume: a write succeeded again")
            self.full = False
