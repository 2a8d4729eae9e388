"""The PostgreSQL schema: migrated by the gateway itself, versioned, idempotent,
safe when replicas start at once, and never guessed at when newer (spec §17)."""

from __future__ import annotations

import asyncio
import re

import asyncpg
import pytest

from gateway.books.state.calls import StateCalls
from gateway.books.state.postgres.evidence import PgCatalog
from gateway.books.state.postgres.pool import PgPool
from gateway.books.state.postgres.schema import STEPS, migrate
from gateway.core.errors import GatewayError
from tests.support.postgres import PostgresServer, database_name

TABLES = (
    "evidence_records",
    "evidence_leases",
    "kept_responses",
    "release_decisions",
    "release_figures",
    "kept_usage",
    "tenant_files",
    "agent_approvals",
)


async def versions(dsn: str) -> list[int]:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        rows = await conn.fetch("SELECT version FROM gateway_schema ORDER BY version")
    finally:
        await conn.close()
    return [int(r["version"]) for r in rows]


async def first_use(pool: PgPool) -> tuple[int, list[str | None]]:
    """What one replica's first connection finds: the schema version and its tables."""
    async with pool.connection() as conn:
        version = await conn.fetchval("SELECT max(version) FROM gateway_schema")
        tables = [await conn.fetchval("SELECT to_regclass($1)::text", t) for t in TABLES]
    return int(version), tables


async def test_a_fresh_database_is_migrated_on_first_use(postgres_dsn: str) -> None:
    pool = PgPool(postgres_dsn, 10.0)
    try:
        assert await first_use(pool) == (len(STEPS), list(TABLES))
    finally:
        await pool.close()
    assert await versions(postgres_dsn) == list(range(1, len(STEPS) + 1))


async def test_migrating_again_changes_nothing(postgres_dsn: str) -> None:
    conn = await asyncpg.connect(postgres_dsn, timeout=10)
    try:
        assert await migrate(conn) == 0  # the version found: none
        await conn.execute(
            "INSERT INTO evidence_records (id, tenant, sha256, media_type, ext, bytes, created) "
            "VALUES ('ev_kept', 'acme', $1, 'image/png', 'png', 1, 1)",
            "a" * 64,
        )
        assert await migrate(conn) == len(STEPS)
        assert await migrate(conn) == len(STEPS)
        assert await conn.fetchval("SELECT count(*) FROM evidence_records") == 1
    finally:
        await conn.close()
    for _ in range(2):  # and each new replica's pool
        pool = PgPool(postgres_dsn, 10.0)
        try:
            assert (await first_use(pool))[0] == len(STEPS)
        finally:
            await pool.close()
    assert await versions(postgres_dsn) == list(range(1, len(STEPS) + 1))


async def test_replicas_starting_at_once_migrate_once(shared_postgres: PostgresServer) -> None:
    """Five replicas' first connections race on a fresh database, three times over."""
    for _ in range(3):
        name = database_name("migrate_race")
        dsn = shared_postgres.new_database(name)
        pools = [PgPool(dsn, 20.0) for _ in range(5)]
        try:
            async with asyncio.timeout(60):
                found = await asyncio.gather(*(first_use(pool) for pool in pools))
            assert found == [(len(STEPS), list(TABLES))] * 5
            assert await versions(dsn) == list(range(1, len(STEPS) + 1))
        finally:
            for pool in pools:
                await pool.close()
            shared_postgres.drop_database(name)


async def test_a_newer_schema_is_refused_as_state_unavailable(postgres_dsn: str) -> None:
    conn = await asyncpg.connect(postgres_dsn, timeout=10)
    try:
        await migrate(conn)
        await conn.execute("INSERT INTO gateway_schema (version) VALUES ($1)", len(STEPS) + 1)
    finally:
        await conn.close()
    calls = StateCalls(10.0)
    catalog = PgCatalog(PgPool(postgres_dsn, 10.0), calls, "replica-old")
    try:
        for _ in range(2):  # refused again on the next call, not migrated over
            with pytest.raises(GatewayError) as info:
                await catalog.usage("acme")
            assert info.value.code == "state_unavailable"
            assert calls.degraded
    finally:
        await catalog.close()
    password = re.sub(r"^postgresql://[^:]+:([^@]+)@.*$", r"\1", postgres_dsn)
    assert password not in str(info.value)
    assert postgres_dsn not in str(info.value.__cause__)
    assert await versions(postgres_dsn) == [*range(1, len(STEPS) + 1), len(STEPS) + 1]
