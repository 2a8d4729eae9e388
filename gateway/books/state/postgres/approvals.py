"""Caller approvals on PostgreSQL, shared by every replica (spec §22 "Asking
the caller", §17): the replica holding the stream opens an approval, the
caller's decision may arrive through any replica, and the holder reads it
back (``gateway/books/approvals.py`` polls :meth:`PgApprovalStore.read_many`).

``decide`` is one conditional ``UPDATE`` (the tenant's, unexpired, undecided
row): under READ COMMITTED a second concurrent decision waits for the
first's row lock, re-reads the row, finds it decided and updates nothing, so
exactly one decision resolves an approval however many replicas race. Only
a decision that updated nothing reads the row again, to tell
``already_resolved`` from ``not_found``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from gateway.books.protocols import Decision, Resolution
from gateway.books.state.calls import StateCalls
from gateway.books.state.postgres.pool import PgPool

_DECIDE = (
    "UPDATE agent_approvals SET decision = $3, decided = $4 "
    "WHERE id = $1 AND tenant = $2 AND decision IS NULL AND expires > $4"
)
_FOUND = "SELECT 1 FROM agent_approvals WHERE id = $1 AND tenant = $2 AND expires > $3"


class PgApprovalStore:
    """:class:`~gateway.books.protocols.ApprovalStore` on a shared PostgreSQL."""

    def __init__(self, pool: PgPool, calls: StateCalls) -> None:
        self._pool = pool
        self._calls = calls

    async def open(self, tenant: str, request_id: str, approval_id: str, expires: float) -> None:
        await self._pool.execute(
            self._calls,
            "open_approval",
            "INSERT INTO agent_approvals (id, tenant, request_id, expires) VALUES ($1, $2, $3, $4)",
            approval_id,
            tenant,
            request_id,
            expires,
        )

    async def decide(
        self, tenant: str, approval_id: str, decision: Decision, now: float
    ) -> Resolution:
        async def work() -> Resolution:
            async with self._pool.connection() as conn:
                status = await conn.execute(_DECIDE, approval_id, tenant, decision, now)
                if status == "UPDATE 1":
                    return "resolved"
                found = await conn.fetchval(_FOUND, approval_id, tenant, now)
                return "already_resolved" if found is not None else "not_found"

        return await self._calls.run("decide_approval", work())

    async def read(self, approval_id: str) -> Decision | None:
        return (await self.read_many([approval_id])).get(approval_id)

    async def read_many(self, approval_ids: Sequence[str]) -> dict[str, Decision]:
        rows = await self._pool.fetch(
            self._calls,
            "read_approvals",
            "SELECT id, decision FROM agent_approvals "
            "WHERE id = ANY($1::text[]) AND decision IS NOT NULL",
            sorted(set(approval_ids)),
        )
        return {r["id"]: cast(Decision, r["decision"]) for r in rows}

    async def close(self, approval_id: str) -> None:
        await self._pool.execute(
            self._calls,
            "close_approval",
            "DELETE FROM agent_approvals WHERE id = $1",
            approval_id,
        )

    async def sweep(self, now: float) -> int:
        status = await self._pool.execute(
            self._calls, "sweep_approvals", "DELETE FROM agent_approvals WHERE expires <= $1", now
        )
        return int(status.rsplit(" ", 1)[-1])
