"""Kept responses and their conversations in SQLite (spec §17), one replica.

Theory of operation:

- Its own connection to the file it is given (the evidence catalog's: one
  state file per replica), opened as every SQLite book opens it
  (``gateway/books/state/sqlite_file.py``: durable writes, a versioned
  schema part ``kept_responses``, threads, ``state_unavailable``); a kept
  response survives power loss once :meth:`SqliteResponseStore.keep`
  returned, which is before its caller is answered.
- A conversation is one recursive query from the named response back through
  ``previous_id``, bounded by ``max_links``, every link live and the tenant's.
- ``keep`` writes the rows and applies each tenant's byte bound in one
  transaction: newest first, a running total, whatever passes the bound goes
  (the same rule as the PostgreSQL store, ``gateway/books/state/pg_responses.py``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.books.protocols import KeptResponse
from gateway.books.state.sqlite_file import SqliteFile

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
)

# Statements are literal text: values go only through placeholders.
_COLUMNS = (
    "tenant, id, alias, created, expires, previous_id, input_items, output_items, body, upstream_id"
)
_INSERT = (
    f"INSERT OR REPLACE INTO kept_responses ({_COLUMNS}, size) "  # noqa: S608 - constant text
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# Newest first, a running total: whatever passes the bound goes.
_BOUND = (
    "DELETE FROM kept_responses WHERE tenant = ? AND id IN ("
    " SELECT id FROM ("
    "  SELECT id, SUM(size) OVER (ORDER BY created DESC, id DESC) AS running"
    "  FROM kept_responses WHERE tenant = ?"
    " ) WHERE running > ?)"
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

    def __init__(self, path: Path, *, busy_timeout_s: float = 5.0) -> None:
        self._file = SqliteFile(path, _PART, _STEPS, busy_timeout_s=busy_timeout_s)

    # -- the protocol ---------------------------------------------------------

    async def keep(self, rows: Sequence[KeptResponse], max_bytes: Mapping[str, int]) -> None:
        values = [
            (
                r.tenant,
                r.id,
                r.alias,
                r.created,
                r.expires,
                r.previous_id,
                r.input_items,
                r.output_items,
                r.body,
                r.upstream_id,
                r.size,
            )
            for r in rows
        ]
        bounds = [(t, t, max_bytes[t]) for t in sorted({r.tenant for r in rows} & set(max_bytes))]

        def work(conn: sqlite3.Connection) -> None:
            conn.executemany(_INSERT, values)
            conn.executemany(_BOUND, bounds)

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
            cursor = conn.execute(
                "DELETE FROM kept_responses WHERE tenant = ? AND id = ?", (tenant, response_id)
            )
            return cursor.rowcount > 0

        return await self._file.write(work)

    async def expire(self, now: float) -> int:
        def work(conn: sqlite3.Connection) -> int:
            cursor = conn.execute("DELETE FROM kept_responses WHERE expires <= ?", (int(now),))
            return cursor.rowcount

        return await self._file.write(work)

    async def close(self) -> None:
        self._file.close()
