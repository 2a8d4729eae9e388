"""Kept responses and their conversations in SQLite (spec §17), one replica.

Theory of operation:

- Its own connection to the file it is given (the evidence catalog's: one
  state file per replica), in WAL mode with ``synchronous=FULL``: a kept
  response survives power loss once :meth:`SqliteResponseStore.keep`
  returned, which is before its caller is answered. One lock serializes the
  connection; every call runs in a worker thread (``anyio.to_thread``).
- The table is ``kept_responses``; its schema is versioned in
  ``gateway_schema_parts`` under the part name ``kept_responses`` (the file
  is shared with the catalog, so ``PRAGMA user_version`` is not ours to
  take). Creating it is idempotent and runs in a write transaction, so two
  processes opening one file at once take turns.
- A conversation is one recursive query from the named response back through
  ``previous_id``, bounded by ``max_links``, every link live and the tenant's.
- ``keep`` writes the rows and applies each tenant's byte bound in one
  transaction: newest first, a running total, whatever passes the bound goes
  (the same rule as the PostgreSQL store, ``gateway/books/state/pg_responses.py``).
- Every SQLite error (a full volume, a locked or corrupt file) becomes
  ``GatewayError("state_unavailable")``, never a 500.

Writes are not abandoned on cancellation (a thread cannot be stopped, and a
write cut loose could still commit after its caller was told it failed);
``busy_timeout_s`` bounds how long one waits for another process. Reads are
abandoned when their caller gives up: nothing depends on their end.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread

from gateway.books.protocols import KeptResponse
from gateway.core.errors import GatewayError

T = TypeVar("T")

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


def _migrate(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS gateway_schema_parts "
            "(part TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        row = conn.execute(
            "SELECT version FROM gateway_schema_parts WHERE part = ?", (_PART,)
        ).fetchone()
        version = 0 if row is None else int(row[0])
        if version > len(_STEPS):
            # A newer gateway wrote this file: refuse to guess at its schema.
            raise sqlite3.DatabaseError("the kept_responses schema is newer than this gateway")
        for number in range(version + 1, len(_STEPS) + 1):
            for statement in _STEPS[number - 1].split(";"):
                if statement.strip():
                    conn.execute(statement)
        conn.execute(
            "INSERT OR REPLACE INTO gateway_schema_parts (part, version) VALUES (?, ?)",
            (_PART, len(_STEPS)),
        )
        conn.execute("COMMIT")
    except BaseException:
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise


class SqliteResponseStore:
    """:class:`~gateway.books.protocols.ResponseStore` on one SQLite file."""

    def __init__(self, path: Path, *, busy_timeout_s: float = 5.0) -> None:
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            raise GatewayError("state_unavailable") from exc
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            _migrate(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise GatewayError("state_unavailable") from exc
        self._conn: sqlite3.Connection | None = conn

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

        await anyio.to_thread.run_sync(self._write, work)

    async def get(self, tenant: str, response_id: str, now: float) -> KeptResponse | None:
        def work(conn: sqlite3.Connection) -> KeptResponse | None:
            row = conn.execute(_GET, (tenant, response_id, int(now))).fetchone()
            return None if row is None else _kept(row)

        return await self._read(work)

    async def chain(
        self, tenant: str, response_id: str, now: float, max_links: int
    ) -> list[KeptResponse]:
        def work(conn: sqlite3.Connection) -> list[KeptResponse]:
            cursor = conn.execute(
                _CHAIN, (tenant, response_id, int(now), int(now), max(max_links, 1))
            )
            return [_kept(row) for row in cursor]

        return await self._read(work)

    async def forget(self, tenant: str, response_id: str) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "DELETE FROM kept_responses WHERE tenant = ? AND id = ?", (tenant, response_id)
            )
            return cursor.rowcount > 0

        return await anyio.to_thread.run_sync(self._write, work)

    async def expire(self, now: float) -> int:
        def work(conn: sqlite3.Connection) -> int:
            cursor = conn.execute("DELETE FROM kept_responses WHERE expires <= ?", (int(now),))
            return cursor.rowcount

        return await anyio.to_thread.run_sync(self._write, work)

    async def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- the connection ---------------------------------------------------------

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._conn is None:
                raise GatewayError("state_unavailable", "The response store is closed.")
            try:
                yield self._conn
            except sqlite3.Error as exc:
                # SQLITE_FULL included: a full volume refuses the write, it is no 500.
                raise GatewayError("state_unavailable") from exc

    def _write(self, work: Callable[[sqlite3.Connection], T]) -> T:
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
            return result

    async def _read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def run() -> T:
            with self._connection() as conn:
                return work(conn)

        return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
