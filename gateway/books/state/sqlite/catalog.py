"""The evidence catalog: records and leases in SQLite (spec §5, §12 "Evidence").

Theory of operation:

- A record maps an unguessable ID (``ev_`` + 26 base32 characters from 128
  random bits) to a tenant and a stored file. Every lookup is scoped by
  tenant: another tenant's ID is indistinguishable from an unknown one.
- A lease pins a record's file for one request. Leases are taken atomically
  (all of a request's records, or none) and only for records that still
  exist at that instant, so a concurrent delete either happens first (the
  lease fails) or sees the lease (the file stays).
- A file is referenced while any record or lease names its digest; the
  service removes files only when :meth:`Catalog.is_referenced` is false.
- Leases live in the database only for the life of the server process that
  took them: :meth:`Catalog.clear_stale_leases` drops them at start. One
  server per catalog; ``evidence add`` from the CLI may run beside it.
- One connection, serialized by a lock, serves every thread. The database
  runs in WAL mode with ``synchronous=FULL`` so a committed record survives
  power loss; write transactions are ``BEGIN IMMEDIATE`` so another process
  waits on ``busy_timeout`` instead of failing mid-transaction.
- Kept responses (spec §14, §17) live in their own table of the same file
  (``gateway/books/state/sqlite/responses.py``); a catalog from before keeps its
  old ``responses`` table, unread.
- Quotas (spec §13) are checked in the same write transaction as the insert,
  so concurrent uploads cannot pass them together. Records older than their
  tenant's ``ttl_s`` are invisible to every lookup (``not_before``) before the
  expiry sweep forgets them.
- SQLite and disk errors become ``GatewayError("state_unavailable")`` (spec
  §17: never a 500); a full volume is :class:`StorageFull` (one of them), so a delete can
  make room and retry (``EvidenceService.delete``), noted in the state's
  :class:`~gateway.books.volume.VolumeWatch` until a write commits (spec §24).
  The file is the gateway user's alone (0600, ``file.connect_private``).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from gateway.books.evidence.records import (
    EvidenceRecord,
    is_evidence_id,
    new_evidence_id,
)
from gateway.books.state.sqlite.file import connect_private
from gateway.books.volume import VolumeWatch
from gateway.core.errors import GatewayError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    media_type TEXT NOT NULL,
    ext TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    locator_sha256 TEXT,
    created INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS records_sha256 ON records (sha256);
CREATE INDEX IF NOT EXISTS records_tenant ON records (tenant, created);
CREATE TABLE IF NOT EXISTS leases (
    request_id TEXT NOT NULL,
    evidence_id TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    ext TEXT NOT NULL,
    taken_at INTEGER NOT NULL,
    expires REAL,
    PRIMARY KEY (request_id, evidence_id)
);
CREATE INDEX IF NOT EXISTS leases_sha256 ON leases (sha256);
"""

# Statements are literal text: values go only through placeholders.
_INSERT_RECORD = (
    "INSERT INTO records (id, tenant, sha256, media_type, ext, bytes, locator_sha256, created) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_SELECT_RECORD = (
    "SELECT id, tenant, sha256, media_type, ext, bytes, locator_sha256, created "
    "FROM records WHERE id = ? AND tenant = ? AND created >= ?"
)
_DELETE_RECORD = (
    "DELETE FROM records WHERE id = ? AND tenant = ? "
    "RETURNING id, tenant, sha256, media_type, ext, bytes, locator_sha256, created"
)
_COLUMNS = "id, tenant, sha256, media_type, ext, bytes, locator_sha256, created"
#: whether a record or an unexpired lease names a digest
_REFERENCED = (
    "SELECT EXISTS (SELECT 1 FROM records WHERE sha256 = ?) "
    "OR EXISTS (SELECT 1 FROM leases WHERE sha256 = ? AND (expires IS NULL OR expires > ?))"
)
#: digests per ``referenced`` statement (twice that many parameters, under SQLite's 999)
_REFERENCED_BATCH = 400
#: lookups of one tenant's live records (created at or after the TTL cutoff)
_LIVE = "tenant = ? AND created >= ?"


def _translate(exc: sqlite3.Error, volume: VolumeWatch) -> GatewayError:
    if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
        return volume.found_full()
    return GatewayError("state_unavailable")


def _usage(conn: sqlite3.Connection, tenant: str, not_before: int) -> tuple[int, int]:
    count, used = conn.execute(
        f"SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM records WHERE {_LIVE}",  # noqa: S608 - constant text
        (tenant, not_before),
    ).fetchone()
    return int(count), int(used)


def _record(row: tuple[Any, ...]) -> EvidenceRecord:
    return EvidenceRecord(
        id=row[0],
        tenant=row[1],
        sha256=row[2],
        media_type=row[3],
        ext=row[4],
        bytes=row[5],
        locator_sha256=row[6],
        created=row[7],
    )


class Catalog:
    """Records and leases; see the module docstring."""

    def __init__(
        self,
        path: Path,
        *,
        busy_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        volume: VolumeWatch | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._volume = volume if volume is not None else VolumeWatch()
        try:
            conn = connect_private(path, busy_timeout_s)
        except (OSError, sqlite3.Error) as exc:
            raise GatewayError("state_unavailable") from exc
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.executescript(_SCHEMA)
            if "expires" not in {row[1] for row in conn.execute("PRAGMA table_info(leases)")}:
                # A catalog from before lease expiry (spec §17): NULL never expires.
                conn.execute("ALTER TABLE leases ADD COLUMN expires REAL")
        except sqlite3.Error as exc:
            conn.close()
            raise GatewayError("state_unavailable") from exc
        self._conn: sqlite3.Connection | None = conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._conn is None:
                raise GatewayError("state_unavailable", "The evidence catalog is closed.")
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise _translate(exc, self._volume) from exc

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._read() as conn:  # which translates every sqlite3.Error raised in here
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
                self._volume.wrote()
            except BaseException:
                # A failed COMMIT may already have rolled back; nothing is left to undo then.
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise

    def add(
        self,
        *,
        tenant: str,
        sha256: str,
        media_type: str,
        ext: str,
        size: int,
        locator_sha256: str | None,
        quota: tuple[int, int] | None = None,
        not_before: int = 0,
    ) -> EvidenceRecord:
        """Insert a record; with ``quota`` = (max records, max bytes) of the
        tenant's live records, refuse (403) in the same transaction if it would pass."""
        record = EvidenceRecord(
            id=new_evidence_id(),
            tenant=tenant,
            sha256=sha256,
            media_type=media_type,
            ext=ext,
            bytes=size,
            locator_sha256=locator_sha256,
            created=int(self._clock()),
        )
        with self._write() as conn:
            if quota is not None:
                count, used = _usage(conn, tenant, not_before)
                if count + 1 > quota[0] or used + size > quota[1]:
                    raise GatewayError("evidence_quota_exceeded")
            conn.execute(
                _INSERT_RECORD,
                (
                    record.id,
                    record.tenant,
                    record.sha256,
                    record.media_type,
                    record.ext,
                    record.bytes,
                    record.locator_sha256,
                    record.created,
                ),
            )
        return record

    def find_same(
        self,
        tenant: str,
        sha256: str,
        locator_sha256: str | None,
        not_before: int = 0,
        exclude: frozenset[str] = frozenset(),
    ) -> EvidenceRecord | None:
        """The tenant's oldest live record of these bytes under this locator, if
        any, other than those ``exclude`` names."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM records WHERE {_LIVE} AND sha256 = ? "  # noqa: S608
                "AND locator_sha256 IS ? ORDER BY created, rowid",
                (tenant, not_before, sha256, locator_sha256),
            )
            for row in rows:
                if row[0] not in exclude:
                    return _record(row)
        return None

    def usage(self, tenant: str, not_before: int = 0) -> tuple[int, int]:
        """(records, bytes) of the tenant's live records."""
        with self._read() as conn:
            return _usage(conn, tenant, not_before)

    def page(
        self, tenant: str, limit: int, after: str | None = None, not_before: int = 0
    ) -> tuple[list[EvidenceRecord], bool]:
        """The tenant's live records newest first, ``limit`` of them after the
        record ``after`` (404 if that is not one of them), and whether more follow."""
        with self._read() as conn:
            bound: tuple[Any, ...] = ()
            where = _LIVE
            if after is not None:
                cursor = conn.execute(
                    f"SELECT created, rowid FROM records WHERE {_LIVE} AND id = ?",  # noqa: S608
                    (tenant, not_before, after),
                ).fetchone()
                if cursor is None:
                    raise GatewayError("evidence_not_found", param="after")
                where += " AND (created < ? OR (created = ? AND rowid < ?))"
                bound = (cursor[0], cursor[0], cursor[1])
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM records WHERE {where} "  # noqa: S608
                "ORDER BY created DESC, rowid DESC LIMIT ?",
                (tenant, not_before, *bound, limit + 1),
            ).fetchall()
        return [_record(r) for r in rows[:limit]], len(rows) > limit

    def expire(self, tenant: str, not_before: int) -> list[EvidenceRecord]:
        """Forget the tenant's records created before ``not_before``; return them."""
        with self._write() as conn:
            rows = conn.execute(
                f"DELETE FROM records WHERE tenant = ? AND created < ? RETURNING {_COLUMNS}",  # noqa: S608
                (tenant, not_before),
            ).fetchall()
        return [_record(r) for r in rows]

    def get(self, tenant: str, evidence_id: str, not_before: int = 0) -> EvidenceRecord | None:
        if not is_evidence_id(evidence_id):
            return None
        with self._read() as conn:
            row = conn.execute(_SELECT_RECORD, (evidence_id, tenant, not_before)).fetchone()
        return None if row is None else _record(row)

    def delete(self, tenant: str, evidence_id: str) -> EvidenceRecord | None:
        if not is_evidence_id(evidence_id):
            return None
        with self._write() as conn:
            rows = conn.execute(_DELETE_RECORD, (evidence_id, tenant)).fetchall()
        return _record(rows[0]) if rows else None

    def take_leases(
        self,
        request_id: str,
        records: Sequence[EvidenceRecord],
        not_before: int = 0,
        ttl_s: float | None = None,
    ) -> None:
        """Lease every record for ``request_id`` (until ``ttl_s`` from now, or
        for good), or none (404 if any is gone)."""
        now = self._clock()
        expires = None if ttl_s is None else now + ttl_s
        with self._write() as conn:
            for record in records:
                # INSERT ... SELECT: the lease exists only if the record still does.
                cursor = conn.execute(
                    "INSERT INTO leases "
                    "(request_id, evidence_id, sha256, ext, taken_at, expires) "
                    "SELECT ?, id, sha256, ext, ?, ? FROM records "
                    "WHERE id = ? AND tenant = ? AND created >= ? "
                    # Taken again: it holds from the latest take (as PostgreSQL's does).
                    "ON CONFLICT (request_id, evidence_id) "
                    "DO UPDATE SET expires = excluded.expires",
                    (request_id, int(now), expires, record.id, record.tenant, not_before),
                )
                if cursor.rowcount == 0 and not _leased(conn, request_id, record.id):
                    raise GatewayError("evidence_not_found")

    def lease_records(
        self,
        request_id: str,
        tenant: str,
        evidence_ids: Sequence[str],
        not_before: int = 0,
        ttl_s: float | None = None,
    ) -> dict[str, EvidenceRecord]:
        """Look up and lease the tenant's live records in one transaction (a
        request's whole lookup in one call); 404 and nothing leased if any is gone."""
        wanted = sorted(set(evidence_ids))
        now = self._clock()
        expires = None if ttl_s is None else now + ttl_s
        with self._write() as conn:
            marks = ", ".join("?" * len(wanted))
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM records WHERE {_LIVE} AND id IN ({marks})",  # noqa: S608
                (tenant, not_before, *wanted),
            ).fetchall()
            if len(rows) != len(wanted):
                raise GatewayError("evidence_not_found")
            conn.executemany(
                "INSERT INTO leases (request_id, evidence_id, sha256, ext, taken_at, expires) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (request_id, evidence_id) "
                "DO UPDATE SET expires = excluded.expires",
                [(request_id, r[0], r[2], r[4], int(now), expires) for r in rows],
            )
        return {r[0]: _record(r) for r in rows}

    def drop_leases(self, request_id: str) -> list[tuple[str, str]]:
        """Drop a request's leases; the (sha256, ext) of those that nothing
        names any more (no record, no other live lease): the files to remove."""
        with self._write() as conn:
            rows = conn.execute(
                "DELETE FROM leases WHERE request_id = ? RETURNING sha256, ext", (request_id,)
            ).fetchall()
            now = self._clock()
            return sorted(
                (sha256, ext)
                for sha256, ext in {(row[0], row[1]) for row in rows}
                if not conn.execute(_REFERENCED, (sha256, sha256, now)).fetchone()[0]
            )

    def release_leases(self, request_id: str) -> list[tuple[str, str]]:
        """Drop a request's leases; the distinct (sha256, ext) they held."""
        with self._write() as conn:
            rows = conn.execute(
                "DELETE FROM leases WHERE request_id = ? RETURNING sha256, ext", (request_id,)
            ).fetchall()
        return sorted({(row[0], row[1]) for row in rows})

    def is_referenced(self, sha256: str) -> bool:
        """Whether a record or an unexpired lease names the digest."""
        with self._read() as conn:
            row = conn.execute(_REFERENCED, (sha256, sha256, self._clock())).fetchone()
        return bool(row[0])

    def referenced(self, sha256s: Sequence[str]) -> set[str]:
        """Which of the digests a record or an unexpired lease names (a sweep's batch)."""
        wanted = sorted(set(sha256s))
        found: set[str] = set()
        with self._read() as conn:
            # In pieces: SQLite bounds a statement's parameters (999 before 3.32).
            for start in range(0, len(wanted), _REFERENCED_BATCH):
                piece = wanted[start : start + _REFERENCED_BATCH]
                marks = ", ".join("?" * len(piece))
                rows = conn.execute(
                    f"SELECT sha256 FROM records WHERE sha256 IN ({marks}) "  # noqa: S608
                    f"UNION SELECT sha256 FROM leases WHERE sha256 IN ({marks}) "
                    "AND (expires IS NULL OR expires > ?)",
                    (*piece, *piece, self._clock()),
                )
                found.update(row[0] for row in rows)
        return found

    def sweep_leases(self) -> list[tuple[str, str]]:
        """Drop expired leases; the distinct (sha256, ext) they held."""
        with self._write() as conn:
            rows = conn.execute(
                "DELETE FROM leases WHERE expires IS NOT NULL AND expires <= ? "
                "RETURNING sha256, ext",
                (self._clock(),),
            ).fetchall()
        return sorted({(row[0], row[1]) for row in rows})

    def active_leases(self) -> int:
        with self._read() as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM leases WHERE expires IS NULL OR expires > ?",
                (self._clock(),),
            ).fetchone()
        return int(row[0])

    def clear_stale_leases(self) -> int:
        """Drop every lease (a crashed server's); call only at server start."""
        with self._write() as conn:
            cursor = conn.execute("DELETE FROM leases")
        return cursor.rowcount


def _leased(conn: sqlite3.Connection, request_id: str, evidence_id: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM leases WHERE request_id = ? AND evidence_id = ?", (request_id, evidence_id)
    ).fetchone()
    return row is not None
