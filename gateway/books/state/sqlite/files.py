"""Tenant files' records in SQLite (spec §22 "Files", §17), one replica.

Theory of operation:

- Its own connection to the state file (the evidence catalog's), opened as
  every SQLite book opens it (``gateway/books/state/sqlite/file.py``: durable
  writes, the versioned schema part ``tenant_files``, threads,
  ``state_unavailable``): a record exists once :meth:`SqliteFileCatalog.add`
  returned, which is before a caller is shown its id.
- Every lookup names the tenant: another tenant's id is an unknown one.
- ``add`` inserts and applies the tenant's bound in one write transaction
  (SQLite has one writer at a time, so no two adds pass a bound together):
  past it, the tenant's oldest files are forgotten first, never the new one.
  ``rowid`` orders files created in the same second.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.books.files.records import FileRecord
from gateway.books.state.sqlite.file import SqliteFile

_PART = "tenant_files"
_STEPS: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS tenant_files (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        mime_type TEXT NOT NULL,
        ext TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        created INTEGER NOT NULL
    );
    CREATE INDEX IF NOT EXISTS tenant_files_sha256 ON tenant_files (sha256);
    CREATE INDEX IF NOT EXISTS tenant_files_tenant ON tenant_files (tenant, created);
    """,
)

# Statements are literal text: values go only through placeholders.
_COLUMNS = "id, tenant, name, sha256, mime_type, ext, bytes, created"
_INSERT = f"INSERT INTO tenant_files ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"  # noqa: S608
_USAGE = "SELECT count(*), coalesce(sum(bytes), 0) FROM tenant_files WHERE tenant = ?"
#: the tenant's files past the count or byte bound, counted from the new one
#: (first whatever its clock said), then newest first
_ORDER = "ORDER BY id = :new DESC, created DESC, rowid DESC"
_FORGET_OLDEST = (
    f"DELETE FROM tenant_files WHERE id IN ("  # noqa: S608 - constant text
    " SELECT id FROM ("
    f"  SELECT id, row_number() OVER ({_ORDER}) AS n, sum(bytes) OVER ({_ORDER}) AS upto"
    "  FROM tenant_files WHERE tenant = :tenant"
    " ) WHERE n > :count OR upto > :bytes"
    f") RETURNING {_COLUMNS}"
)


def _record(row: Sequence[Any]) -> FileRecord:
    return FileRecord(
        id=row[0],
        tenant=row[1],
        name=row[2],
        sha256=row[3],
        mime_type=row[4],
        ext=row[5],
        bytes=int(row[6]),
        created=int(row[7]),
    )


def _row(r: FileRecord) -> tuple[object, ...]:
    return (r.id, r.tenant, r.name, r.sha256, r.mime_type, r.ext, r.bytes, r.created)


class SqliteFileCatalog:
    """:class:`~gateway.books.protocols.FileCatalog` on one SQLite file."""

    def __init__(self, path: Path, *, busy_timeout_s: float = 5.0) -> None:
        self._file = SqliteFile(path, _PART, _STEPS, busy_timeout_s=busy_timeout_s)

    async def add(
        self, record: FileRecord, bound: tuple[int, int] | None = None
    ) -> list[FileRecord]:
        def work(conn: sqlite3.Connection) -> list[FileRecord]:
            conn.execute(_INSERT, _row(record))
            if bound is None:
                return []
            count, used = conn.execute(_USAGE, (record.tenant,)).fetchone()
            if count <= bound[0] and used <= bound[1]:
                return []
            # Rare: only past the bound are the tenant's rows read, newest first.
            forgotten = conn.execute(
                _FORGET_OLDEST,
                {"new": record.id, "tenant": record.tenant, "count": bound[0], "bytes": bound[1]},
            )
            return [_record(row) for row in forgotten]

        return await self._file.write(work)

    async def get(self, tenant: str, file_id: str, not_before: int = 0) -> FileRecord | None:
        def work(conn: sqlite3.Connection) -> FileRecord | None:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM tenant_files "  # noqa: S608 - constant text
                "WHERE id = ? AND tenant = ? AND created >= ?",
                (file_id, tenant, not_before),
            ).fetchone()
            return None if row is None else _record(row)

        return await self._file.read(work)

    async def delete(self, tenant: str, file_id: str) -> FileRecord | None:
        def work(conn: sqlite3.Connection) -> FileRecord | None:
            row = conn.execute(
                "DELETE FROM tenant_files WHERE id = ? AND tenant = ? "  # noqa: S608
                f"RETURNING {_COLUMNS}",
                (file_id, tenant),
            ).fetchone()
            return None if row is None else _record(row)

        return await self._file.write(work)

    async def expire(self, tenant: str, not_before: int) -> list[FileRecord]:
        def work(conn: sqlite3.Connection) -> list[FileRecord]:
            rows = conn.execute(
                "DELETE FROM tenant_files WHERE tenant = ? AND created < ? "  # noqa: S608
                f"RETURNING {_COLUMNS}",
                (tenant, not_before),
            )
            return [_record(row) for row in rows]

        return await self._file.write(work)

    async def is_referenced(self, sha256: str) -> bool:
        return bool(await self.referenced([sha256]))

    async def referenced(self, sha256s: Sequence[str]) -> set[str]:
        wanted = sorted(set(sha256s))

        def work(conn: sqlite3.Connection) -> set[str]:
            found: set[str] = set()
            # Bounded statements: SQLite limits the parameters of one.
            for start in range(0, len(wanted), 500):
                batch = wanted[start : start + 500]
                marks = ", ".join("?" * len(batch))
                rows = conn.execute(
                    f"SELECT DISTINCT sha256 FROM tenant_files WHERE sha256 IN ({marks})",  # noqa: S608
                    batch,
                )
                found.update(row[0] for row in rows)
            return found

        return await self._file.read(work)

    async def close(self) -> None:
        self._file.close()
