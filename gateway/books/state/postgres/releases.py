"""Release decisions and the arms' published figures on PostgreSQL, shared by
every replica (spec §18): an operator's ``release set|rollback|clear`` and a
gate's rollback reach the whole fleet, and ``release status`` sums what every
replica published.

The same rules as the SQLite store (``gateway/books/state/sqlite/releases.py``):
one standing decision per release; ``publish`` replaces its replica's rows in
one transaction and forgets the rows of replicas silent for
``FORGET_AFTER_S``. That sweep takes only rows nobody else holds (``SKIP
LOCKED``): replicas publishing at once never wait on, or deadlock over, each
other's stale rows. Every call goes through :class:`StateCalls` (bounded by
``state.timeout_ms``, counted, ``state_unavailable`` on failure).
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.books.protocols import (
    FORGET_AFTER_S,
    ArmCounts,
    Figures,
    ReleaseOverride,
    check_decision,
    figure_rows,
)
from gateway.books.state.calls import StateCalls
from gateway.books.state.postgres.pool import PgPool


class PgReleaseStore:
    """:class:`~gateway.books.protocols.ReleaseStore` on a shared PostgreSQL."""

    def __init__(self, pool: PgPool, calls: StateCalls) -> None:
        self._pool = pool
        self._calls = calls

    async def overrides(self) -> dict[str, ReleaseOverride]:
        rows = await self._pool.fetch(
            self._calls,
            "release_overrides",
            "SELECT name, state, percent, updated FROM release_decisions",
        )
        return {
            r["name"]: ReleaseOverride(r["name"], r["state"], r["percent"], r["updated"])
            for r in rows
        }

    async def decide(self, name: str, state: str, percent: float, now: float) -> None:
        check_decision(state, percent)

        await self._pool.execute(
            self._calls,
            "release_decide",
            "INSERT INTO release_decisions (name, state, percent, updated) "
            "VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO UPDATE SET "
            "state = EXCLUDED.state, percent = EXCLUDED.percent, updated = EXCLUDED.updated",
            name,
            state,
            float(percent),
            now,
        )

    async def clear(self, name: str) -> bool:
        status = await self._pool.execute(
            self._calls, "release_clear", "DELETE FROM release_decisions WHERE name = $1", name
        )
        return status != "DELETE 0"

    async def publish(
        self, replica: str, figures: Mapping[str, Mapping[str, ArmCounts]], now: float
    ) -> None:
        rows = figure_rows(replica, figures, now)

        async def work() -> None:
            async with self._pool.transaction() as conn:
                await conn.execute("DELETE FROM release_figures WHERE replica = $1", replica)
                await conn.execute(
                    "DELETE FROM release_figures WHERE (name, replica, arm) IN ("
                    " SELECT name, replica, arm FROM release_figures"
                    " WHERE updated < $1 FOR UPDATE SKIP LOCKED)",
                    now - FORGET_AFTER_S,
                )
                await conn.executemany(
                    "INSERT INTO release_figures "
                    "(name, replica, arm, requests, failures, ttft_p95_ms, updated) "
                    "VALUES ($1, $2, $3, $4, $5, $6, $7)",
                    rows,
                )

        await self._calls.run("release_publish", work())

    async def figures(self, since: float) -> Figures:
        rows = await self._pool.fetch(
            self._calls,
            "release_figures",
            "SELECT name, replica, arm, requests, failures, ttft_p95_ms "
            "FROM release_figures WHERE updated >= $1",
            since,
        )
        found: Figures = {}
        for r in rows:
            counts = ArmCounts(r["requests"], r["failures"], r["ttft_p95_ms"])
            found.setdefault(r["name"], {}).setdefault(r["replica"], {})[r["arm"]] = counts
        return found

    async def close(self) -> None:
        # The pool is the catalog's too: whoever owns the state closes it once.
        return None
