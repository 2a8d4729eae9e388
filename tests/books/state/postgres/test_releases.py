"""The PostgreSQL release store: its tables arrive as schema step 2 (a store
migrated before releases existed gains them, keeping its rows), replicas
publishing at once never wait on each other, and an unreachable store fails
every call fast with ``state_unavailable`` (the contract both backends share
is in test_release_contract.py)."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from gateway.books.protocols import FORGET_AFTER_S, ArmCounts
from gateway.books.state.calls import StateCalls
from gateway.books.state.postgres.pool import PgPool
from gateway.books.state.postgres.releases import PgReleaseStore
from gateway.books.state.postgres.schema import STEPS, migrate
from gateway.core.errors import GatewayError
from tests.support.postgres import PostgresServer

NOW = 1_700_000_000.0
COUNTS = ArmCounts(20, 1, 120.0)


async def test_a_store_migrated_before_releases_gains_their_tables(postgres_dsn: str) -> None:
    conn = await asyncpg.connect(postgres_dsn, timeout=10)
    try:
        # The schema as a gateway before releases left it: step 1 only.
        await conn.execute("CREATE TABLE gateway_schema (version INTEGER NOT NULL)")
        await conn.execute(STEPS[0])
        await conn.execute("INSERT INTO gateway_schema (version) VALUES (1)")
        await conn.execute(
            "INSERT INTO evidence_records (id, tenant, sha256, media_type, ext, bytes, created) "
            "VALUES ('ev_kept', 'acme', $1, 'image/png', 'png', 1, 1)",
            "a" * 64,
        )
        assert await conn.fetchval("SELECT to_regclass('release_decisions')") is None
        assert await migrate(conn) == 1
        for table in ("release_decisions", "release_figures"):
            assert await conn.fetchval("SELECT to_regclass($1)::text", table) == table
        assert await conn.fetchval("SELECT count(*) FROM evidence_records") == 1
    finally:
        await conn.close()
    pool = PgPool(postgres_dsn, 10.0)
    try:
        store = PgReleaseStore(pool, StateCalls(10.0))
        await store.decide("chat", "override", 5, NOW)
        assert (await store.overrides())["chat"].percent == 5.0
    finally:
        await pool.close()


async def test_the_schema_refuses_what_no_gateway_decides(postgres_dsn: str) -> None:
    """A backstop under the stores' own check (another writer, a hand-made row)."""
    conn = await asyncpg.connect(postgres_dsn, timeout=10)
    try:
        await migrate(conn)
        for state, percent in (("paused", 0.0), ("override", 101.0)):
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.execute(
                    "INSERT INTO release_decisions VALUES ('chat', $1, $2, 0)", state, percent
                )
    finally:
        await conn.close()


async def test_replicas_publishing_at_once_all_land(postgres_dsn: str) -> None:
    """Eight replicas publish ten windows each at once while stale rows of
    replicas gone long ago wait to be swept: no call fails (no deadlock, no
    lock wait past the bound), and each replica's last window is what stays."""
    pools = [PgPool(postgres_dsn, 10.0) for _ in range(8)]
    stores = [PgReleaseStore(pool, StateCalls(10.0)) for pool in pools]
    try:
        for gone in range(20):
            await stores[0].publish(f"replica-gone-{gone}", {"chat": {"stable": COUNTS}}, NOW)
        late = NOW + FORGET_AFTER_S + 60

        async def replica(index: int) -> None:
            for window in range(10):
                counts = ArmCounts(window, 0, None)
                await stores[index].publish(
                    f"replica-{index}", {"chat": {"stable": counts, "canary": counts}}, late
                )

        async with asyncio.timeout(60):
            await asyncio.gather(*(replica(i) for i in range(8)))
        figures = (await stores[0].figures(0))["chat"]
        assert set(figures) == {f"replica-{i}" for i in range(8)}
        last = ArmCounts(9, 0, None)
        assert all(arms == {"stable": last, "canary": last} for arms in figures.values())
    finally:
        for pool in pools:
            await pool.close()


async def test_an_unreachable_store_fails_every_call_fast(own_postgres: PostgresServer) -> None:
    timeout_s = 0.3
    calls = StateCalls(timeout_s)
    pool = PgPool(own_postgres.dsn, timeout_s)
    store = PgReleaseStore(pool, calls)
    try:
        await store.decide("chat", "override", 10, NOW)  # connects and migrates
        own_postgres.pause()
        try:
            for work in (
                store.overrides(),
                store.decide("chat", "rolled_back", 0, NOW),
                store.clear("chat"),
                store.publish("replica-a", {"chat": {"stable": COUNTS}}, NOW),
                store.figures(0),
            ):
                started = time.monotonic()
                with pytest.raises(GatewayError) as info:
                    await work
                assert info.value.code == "state_unavailable"
                assert time.monotonic() - started < 2, "not bounded by the call's timeout"
                assert calls.degraded
                assert own_postgres.password not in str(info.value)
        finally:
            own_postgres.resume()
        # The next call answers again. (A write sent just before the pause may
        # still run once the server resumes: which of them stood is not asserted.)
        await store.publish("replica-a", {"chat": {"stable": COUNTS}}, NOW)
        assert (await store.figures(0))["chat"]["replica-a"] == {"stable": COUNTS}
        assert not calls.degraded
    finally:
        await pool.close()
