"""Kept responses and their conversations in SQLite (spec §17), one replica.

Theory of operation:

- Its own connection to the file it is given (the evidence catalog's: one
  state file per replica), opened as every SQLite book opens it
  (``gateway/books/state/sqlite/file.py``: durable writes, a versioned
  schema part ``kept_responses``, threads, ``state_unavailable``); a kept
  response survives power loss once :meth:`SqliteResponseStore.keep`
  returned, which is before its caller is answered.
- A conversation is one recursive query from the named response back through
  ``previous_id``, bounded by ``max_links``, every link live and the tenant's.
- ``keep`` writes the rows and applies each tenant's byte bound in one
  transaction. What each tenant keeps is counted in ``kept_usage`` as rows
  come and go, so the bound is checked in O(1); only past it are the
  tenant's rows read and its oldest forgotten until it is within the bound
  (the same rule as the PostgreSQL store, ``gateway/books/state/postgres/responses.py``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.books.protocols import KEPT_COLUMNS, KeptResponse
from gateway.books.state.sqlite.file import SqliteFile
from gateway.books.volume import VolumeWatch

#: this store's part in ``gateway_schema_parts``, and the steps of its schema
_PART = "kept_responses"
_STEPS: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS kept_responses (
        tenant TEXT NOT NULL,
        id TEXT NOT NULL,
        alias TEXT NOT NULL,
        created REAL NOT NULL,
        expires INTEGER NOT NULL,
        previous_id TEXT,
        input_items BLOB NOT NULL,
        output_items BLOB NOT NULL,
        body BLOB,
        upstream_id TEXT,
        size INTEGER NOT NULL,
        PRIMARY KEY (tenant, id)
    );
    CREATE INDEX IF NOT EXISTS kept_responses_age ON kept_responses (tenant, created);
    CREATE INDEX IF NOT EXISTS kept_responses_expires ON kept_responses (expires);
    """,
    # 2: what each tenant keeps, counted as it changes (a keep checks its bound in O(1))
    """
    CREATE TABLE IF NOT EXISTS kept_usage (tenant TEXT PRIMARY KEY, bytes INTEGER NOT NULL);
    INSERT OR REPLACE INTO kept_usage (tenant, bytes)
        SELECT tenant, SUM(size) FROM kept_responses GROUP BY tenant;
    """,
)

# Statements are literal text: values go only through placeholders.
_COLUMNS = KEPT_COLUMNS
_INSERT = (
    f"INSERT INTO kept_responses ({_COLUMNS}, size) "  # noqa: S608 - constant text
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_DROP = "DELETE FROM kept_responses WHERE tenant = ? AND id = ? RETURNING size"
#: add to the tenant's count; what it keeps now
_COUNT = (
    "INSERT INTO kept_usage (tenant, bytes) VALUES (?, ?) "
    "ON CONFLICT (tenant) DO UPDATE SET bytes = bytes + excluded.bytes RETURNING bytes"
)
#: the tenant's oldest rows until at least the excess is gone; their sizes
_FORGET_OLDEST = (
    "DELETE FROM kept_responses WHERE tenant = ? AND id IN ("
    " SELECT id FROM ("
    "  SELECT id, SUM(size) OVER (ORDER BY created, id) - size AS before"
    "  FROM kept_responses WHERE tenant = ?"
    " ) WHERE before < ?) RETURNING size"
)
_GET = (
    f"SELECT {_COLUMNS} FROM kept_responses "  # noqa: S608 - constant text
    "WHERE tenant = ? AND id = ? AND expires > ?"
)
_CHAIN = (
    "WITH RECURSIVE c AS ("  # noqa: S608 - constant text
    f" SELECT 1 AS depth, {_COLUMNS} FROM kept_responses"
    "  WHERE tenant = ? AND id = ? AND expires > ?"
    " UNION ALL"
    " SELECT c.depth + 1, k.tenant, k.id, k.alias, k.created, k.expires, k.previous_id,"
    "  k.input_items, k.output_items, k.body, k.upstream_id"
    "  FROM kept_responses k JOIN c ON k.tenant = c.tenant AND k.id = c.previous_id"
    "  WHERE k.expires > ? AND c.depth < ?"
    f") SELECT {_COLUMNS} FROM c ORDER BY depth DESC"
)


def _kept(row: Sequence[Any]) -> KeptResponse:
    return KeptResponse(
        tenant=row[0],
        id=row[1],
        alias=row[2],
        created=float(row[3]),
        expires=int(row[4]),
        previous_id=row[5],
        input_items=bytes(row[6]),
        output_items=bytes(row[7]),
        body=None if row[8] is None else bytes(row[8]),
        upstream_id=row[9],
    )


class SqliteResponseStore:
    """:class:`~gateway.books.protocols.ResponseStore` on one SQLite file."""

    def __init__(
        self, path: Path, *, busy_timeout_s: float = 5.0, volume: VolumeWatch | None = None
    ) -> None:
        self._file = SqliteFile(path, _PART, _STEPS, busy_timeout_s=busy_timeout_s, volume=volume)

    # -- the protocol ---------------------------------------------------------

    async def keep(self, rows: Sequence[KeptResponse], max_bytes: Mapping[str, int]) -> None:
        def work(conn: sqlite3.Connection) -> None:
            delta: dict[str, int] = {}
            for r in rows:
                # A row kept again replaces the old one, whose bytes leave the count.
                old = conn.execute(_DROP, (r.tenant, r.id)).fetchone()
                conn.execute(_INSERT, r.row())
                delta[r.tenant] = delta.get(r.tenant, 0) + r.size - (old[0] if old else 0)
            for tenant in sorted(delta):
                used = int(conn.execute(_COUNT, (tenant, delta[tenant])).fetchone()[0])
                bound = max_bytes.get(tenant)
                if bound is not None and used > bound:
                    # Rare: only now are the tenant's rows read, oldest first.
                    freed = conn.execute(_FORGET_OLDEST, (tenant, tenant, used - bound))
                    conn.execute(_COUNT, (tenant, -sum(row[0] for row in freed)))

        await self._file.write(work)

    async def get(self, tenant: str, response_id: str, now: float) -> KeptResponse | None:
        def work(conn: sqlite3.Connection) -> KeptResponse | None:
            row = conn.execute(_GET, (tenant, response_id, int(now))).fetchone()
            return None if row is None else _kept(row)

        return await self._file.read(work)

    async def chain(
        self, tenant: str, response_id: str, now: float, max_links: int
    ) -> list[KeptResponse]:
        def work(conn: sqlite3.Connection) -> list[KeptResponse]:
            cursor = conn.execute(
                _CHAIN, (tenant, response_id, int(now), int(now), max(max_links, 1))
            )
            return [_kept(row) for row in cursor]

        return await self._file.read(work)

    async def forget(self, tenant: str, response_id: str) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            row = conn.execute(_DROP, (tenant, response_id)).fetchone()
            if row is not None:
                conn.execute(_COUNT, (tenant, -int(row[0])))
            return row is not None

        return await self._file.write(work)

    async def expire(self, now: float) -> int:
        def work(conn: sqlite3.Connection) -> int:
            gone = conn.execute(
                "DELETE FROM kept_responses WHERE expires <= ? RETURNING tenant, size", (int(now),)
            ).fetchall()
            freed: dict[str, int] = {}
            for tenant, size in gone:
                freed[tenant] = freed.get(tenant, 0) + int(size)
            conn.executemany(_COUNT, [(t, -b) for t, b in sorted(freed.items())])
            return len(gone)

        return await self._file.write(work)

    async def close(self) -> None:
        self._file.close()
