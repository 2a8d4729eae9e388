"""One SQLite state file as every SQLite book opens it (spec §17, one replica).

- WAL mode with ``synchronous=FULL``: a write survives power loss once its
  call returned, which is before the caller is answered.
- Each book's schema is versioned under its own part name in
  ``gateway_schema_parts`` (the books share one file, so ``PRAGMA
  user_version`` is nobody's to take); migrating runs in a write
  transaction, so two processes opening one file at once take turns.
- One lock serializes the connection; every call runs in a worker thread.
  Writes are not abandoned on cancellation (a thread cannot be stopped, and
  a write cut loose could still commit after its caller was told it
  failed); reads are, since nothing depends on their end.
- Every SQLite error (a full volume, a locked or corrupt file) becomes
  ``GatewayError("state_unavailable")``, never a 500; a full volume is
  :class:`~gateway.books.evidence.records.StorageFull`, noted in the
  :class:`~gateway.books.volume.VolumeWatch` the state's writers share, which
  a committed write clears (spec §24).
- The file and its journals are the gateway's user's alone (0600, spec §24:
  it holds kept prompts): created so, and tightened if an older release left
  them readable (:func:`connect_private`).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar

import anyio.to_thread

from gateway.books.volume import VolumeWatch
from gateway.core.errors import GatewayError

T = TypeVar("T")
#: SQLite's journals beside a database file, created with its mode
JOURNALS = ("-wal", "-shm", "-journal")


def connect_private(path: Path, busy_timeout_s: float) -> sqlite3.Connection:
    """A connection on ``path``, the file (and its journals, which SQLite
    creates with the file's mode) 0600; raises ``OSError`` or ``sqlite3.Error``.

    The file is created here only when it does not exist yet (``O_EXCL``), and
    an existing one is only chmod-ed, never opened: closing any descriptor of a
    file drops every POSIX lock this process holds on it, so opening and
    closing a database this process already has connections to would make
    another process's SQLite think they are gone (it may then checkpoint and
    delete the WAL those connections still write into: their commits lost).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with suppress(FileExistsError):
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    for name in (path, *(path.with_name(path.name + j) for j in JOURNALS)):
        with suppress(FileNotFoundError):
            if os.stat(name).st_mode & 0o077:
                os.chmod(name, 0o600)
    return sqlite3.connect(
        path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
    )


class SqliteFile:
    def __init__(
        self,
        path: Path,
        part: str,
        steps: tuple[str, ...],
        *,
        busy_timeout_s: float = 5.0,
        volume: VolumeWatch | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._volume = volume if volume is not None else VolumeWatch()
        try:
            conn = connect_private(path, busy_timeout_s)
        except (OSError, sqlite3.Error) as exc:
            raise GatewayError("state_unavailable") from exc
        self._conn: sqlite3.Connection | None = conn
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            self.write_now(lambda c: _migrate(c, part, steps))
        except (sqlite3.Error, GatewayError) as exc:
            self.close()
            raise GatewayError("state_unavailable") from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._conn is None:
                raise GatewayError("state_unavailable", "The state file is closed.")
            try:
                yield self._conn
            except sqlite3.Error as exc:
                if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                    raise self._volume.found_full() from exc
                raise GatewayError("state_unavailable") from exc

    def write_now(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """``work`` in one write transaction, in this thread."""
        with self._connection() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = work(conn)
                conn.execute("COMMIT")
            except BaseException:
                # A failed COMMIT may already have rolled back; nothing is left to undo then.
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
        self._volume.wrote()
        return result

    async def write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await anyio.to_thread.run_sync(self.write_now, work)

    async def read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def run() -> T:
            with self._connection() as conn:
                return work(conn)

        return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)


def _migrate(conn: sqlite3.Connection, part: str, steps: tuple[str, ...]) -> None:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS gateway_schema_parts "
        "(part TEXT PRIMARY KEY, version INTEGER NOT NULL)"
    )
    row = conn.execute(
        "SELECT version FROM gateway_schema_parts WHERE part = ?", (part,)
    ).fetchone()
    version = 0 if row is None else int(row[0])
    if version > len(steps):
        # A newer gateway wrote this file: refuse to guess at its schema.
        raise sqlite3.DatabaseError(f"the {part} schema is newer than this gateway")
    for number in range(version + 1, len(steps) + 1):
        for statement in steps[number - 1].split(";"):
            if statement.strip():
                conn.execute(statement)
    conn.execute(
        "INSERT OR REPLACE INTO gateway_schema_parts (part, version) VALUES (?, ?)",
        (part, len(steps)),
    )
