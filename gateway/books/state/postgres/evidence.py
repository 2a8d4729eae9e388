"""The evidence catalog on PostgreSQL, shared by every replica (spec §17).

The same contract as the SQLite catalog (``gateway/books/state/sqlite/catalog.py``)
with what sharing adds:

- Quotas hold exactly under concurrent uploads through several replicas: the
  check and the insert run in one transaction holding the tenant's
  transaction-level advisory lock.
- A lease is taken only for a record that still exists, and locks that row
  (``FOR SHARE``) until the lease commits, so a concurrent DELETE either
  commits first (the lease fails) or waits and then sees the lease (the file
  stays until the request ends).
- Leases name the replica that took them and expire; a crashed replica's
  leases stop counting at their expiry and any replica's sweep drops them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg

from gateway.books.evidence.records import EvidenceRecord, new_evidence_id
from gateway.books.state.calls import StateCalls
from gateway.books.state.postgres.pool import PgPool
from gateway.core.errors import GatewayError

_COLUMNS = "id, tenant, sha256, media_type, ext, bytes, locator_sha256, created"
_LIVE = "tenant = $1 AND created >= $2"


_LEASE_RECORDS = (
    f"WITH r AS (SELECT {_COLUMNS} FROM evidence_records "  # noqa: S608 - constant text
    " WHERE id = ANY($4::text[]) AND tenant = $5 AND created >= $6 FOR SHARE),"
    " l AS (INSERT INTO evidence_leases (request_id, evidence_id, sha256, ext, replica, expires)"
    "  SELECT $1, id, sha256, ext, $2, $3 FROM r"
    "  ON CONFLICT (request_id, evidence_id) DO UPDATE SET expires = $3)"
    f" SELECT {_COLUMNS} FROM r"
)
#: the request's leases dropped; the digests nothing else names any more
_DROP_LEASES = (
    "WITH gone AS (DELETE FROM evidence_leases WHERE request_id = $1 RETURNING sha256, ext)"
    " SELECT DISTINCT g.sha256, g.ext FROM gone g"
    " WHERE NOT EXISTS (SELECT 1 FROM evidence_records r WHERE r.sha256 = g.sha256)"
    " AND NOT EXISTS (SELECT 1 FROM evidence_leases l WHERE l.sha256 = g.sha256"
    "  AND l.expires > $2 AND l.request_id <> $1)"
)


def _record(row: asyncpg.Record) -> EvidenceRecord:
    return EvidenceRecord(
        id=row["id"],
        tenant=row["tenant"],
        sha256=row["sha256"],
        media_type=row["media_type"],
        ext=row["ext"],
        bytes=row["bytes"],
        locator_sha256=row["locator_sha256"],
        created=row["created"],
    )


class PgCatalog:
    """:class:`~gateway.books.protocols.EvidenceCatalog` on a shared PostgreSQL."""

    def __init__(
        self,
        pool: PgPool,
        calls: StateCalls,
        replica: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._pool = pool
        self._calls = calls
        self._replica = replica
        self._clock = clock

    async def _fetch(self, op: str, query: str, *args: Any) -> list[asyncpg.Record]:
        return await self._pool.fetch(self._calls, op, query, *args)

    async def add(
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

        async def work() -> EvidenceRecord:
            async with self._pool.transaction() as conn:
                if quota is not None:
                    # One uploader of the tenant at a time past this point, fleet-wide.
                    await conn.execute(
                        "SELECT pg_advisory_xact_lock(hashtextextended('evidence:' || $1, 0))",
                        tenant,
                    )
                    usage = await conn.fetchrow(
                        f"SELECT count(*), coalesce(sum(bytes), 0) FROM evidence_records "  # noqa: S608
                        f"WHERE {_LIVE}",
                        tenant,
                        not_before,
                    )
                    assert usage is not None  # an aggregate has a row
                    count, used = usage[0], usage[1]
                    if count + 1 > quota[0] or used + size > quota[1]:
                        raise GatewayError("evidence_quota_exceeded")
                await conn.execute(
                    f"INSERT INTO evidence_records ({_COLUMNS}) "  # noqa: S608
                    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    record.id,
                    record.tenant,
                    record.sha256,
                    record.media_type,
                    record.ext,
                    record.bytes,
                    record.locator_sha256,
                    record.created,
                )
            return record

        return await self._calls.run("add", work())

    async def find_same(
        self,
        tenant: str,
        sha256: str,
        locator_sha256: str | None,
        not_before: int = 0,
        exclude: frozenset[str] = frozenset(),
    ) -> EvidenceRecord | None:
        rows = await self._fetch(
            "find_same",
            f"SELECT {_COLUMNS} FROM evidence_records WHERE {_LIVE} AND sha256 = $3 "  # noqa: S608
            "AND locator_sha256 IS NOT DISTINCT FROM $4 AND NOT (id = ANY($5::text[])) "
            "ORDER BY created, seq LIMIT 1",
            tenant,
            not_before,
            sha256,
            locator_sha256,
            list(exclude),
        )
        return _record(rows[0]) if rows else None

    async def usage(self, tenant: str, not_before: int = 0) -> tuple[int, int]:
        rows = await self._fetch(
            "usage",
            f"SELECT count(*) AS n, coalesce(sum(bytes), 0) AS b FROM evidence_records "  # noqa: S608
            f"WHERE {_LIVE}",
            tenant,
            not_before,
        )
        return int(rows[0]["n"]), int(rows[0]["b"])

    async def page(
        self, tenant: str, limit: int, after: str | None = None, not_before: int = 0
    ) -> tuple[list[EvidenceRecord], bool]:
        where, bound = _LIVE, [tenant, not_before]
        if after is not None:
            cursor = await self._fetch(
                "page",
                f"SELECT created, seq FROM evidence_records WHERE {_LIVE} AND id = $3",  # noqa: S608
                tenant,
                not_before,
                after,
            )
            if not cursor:
                raise GatewayError("evidence_not_found", param="after")
            where += " AND (created, seq) < ($4, $5)"
            bound += [cursor[0]["created"], cursor[0]["seq"]]
        rows = await self._fetch(
            "page",
            f"SELECT {_COLUMNS} FROM evidence_records WHERE {where} "  # noqa: S608
            "ORDER BY created DESC, seq DESC LIMIT $3",
            tenant,
            not_before,
            limit + 1,
            *bound[2:],
        )
        return [_record(r) for r in rows[:limit]], len(rows) > limit

    async def expire(self, tenant: str, not_before: int) -> list[EvidenceRecord]:
        rows = await self._fetch(
            "expire",
            f"DELETE FROM evidence_records WHERE tenant = $1 AND created < $2 "  # noqa: S608
            f"RETURNING {_COLUMNS}",
            tenant,
            not_before,
        )
        return [_record(r) for r in rows]

    async def get(
        self, tenant: str, evidence_id: str, not_before: int = 0
    ) -> EvidenceRecord | None:
        rows = await self._fetch(
            "get",
            f"SELECT {_COLUMNS} FROM evidence_records WHERE {_LIVE} AND id = $3",  # noqa: S608
            tenant,
            not_before,
            evidence_id,
        )
        return _record(rows[0]) if rows else None

    async def delete(self, tenant: str, evidence_id: str) -> EvidenceRecord | None:
        rows = await self._fetch(
            "delete",
            f"DELETE FROM evidence_records WHERE id = $1 AND tenant = $2 RETURNING {_COLUMNS}",  # noqa: S608
            evidence_id,
            tenant,
        )
        return _record(rows[0]) if rows else None

    async def take_leases(
        self, request_id: str, records: Sequence[EvidenceRecord], not_before: int, ttl_s: float
    ) -> None:
        wanted = sorted({r.id for r in records})
        tenant = records[0].tenant if records else ""
        expires = self._clock() + ttl_s

        async def work() -> None:
            async with self._pool.transaction() as conn:
                # One statement: the lease exists only for records that exist now.
                taken = await conn.fetch(
                    "INSERT INTO evidence_leases "
                    "(request_id, evidence_id, sha256, ext, replica, expires) "
                    "SELECT $1, r.id, r.sha256, r.ext, $2, $3 FROM ("
                    "  SELECT id, sha256, ext FROM evidence_records "
                    "  WHERE id = ANY($4::text[]) AND tenant = $5 AND created >= $6 FOR SHARE"
                    ") r ON CONFLICT (request_id, evidence_id) DO UPDATE SET expires = $3 "
                    "RETURNING evidence_id",
                    request_id,
                    self._replica,
                    expires,
                    wanted,
                    tenant,
                    not_before,
                )
                if len(taken) != len(wanted):
                    # Rolled back with the transaction: all of them or none.
                    raise GatewayError("evidence_not_found")

        await self._calls.run("take_leases", work())

    async def lease_records(
        self,
        request_id: str,
        tenant: str,
        evidence_ids: Sequence[str],
        not_before: int,
        ttl_s: float,
    ) -> dict[str, EvidenceRecord]:
        wanted = sorted(set(evidence_ids))
        expires = self._clock() + ttl_s

        async def work() -> dict[str, EvidenceRecord]:
            async with self._pool.transaction() as conn:
                # One round trip: the records, locked as the leases go in.
                rows = await conn.fetch(
                    _LEASE_RECORDS, request_id, self._replica, expires, wanted, tenant, not_before
                )
                if len(rows) != len(wanted):
                    # Rolled back with the transaction: all of them or none.
                    raise GatewayError("evidence_not_found")
                return {r["id"]: _record(r) for r in rows}

        return await self._calls.run("lease_records", work())

    async def drop_leases(self, request_id: str) -> list[tuple[str, str]]:
        rows = await self._fetch("drop_leases", _DROP_LEASES, request_id, self._clock())
        return sorted({(r["sha256"], r["ext"]) for r in rows})

    async def release_leases(self, request_id: str) -> list[tuple[str, str]]:
        rows = await self._fetch(
            "release_leases",
            "DELETE FROM evidence_leases WHERE request_id = $1 RETURNING sha256, ext",
            request_id,
        )
        return sorted({(r["sha256"], r["ext"]) for r in rows})

    async def is_referenced(self, sha256: str) -> bool:
        rows = await self._fetch(
            "is_referenced",
            "SELECT EXISTS (SELECT 1 FROM evidence_records WHERE sha256 = $1) "
            "OR EXISTS (SELECT 1 FROM evidence_leases WHERE sha256 = $1 AND expires > $2) AS used",
            sha256,
            self._clock(),
        )
        return bool(rows[0]["used"])

    async def referenced(self, sha256s: Sequence[str]) -> set[str]:
        rows = await self._fetch(
            "referenced",
            "SELECT sha256 FROM evidence_records WHERE sha256 = ANY($1::text[]) "
            "UNION SELECT sha256 FROM evidence_leases WHERE sha256 = ANY($1::text[]) "
            "AND expires > $2",
            sorted(set(sha256s)),
            self._clock(),
        )
        return {r["sha256"] for r in rows}

    async def active_leases(self) -> int:
        rows = await self._fetch(
            "active_leases",
            "SELECT count(*) AS n FROM evidence_leases WHERE expires > $1",
            self._clock(),
        )
        return int(rows[0]["n"])

    async def sweep_leases(self) -> list[tuple[str, str]]:
        rows = await self._fetch(
            "sweep_leases",
            "DELETE FROM evidence_leases WHERE expires <= $1 RETURNING sha256, ext",
            self._clock(),
        )
        return sorted({(r["sha256"], r["ext"]) for r in rows})

    async def recover_leases(self) -> int:
        # Other replicas' leases are live; only expiry tells a crashed one's.
        rows = await self._fetch(
            "recover_leases",
            "DELETE FROM evidence_leases WHERE expires <= $1 RETURNING request_id",
            self._clock(),
        )
        return len(rows)

    async def close(self) -> None:
        # The pool is shared with the response store: the catalog closes it last.
        await self._pool.close()
