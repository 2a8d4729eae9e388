"""Release decisions and the arms' published figures in SQLite (spec §18), one replica.

Theory of operation:

- Its own connection to the file it is given (the evidence catalog's: one
  state file per replica), opened as every SQLite book opens it
  (``gateway/books/state/sqlite/file.py``): an operator's ``release
  rollback`` survives power loss once it returned. ``mistralrs-gateway
  release …`` opens the same file from another process: ``busy_timeout_s``
  makes the two take turns.
- Two tables: ``release_decisions`` (one standing decision per release,
  until ``clear``) and ``release_figures`` (per release, replica and arm, the
  gate window as that replica last published it), schema part ``releases``.
- ``publish`` replaces every row of its replica in one transaction (a
  release gone from the config leaves no stale row behind), and forgets the
  rows of any replica silent for :data:`FORGET_AFTER_S`: replica ids change
  with every restart, and without it the table would only ever grow.
- ``figures(since)`` returns the rows updated at or after ``since``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path

from gateway.books.protocols import (
    FORGET_AFTER_S,
    ArmCounts,
    Figures,
    ReleaseOverride,
    check_decision,
    figure_rows,
)
from gateway.books.state.sqlite.file import SqliteFile

#: this store's part in ``gateway_schema_parts``, and the steps of its schema
_PART = "releases"
_STEPS: tuple[str, ...] = (
    # No index beyond the keys: a few rows per release and live replica.
    """
    CREATE TABLE IF NOT EXISTS release_decisions (
        name TEXT PRIMARY KEY,
        state TEXT NOT NULL CHECK (state IN ('override', 'rolled_back')),
        percent REAL NOT NULL CHECK (percent >= 0 AND percent <= 100),
        updated REAL NOT NULL
    );
    CREATE TABLE IF NOT EXISTS release_figures (
        name TEXT NOT NULL,
        replica TEXT NOT NULL,
        arm TEXT NOT NULL,
        requests INTEGER NOT NULL,
        failures INTEGER NOT NULL,
        ttft_p95_ms REAL,
        updated REAL NOT NULL,
        PRIMARY KEY (name, replica, arm)
    );
    """,
)


class SqliteReleaseStore:
    """:class:`~gateway.books.protocols.ReleaseStore` on one SQLite file."""

    def __init__(self, path: Path, *, busy_timeout_s: float = 5.0) -> None:
        self._file = SqliteFile(path, _PART, _STEPS, busy_timeout_s=busy_timeout_s)

    # -- the protocol ---------------------------------------------------------

    async def overrides(self) -> dict[str, ReleaseOverride]:
        def work(conn: sqlite3.Connection) -> dict[str, ReleaseOverride]:
            cursor = conn.execute("SELECT name, state, percent, updated FROM release_decisions")
            return {
                name: ReleaseOverride(name, state, float(percent), float(updated))
                for name, state, percent, updated in cursor
            }

        return await self._file.read(work)

    async def decide(self, name: str, state: str, percent: float, now: float) -> None:
        check_decision(state, percent)

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO release_decisions (name, state, percent, updated) "
                "VALUES (?, ?, ?, ?)",
                (name, state, float(percent), now),
            )

        await self._file.write(work)

    async def clear(self, name: str) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute("DELETE FROM release_decisions WHERE name = ?", (name,))
            return cursor.rowcount > 0

        return await self._file.write(work)

    async def publish(
        self, replica: str, figures: Mapping[str, Mapping[str, ArmCounts]], now: float
    ) -> None:
        rows = figure_rows(replica, figures, now)

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM release_figures WHERE replica = ? OR updated < ?",
                (replica, now - FORGET_AFTER_S),
            )
            conn.executemany(
                "INSERT INTO release_figures "
                "(name, replica, arm, requests, failures, ttft_p95_ms, updated) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

        await self._file.write(work)

    async def figures(self, since: float) -> Figures:
        def work(conn: sqlite3.Connection) -> Figures:
            cursor = conn.execute(
                "SELECT name, replica, arm, requests, failures, ttft_p95_ms "
                "FROM release_figures WHERE updated >= ?",
                (since,),
            )
            found: Figures = {}
            for name, replica, arm, requests, failures, p95 in cursor:
                counts = ArmCounts(
                    int(requests), int(failures), None if p95 is None else float(p95)
                )
                found.setdefault(name, {}).setdefault(replica, {})[arm] = counts
            return found

        return await self._file.read(work)

    async def close(self) -> None:
        self._file.close()
