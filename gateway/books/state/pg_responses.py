"""Kept responses and their conversations on PostgreSQL, shared by every
replica (spec §17): a follow-up through any replica, or after any worker
restart, finds the whole conversation.

A conversation is read in one round trip (a recursive query from the named
response back through ``previous_id``); the per-tenant byte bound is applied
in the transaction that keeps the new rows, newest kept first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import asyncpg

from gateway.books.protocols import KeptResponse
from gateway.books.state.calls import StateCalls
from gateway.books.state.postgres import PgPool

_COLUMNS = (
    "tenant, id, alias, created, expires, previous_id, input_items, output_items, body, upstream_id"
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
                await conn.executemany(
                    f"INSERT INTO kept_responses ({_COLUMNS}, size) "  # noqa: S608
                    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) "
                    "ON CONFLICT (tenant, id) DO UPDATE SET alias = EXCLUDED.alias, "
                    "created = EXCLUDED.created, expires = EXCLUDED.expires, "
                    "previous_id = EXCLUDED.previous_id, input_items = EXCLUDED.input_items, "
                    "output_items = EXCLUDED.output_items, body = EXCLUDED.body, "
                    "upstream_id = EXCLUDED.upstream_id, size = EXCLUDED.size",
                    [
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
                    ],
                )
                for tenant in sorted({r.tenant for r in rows} & set(max_bytes)):
                    # Newest first, a running total: whatever passes the bound goes.
                    await conn.execute(
                        "DELETE FROM kept_responses k USING ("
                        "  SELECT id, sum(size) OVER (ORDER BY created DESC, id DESC) AS running"
                        "  FROM kept_responses WHERE tenant = $1"
                        ") o WHERE k.tenant = $1 AND k.id = o.id AND o.running > $2",
                        tenant,
                        max_bytes[tenant],
                    )

        await self._calls.run("keep_responses", work())

    async def get(self, tenant: str, response_id: str, now: float) -> KeptResponse | None:
        async def work() -> asyncpg.Record | None:
            async with self._pool.connection() as conn:
                return await conn.fetchrow(
                    f"SELECT {_COLUMNS} FROM kept_responses "  # noqa: S608
                    "WHERE tenant = $1 AND id = $2 AND expires > $3",
                    tenant,
                    response_id,
                    int(now),
                )

        row = await self._calls.run("get_response", work())
        return None if row is None else _kept(row)

    async def chain(
        self, tenant: str, response_id: str, now: float, max_links: int
    ) -> list[KeptResponse]:
        async def work() -> list[asyncpg.Record]:
            async with self._pool.connection() as conn:
                return list(
                    await conn.fetch(
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
                )

        return [_kept(r) for r in await self._calls.run("chain", work())]

    async def forget(self, tenant: str, response_id: str) -> bool:
        async def work() -> str:
            async with self._pool.connection() as conn:
                return str(
                    await conn.execute(
                        "DELETE FROM kept_responses WHERE tenant = $1 AND id = $2",
                        tenant,
                        response_id,
                    )
                )

        return await self._calls.run("forget_response", work()) != "DELETE 0"

    async def expire(self, now: float) -> int:
        async def work() -> str:
            async with self._pool.connection() as conn:
                return str(
                    await conn.execute("DELETE FROM kept_responses WHERE expires <= $1", int(now))
                )

        return int((await self._calls.run("expire_responses", work())).split()[-1])

    async def close(self) -> None:
        # The pool is the catalog's too: whoever owns the state closes it once.
        return None
