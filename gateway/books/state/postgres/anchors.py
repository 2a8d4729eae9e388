"""Receipt-chain anchors on PostgreSQL, shared by every replica (spec §24): one
row per replica id in ``receipt_anchors``, replaced at each recording, so
``receipts verify --anchors`` run anywhere the DSN's variable is set sees the
whole fleet's. The same rules as the SQLite store
(``gateway/books/state/sqlite/anchors.py``); every call goes through
:class:`StateCalls` (bounded, counted, ``state_unavailable`` on failure)."""

from __future__ import annotations

from gateway.books.protocols import ANCHOR_FORGET_AFTER_S
from gateway.books.receipt_chain import Anchor
from gateway.books.state.calls import StateCalls
from gateway.books.state.postgres.pool import PgPool


class PgAnchorStore:
    """:class:`~gateway.books.protocols.AnchorStore` on a shared PostgreSQL."""

    def __init__(self, pool: PgPool, calls: StateCalls) -> None:
        self._pool = pool
        self._calls = calls

    async def anchor(self, replica: str, seq: int, sha256: str, now: float) -> None:
        async def work() -> None:
            async with self._pool.transaction() as conn:
                await conn.execute(
                    "INSERT INTO receipt_anchors (replica, seq, sha256, updated) "
                    "VALUES ($1, $2, $3, $4) ON CONFLICT (replica) DO UPDATE SET "
                    "seq = EXCLUDED.seq, sha256 = EXCLUDED.sha256, updated = EXCLUDED.updated",
                    replica,
                    seq,
                    sha256,
                    now,
                )
                # Others' stale rows only when nobody holds them: replicas anchoring at
                # once never wait on each other.
                await conn.execute(
                    "DELETE FROM receipt_anchors WHERE replica IN ("
                    " SELECT replica FROM receipt_anchors WHERE updated < $1"
                    " FOR UPDATE SKIP LOCKED)",
                    now - ANCHOR_FORGET_AFTER_S,
                )

        await self._calls.run("receipt_anchor", work())

    async def anchors(self) -> dict[str, Anchor]:
        query = "SELECT replica, seq, sha256, updated FROM receipt_anchors"
        rows = await self._pool.fetch(self._calls, "receipt_anchors", query)
        return {
            r["replica"]: Anchor(r["replica"], int(r["seq"]), r["sha256"], float(r["updated"]))
            for r in rows
        }

    async def close(self) -> None:
        # The pool is the catalog's too: whoever owns the state closes it once.
        return None
