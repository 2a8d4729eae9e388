"""Tenant files' records on PostgreSQL, shared by every replica (spec §22, §17).

The same contract as the SQLite catalog (``gateway/books/state/sqlite/files.py``)
with what sharing adds: a file produced through one replica is readable and
deletable through every replica as soon as ``add`` returned; the tenant's
bound holds under concurrent adds through several replicas, as the insert,
the count and the forgetting run in one transaction holding the tenant's
transaction-level advisory lock.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from gateway.books.files.records import FileRecord
from gateway.books.state.calls import StateCalls
from gateway.books.state.postgres.pool import PgPool

_COLUMNS = "id, tenant, name, sha256, mime_type, ext, bytes, created"
_INSERT = (
    f"INSERT INTO tenant_files ({_COLUMNS}) "  # noqa: S608 - constant text
    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
)
_USAGE = "SELECT count(*), coalesce(sum(bytes), 0) FROM tenant_files WHERE tenant = $1"
#: the tenant's files past the count or byte bound, counted from the new one
#: (first whatever its clock said), then newest first
_ORDER = "ORDER BY id = $4 DESC, created DESC, seq DESC"
_FORGET_OLDEST = (
    "WITH o AS ("  # noqa: S608 - constant text
    f" SELECT id, row_number() OVER ({_ORDER}) AS n, sum(bytes) OVER ({_ORDER}) AS upto"
    " FROM tenant_files WHERE tenant = $1"
    ") DELETE FROM tenant_files f USING o"
    " WHERE f.id = o.id AND (o.n > $2 OR o.upto > $3)"
    " RETURNING f.id, f.tenant, f.name, f.sha256, f.mime_type, f.ext, f.bytes, f.created"
)


def _record(row: asyncpg.Record) -> FileRecord:
    return FileRecord(
        id=row["id"],
        tenant=row["tenant"],
        name=row["name"],
        sha256=row["sha256"],
        mime_type=row["mime_type"],
        ext=row["ext"],
        bytes=row["bytes"],
        created=row["created"],
    )


def _row(r: FileRecord) -> tuple[object, ...]:
    return (r.id, r.tenant, r.name, r.sha256, r.mime_type, r.ext, r.bytes, r.created)


class PgFileCatalog:
    """:class:`~gateway.books.protocols.FileCatalog` on a shared PostgreSQL."""

    def __init__(self, pool: PgPool, calls: StateCalls) -> None:
        self._pool = pool
        self._calls = calls

    async def add(
        self, record: FileRecord, bound: tuple[int, int] | None = None
    ) -> list[FileRecord]:
        r = record

        async def work() -> list[FileRecord]:
            async with self._pool.transaction() as conn:
                if bound is not None:
                    # One adder of the tenant at a time past this point, fleet-wide.
                    await conn.execute(
                        "SELECT pg_advisory_xact_lock(hashtextextended('files:' || $1, 0))",
                        r.tenant,
                    )
                await conn.execute(
                    _INSERT,
                    r.id,
                    r.tenant,
                    r.name,
                    r.sha256,
                    r.mime_type,
                    r.ext,
                    r.bytes,
                    r.created,
                )
                if bound is None:
                    return []
                usage = await conn.fetchrow(_USAGE, r.tenant)
                assert usage is not None  # an aggregate has a row
                if usage[0] <= bound[0] and usage[1] <= bound[1]:
                    return []
                # Rare: only past the bound are the tenant's rows read, newest first.
                rows = await conn.fetch(_FORGET_OLDEST, r.tenant, bound[0], bound[1], r.id)
                return [_record(row) for row in rows]

        return await self._calls.run("add_file", work())

    async def get(self, tenant: str, file_id: str, not_before: int = 0) -> FileRecord | None:
        rows = await self._pool.fetch(
            self._calls,
            "get_file",
            f"SELECT {_COLUMNS} FROM tenant_files "  # noqa: S608 - constant text
            "WHERE id = $1 AND tenant = $2 AND created >= $3",
            file_id,
            tenant,
            not_before,
        )
        return _record(rows[0]) if rows else None

    async def delete(self, tenant: str, file_id: str) -> FileRecord | None:
        rows = await self._pool.fetch(
            self._calls,
            "delete_file",
            f"DELETE FROM tenant_files WHERE id = $1 AND tenant = $2 RETURNING {_COLUMNS}",  # noqa: S608
            file_id,
            tenant,
        )
        return _record(rows[0]) if rows else None

    async def expire(self, tenant: str, not_before: int) -> list[FileRecord]:
        rows = await self._pool.fetch(
            self._calls,
            "expire_files",
            "DELETE FROM tenant_files WHERE tenant = $1 AND created < $2 "  # noqa: S608
            f"RETURNING {_COLUMNS}",
            tenant,
            not_before,
        )
        return [_record(r) for r in rows]

    async def is_referenced(self, sha256: str) -> bool:
        return bool(await self.referenced([sha256]))

    async def referenced(self, sha256s: Sequence[str]) -> set[str]:
        rows = await self._pool.fetch(
            self._calls,
            "files_referenced",
            "SELECT DISTINCT sha256 FROM tenant_files WHERE sha256 = ANY($1::text[])",
            sorted(set(sha256s)),
        )
        return {r["sha256"] for r in rows}
