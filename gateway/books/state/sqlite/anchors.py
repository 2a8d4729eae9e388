"""Receipt-chain anchors in SQLite (spec §24), one replica: the state file's
table ``receipt_anchors`` (schema part ``anchors``), one row per replica id,
replaced at each recording. ``receipts verify --anchors`` opens the same file
from another process (``busy_timeout_s``: the two take turns)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gateway.books.protocols import ANCHOR_FORGET_AFTER_S
from gateway.books.receipt_chain import Anchor
from gateway.books.state.sqlite.file import SqliteFile

_PART = "anchors"
_STEPS: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS receipt_anchors (
        replica TEXT PRIMARY KEY,
        seq INTEGER NOT NULL,
        sha256 TEXT NOT NULL,
        updated REAL NOT NULL
    );
    """,
)


class SqliteAnchorStore:
    """:class:`~gateway.books.protocols.AnchorStore` on one SQLite file."""

    def __init__(self, path: Path, *, busy_timeout_s: float = 5.0) -> None:
        self._file = SqliteFile(path, _PART, _STEPS, busy_timeout_s=busy_timeout_s)

    async def anchor(self, replica: str, seq: int, sha256: str, now: float) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM receipt_anchors WHERE updated < ?", (now - ANCHOR_FORGET_AFTER_S,)
            )
            conn.execute(
                "INSERT OR REPLACE INTO receipt_anchors (replica, seq, sha256, updated) "
                "VALUES (?, ?, ?, ?)",
                (replica, seq, sha256, now),
            )

        await self._file.write(work)

    async def anchors(self) -> dict[str, Anchor]:
        def work(conn: sqlite3.Connection) -> dict[str, Anchor]:
            cursor = conn.execute("SELECT replica, seq, sha256, updated FROM receipt_anchors")
            return {
                replica: Anchor(replica, int(seq), sha256, float(updated))
                for replica, seq, sha256, updated in cursor
            }

        return await self._file.read(work)

    async def close(self) -> None:
        self._file.close()
