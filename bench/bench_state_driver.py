"""asyncpg against psycopg 3 on the state book's per-request path (spec §17).

One real loopback PostgreSQL (tests/support/postgres.py), the gateway's own
schema, and the statements a request naming two evidence records makes:
two record lookups, one lease insert for both, one release. Each driver runs
the same sequence ``--rounds`` times from one pooled connection in one event
loop; figures are wall µs per request (p50, p99) and this process's CPU µs
per request, so the driver's own cost shows beside the server's.

    python -m bench.bench_state_driver [--rounds 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import time
from collections.abc import Awaitable, Callable

import asyncpg

from gateway.books.evidence.records import new_evidence_id
from gateway.books.state.postgres.schema import migrate
from tests.support.postgres import postgres_server

_GET = (
    "SELECT id, tenant, sha256, media_type, ext, bytes, locator_sha256, created "
    "FROM evidence_records WHERE tenant = {0} AND created >= {1} AND id = {2}"
)
_LEASE = (
    "INSERT INTO evidence_leases (request_id, evidence_id, sha256, ext, replica, expires) "
    "SELECT {0}, r.id, r.sha256, r.ext, {1}, {2} FROM (SELECT id, sha256, ext "
    "FROM evidence_records WHERE id = ANY({3}) AND tenant = {4} AND created >= {5} FOR SHARE) r "
    "RETURNING evidence_id"
)
_RELEASE = "DELETE FROM evidence_leases WHERE request_id = {0} RETURNING sha256, ext"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _measure(
    rounds: int, one: Callable[[int], Awaitable[None]]
) -> tuple[float, float, float]:
    for i in range(min(200, rounds)):  # warm: prepared statements, caches
        await one(i)
    took: list[float] = []
    cpu = _cpu()
    for i in range(rounds):
        began = time.perf_counter()
        await one(i)
        took.append(time.perf_counter() - began)
    cpu_us = (_cpu() - cpu) / rounds * 1e6
    took.sort()
    return statistics.median(took) * 1e6, took[int(len(took) * 0.99)] * 1e6, cpu_us


async def _asyncpg(dsn: str, ids: list[str], rounds: int) -> tuple[float, float, float]:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    get = _GET.format("$1", "$2", "$3")
    lease = _LEASE.format("$1", "$2", "$3", "$4::text[]", "$5", "$6")
    release = _RELEASE.format("$1")

    async def one(i: int) -> None:
        key = f"lease_{i}"
        async with pool.acquire() as conn:
            for evidence_id in ids:
                await conn.fetch(get, "acme", 0, evidence_id)
            async with conn.transaction():
                await conn.fetch(lease, key, "bench", time.time() + 600, ids, "acme", 0)
            await conn.fetch(release, key)

    try:
        return await _measure(rounds, one)
    finally:
        await pool.close()


async def _psycopg(dsn: str, ids: list[str], rounds: int) -> tuple[float, float, float]:
    from psycopg_pool import AsyncConnectionPool

    pool = AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False)
    await pool.open()
    get = _GET.format("%s", "%s", "%s")
    lease = _LEASE.format("%s", "%s", "%s", "%s", "%s", "%s")
    release = _RELEASE.format("%s")

    async def one(i: int) -> None:
        key = f"lease_{i}"
        async with pool.connection() as conn:
            for evidence_id in ids:
                await (await conn.execute(get, ("acme", 0, evidence_id), prepare=True)).fetchall()
            async with conn.transaction():
                cursor = await conn.execute(
                    lease, (key, "bench", time.time() + 600, ids, "acme", 0), prepare=True
                )
                await cursor.fetchall()
            await (await conn.execute(release, (key,), prepare=True)).fetchall()
            await conn.commit()

    try:
        return await _measure(rounds, one)
    finally:
        await pool.close()


async def _seed(dsn: str) -> list[str]:
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn)
        ids = [new_evidence_id(), new_evidence_id()]
        for evidence_id in ids:
            await conn.execute(
                "INSERT INTO evidence_records (id, tenant, sha256, media_type, ext, bytes, "
                "locator_sha256, created) "
                "VALUES ($1, 'acme', $2, 'image/png', 'png', 100, NULL, 1)",
                evidence_id,
                os.urandom(32).hex(),
            )
        return ids
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    with postgres_server() as server:
        ids = asyncio.run(_seed(server.dsn))
        print(f"state driver: {args.rounds} requests naming 2 evidence records")
        for name, run in (("asyncpg", _asyncpg), ("psycopg", _psycopg)):
            p50, p99, cpu = asyncio.run(run(server.dsn, ids, args.rounds))
            print(f"  {name:8s} p50 {p50:7.1f} µs  p99 {p99:7.1f} µs  client CPU {cpu:6.1f} µs")


if __name__ == "__main__":
    main()
