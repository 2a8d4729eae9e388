"""Kept responses and their conversations on PostgreSQL, shared by every
replica (spec §17): a follow-up through any replica, or after any worker
restart, finds the whole conversation.

A conversation is read in one round trip (a recursive query from the named
response back through ``previous_id``). What each tenant keeps is counted in
``kept_usage`` as rows come and go, in the same transactions, so a keep
checks the tenant's byte bound in O(1); only past it are the tenant's rows
read, and its oldest forgotten until it is within the bound again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import asyncpg

from gateway.books.protocols import KEPT_COLUMNS, KeptResponse
from gateway.books.state.calls import StateCalls
from gateway.books.state.postgres.pool import PgPool

_COLUMNS = KEPT_COLUMNS


_INSERT = (
    f"INSERT INTO kept_responses ({_COLUMNS}, size) "  # noqa: S608 - constant text
    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
)
_DROP = "DELETE FROM kept_responses WHERE tenant = $1 AND id = $2 RETURNING size"
#: add to the tenant's count; what it keeps now
_COUNT = (
    "INSERT INTO kept_usage (tenant, bytes) VALUES ($1, $2) "
    "ON CONFLICT (tenant) DO UPDATE SET bytes = kept_usage.bytes + EXCLUDED.bytes "
    "RETURNING bytes"
)
#: the tenant's oldest rows until at least $2 bytes are gone; the bytes freed
_FORGET_OLDEST = (
    "WITH o AS ("
    " SELECT id, sum(size) OVER (ORDER BY created, id) - size AS before"
    " FROM kept_responses WHERE tenant = $1"
    "), gone AS ("
    " DELETE FROM kept_responses k USING o"
    " WHERE k.tenant = $1 AND k.id = o.id AND o.before < $2 RETURNING k.size"
    ") SELECT coalesce(sum(size), 0) FROM gone"
)


def _kept(row: asyncpg.Record) -> KeptResponse:
    return KeptResponse(
        tenant=row["tenant"],
        id=row["id"],
        alias=row["alias"],
        created=row["created"],
        expires=row["expires"],
        previous_id=row["previous_id"],
        input_items=row["input_items"],
        output_items=row["output_items"],
        body=row["body"],
        upstream_id=row["upstream_id"],
    )


class PgResponseStore:
    """:class:`~gateway.books.protocols.ResponseStore` on a shared PostgreSQL."""

    def __init__(self, pool: PgPool, calls: StateCalls) -> None:
        self._pool = pool
        self._calls = calls

    async def keep(self, rows: Sequence[KeptResponse], max_bytes: Mapping[str, int]) -> None:
        async def work() -> None:
            async with self._pool.transaction() as conn:
                delta: dict[str, int] = {}
                for r in rows:
                    # A row kept again replaces the old one, whose bytes leave the count.
                    old = await conn.fetchval(_DROP, r.tenant, r.id)
                    await conn.execute(_INSERT, *r.row())
                    delta[r.tenant] = delta.get(r.tenant, 0) + r.size - (old or 0)
                for tenant in sorted(delta):
                    used = int(await conn.fetchval(_COUNT, tenant, delta[tenant]))
                    bound = max_bytes.get(tenant)
                    if bound is not None and used > bound:
                        # Rare: only now are the tenant's rows read, oldest first.
                        freed = await conn.fetchval(_FORGET_OLDEST, tenant, used - bound)
                        await conn.execute(_COUNT, tenant, -int(freed or 0))

        await self._calls.run("keep_responses", work())

    async def get(self, tenant: str, response_id: str, now: float) -> KeptResponse | None:
        rows = await self._pool.fetch(
            self._calls,
            "get_response",
            f"SELECT {_COLUMNS} FROM kept_responses "  # noqa: S608
            "WHERE tenant = $1 AND id = $2 AND expires > $3",
            tenant,
            response_id,
            int(now),
        )
        return _kept(rows[0]) if rows else None

    async def chain(
        self, tenant: str, response_id: str, now: float, max_links: int
    ) -> list[KeptResponse]:
        rows = await self._pool.fetch(
            self._calls,
            "chain",
            f"WITH RECURSIVE c AS ("  # noqa: S608
            f"  SELECT 1 AS depth, {_COLUMNS} FROM kept_responses"
            "   WHERE tenant = $1 AND id = $2 AND expires > $3"
            "  UNION ALL"
            "  SELECT c.depth + 1, k.tenant, k.id, k.alias, k.created, k.expires,"
            "   k.previous_id, k.input_items, k.output_items, k.body, k.upstream_id"
            "   FROM kept_responses k JOIN c"
            "   ON k.tenant = c.tenant AND k.id = c.previous_id"
            "   WHERE k.expires > $3 AND c.depth < $4"
            f") SELECT {_COLUMNS} FROM c ORDER BY depth DESC",
            tenant,
            response_id,
            int(now),
            max_links,
        )
        return [_kept(r) for r in rows]

    async def forget(self, tenant: str, response_id: str) -> bool:
        async def work() -> bool:
            async with self._pool.transaction() as conn:
                size = await conn.fetchval(_DROP, tenant, response_id)
                if size is not None:
                    await conn.execute(_COUNT, tenant, -int(size))
                return size is not None

        return await self._calls.run("forget_response", work())

    async def expire(self, now: float) -> int:
        async def work() -> int:
            async with self._pool.transaction() as conn:
                gone = await conn.fetch(
                    "WITH gone AS (DELETE FROM kept_responses WHERE expires <= $1"
                    " RETURNING tenant, size) SELECT tenant, count(*) AS n, sum(size) AS bytes"
                    " FROM gone GROUP BY tenant",
                    int(now),
                )
                for row in gone:
                    await conn.execute(_COUNT, row["tenant"], -int(row["bytes"]))
                return sum(int(row["n"]) for row in gone)

        return await self._calls.run("expire_responses", work())

    async def close(self) -> None:
        # The pool is the catalog's too: whoever owns the state closes it once.
        return None
