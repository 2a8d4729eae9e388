"""Caller approvals in SQLite (spec §22 "Asking the caller"), one replica.

Theory of operation:

- Its own connection to the state file, opened as every SQLite book opens it
  (``gateway/books/state/sqlite/file.py``, schema part ``agent_approvals``).
- ``decide`` is one conditional ``UPDATE`` (the tenant's, unexpired,
  undecided row) in a write transaction: SQLite has one writer at a time, so
  of two decisions exactly one updates the row; only a decision that updated
  nothing reads the row again, to tell ``already_resolved`` from
  ``not_found``.
- ``close`` deletes the row, so a later decision finds nothing; ``sweep``
  deletes rows past their expiry (a stream that never closed its own).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from gateway.books.protocols import Decision, Resolution
from gateway.books.state.sqlite.file import SqliteFile

_PART = "agent_approvals"
_STEPS: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS agent_approvals (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        request_id TEXT NOT NULL,
        decision TEXT CHECK (decision IN ('approve', 'deny')),
        decided REAL,
        expires REAL NOT NULL
    );
    CREATE INDEX IF NOT EXISTS agent_approvals_expires ON agent_approvals (expires);
    """,
)

_DECIDE = (
    "UPDATE agent_approvals SET decision = ?, decided = ? "
    "WHERE id = ? AND tenant = ? AND decision IS NULL AND expires > ?"
)
_FOUND = "SELECT 1 FROM agent_approvals WHERE id = ? AND tenant = ? AND expires > ?"


class SqliteApprovalStore:
    """:class:`~gateway.books.protocols.ApprovalStore` on one SQLite file."""

    def __init__(self, path: Path, *, busy_timeout_s: float = 5.0) -> None:
        self._file = SqliteFile(path, _PART, _STEPS, busy_timeout_s=busy_timeout_s)

    async def open(self, tenant: str, request_id: str, approval_id: str, expires: float) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO agent_approvals (id, tenant, request_id, expires) VALUES (?, ?, ?, ?)",
                (approval_id, tenant, request_id, expires),
            )

        await self._file.write(work)

    async def decide(
        self, tenant: str, approval_id: str, decision: Decision, now: float
    ) -> Resolution:
        def work(conn: sqlite3.Connection) -> Resolution:
            updated = conn.execute(_DECIDE, (decision, now, approval_id, tenant, now)).rowcount
            if updated:
                return "resolved"
            found = conn.execute(_FOUND, (approval_id, tenant, now)).fetchone()
            return "already_resolved" if found is not None else "not_found"

        return await self._file.write(work)

    async def read(self, approval_id: str) -> Decision | None:
        return (await self.read_many([approval_id])).get(approval_id)

    async def read_many(self, approval_ids: Sequence[str]) -> dict[str, Decision]:
        wanted = sorted(set(approval_ids))

        def work(conn: sqlite3.Connection) -> dict[str, Decision]:
            found: dict[str, Decision] = {}
            # Bounded statements: SQLite limits the parameters of one.
            for start in range(0, len(wanted), 500):
                batch = wanted[start : start + 500]
                marks = ", ".join("?" * len(batch))
                rows = conn.execute(
                    "SELECT id, decision FROM agent_approvals "  # noqa: S608 - constant text
                    f"WHERE id IN ({marks}) AND decision IS NOT NULL",
                    batch,
                )
                found.update((row[0], cast(Decision, row[1])) for row in rows)
            return found

        return await self._file.read(work)

    async def close(self, approval_id: str) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM agent_approvals WHERE id = ?", (approval_id,))

        await self._file.write(work)

    async def sweep(self, now: float) -> int:
        def work(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM agent_approvals WHERE expires <= ?", (now,)).rowcount

        return await self._file.write(work)

    async def shutdown(self) -> None:
        self._file.close()
