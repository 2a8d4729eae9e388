"""A PostgreSQL store that stops answering (spec §17): every call that needs it
fails fast with ``state_unavailable``, the next call after it answers again
succeeds, and no write cut off by the outage is lost once acknowledged or
applied by halves.

``pause()`` SIGSTOPs the server: connects and queries hang instead of failing,
so only the state call's own bound (``state.timeout_ms``) ends them.
``restart_immediate()`` is ``pg_ctl restart -m immediate``: every connection
is cut wherever its transaction is (spec §24).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from pathlib import Path

import asyncpg
import pytest

from gateway.books.evidence.records import EvidenceRecord
from gateway.books.evidence.service import EvidenceService
from gateway.books.evidence.store import EvidenceStore
from gateway.books.state.calls import StateCalls
from gateway.books.state.postgres.evidence import PgCatalog
from gateway.books.state.postgres.pool import PgPool
from gateway.core.errors import GatewayError
from tests.books.evidence.support import fixture_bytes, make_tenant
from tests.books.state.support import add, pg_catalog
from tests.support.poll import eventually_async
from tests.support.postgres import PostgresServer

TIMEOUT_S = 0.3
PNG = fixture_bytes("tiny.png")


async def test_a_paused_store_fails_fast_and_the_next_call_after_succeeds(
    own_postgres: PostgresServer,
) -> None:
    calls = StateCalls(TIMEOUT_S)
    catalog = pg_catalog(own_postgres.dsn, time.time, timeout_s=TIMEOUT_S, calls=calls)
    try:
        before = await add(catalog)  # connects and migrates while the store answers
        assert not calls.degraded
        own_postgres.pause()
        try:
            for work in (
                add(catalog, size=1),
                catalog.get("acme", before.id),
                catalog.take_leases("req-1", [before], 0, 60),
                catalog.is_referenced(before.sha256),
            ):
                started = time.monotonic()
                with pytest.raises(GatewayError) as info:
                    await work
                elapsed = time.monotonic() - started
                assert info.value.code == "state_unavailable"
                assert info.value.status == 503
                assert elapsed < 2, f"{elapsed:.2f} s: not bounded by the call's timeout"
                assert calls.degraded
        finally:
            own_postgres.resume()
        assert await catalog.get("acme", before.id) == before
        assert not calls.degraded
        # The lease cut off above was never taken: nothing pins the record.
        assert await catalog.release_leases("req-1") == []
    finally:
        await catalog.close()


async def test_writes_cut_off_by_an_outage_are_whole_or_absent(
    own_postgres: PostgresServer,
) -> None:
    """Writers keep adding (quota transactions: lock, count, insert) while the
    server stops mid-stream and comes back. Afterwards every acknowledged add is
    there, every record is one that was attempted, exactly as attempted, and the
    tenant's count and sum match the records listed."""
    calls = StateCalls(TIMEOUT_S)
    catalog: PgCatalog = pg_catalog(own_postgres.dsn, time.time, timeout_s=TIMEOUT_S, calls=calls)
    attempted: dict[str, int] = {}  # sha256 -> size
    acked: set[str] = set()
    refused: set[str] = set()
    stop = asyncio.Event()

    async def writer(n: int) -> None:
        i = 0
        while not stop.is_set():
            sha = hashlib.sha256(f"writer {n} write {i}".encode()).hexdigest()
            attempted[sha] = size = 1 + (n * 7919 + i * 104729) % 100_000
            try:
                await add(catalog, sha=sha, size=size, quota=(1_000_000, 10**15))
            except GatewayError as exc:
                assert exc.code == "state_unavailable"
                refused.add(sha)
            else:
                acked.add(sha)
            i += 1

    try:
        await add(catalog, sha="0" * 64, size=5)  # migrated before the writers start
        acked.add("0" * 64)
        attempted["0" * 64] = 5
        writers = [asyncio.create_task(writer(n)) for n in range(4)]
        try:
            await eventually_async(lambda: len(acked) > 40, "writes flowing")
            # In a thread: the loop keeps the writers mid-call while the server stops.
            await asyncio.to_thread(own_postgres.pause)
            try:
                await eventually_async(lambda: len(refused) >= 8, "writes refused while paused")
            finally:
                await asyncio.to_thread(own_postgres.resume)
            flowing_again = len(acked) + 20
            await eventually_async(lambda: len(acked) > flowing_again, "writes flowing again")
        finally:
            stop.set()
            async with asyncio.timeout(30):
                await asyncio.gather(*writers)
        assert not calls.degraded

        records, more = await catalog.page("acme", 1_000_000)
        assert not more
        by_sha: dict[str, EvidenceRecord] = {r.sha256: r for r in records}
        assert len(by_sha) == len(records), "one add made two records"
        assert acked <= set(by_sha), "an acknowledged add was lost"
        assert set(by_sha) <= set(attempted), "a record nobody added"
        for record in records:
            assert (record.tenant, record.media_type, record.ext) == ("acme", "image/png", "png")
            assert record.bytes == attempted[record.sha256]
            assert record.locator_sha256 is None
            assert await catalog.get("acme", record.id) == record
        assert await catalog.usage("acme") == (len(records), sum(r.bytes for r in records))
        assert refused - set(by_sha), "no add was cut off: the outage tested nothing"
    finally:
        await catalog.close()


async def test_a_connection_the_server_dropped_before_commit_is_state_unavailable(
    postgres_dsn: str,
) -> None:
    """The server ends the backend while its transaction waits for COMMIT:
    asyncpg has already given the closed connection back to the pool, and the
    cleanup must not call ``terminate()`` on it (that raised InterfaceError, a
    500 ``internal_error``). The caller gets 503 ``state_unavailable`` and the
    pool serves the next call."""
    calls = StateCalls(TIMEOUT_S * 10)
    pool = PgPool(postgres_dsn, TIMEOUT_S * 10)
    admin = await asyncpg.connect(postgres_dsn)
    try:

        async def work() -> None:
            async with pool.transaction() as conn:
                await conn.execute("CREATE TABLE IF NOT EXISTS t (x int)")
                await conn.execute("INSERT INTO t VALUES (1)")
                pid = await conn.fetchval("SELECT pg_backend_pid()")
                await admin.execute("SELECT pg_terminate_backend($1)", pid)

                def closed() -> bool:
                    try:
                        return conn.is_closed()
                    except asyncpg.InterfaceError:  # already given back to the pool: closed
                        return True

                # The loop sees the socket close before the block ends (COMMIT).
                await eventually_async(closed, "the connection closed by the server")

        with pytest.raises(GatewayError) as info:
            await calls.run("add", work())
        assert (info.value.code, info.value.status) == ("state_unavailable", 503)
        assert calls.degraded
        rows = await pool.fetch(calls, "get", "SELECT count(*) AS n FROM pg_tables")
        assert rows[0]["n"] > 0, "the pool serves on"
        assert not calls.degraded
    finally:
        await admin.close()
        await pool.close()


async def test_immediate_restarts_during_uploads_are_503_and_leave_no_staged_file(
    own_postgres: PostgresServer, tmp_path: Path
) -> None:
    """``pg_ctl restart -m immediate`` again and again while uploads run: a
    connection lost anywhere in a transaction, COMMIT included, is 503
    ``state_unavailable`` (never another error), and once the store answers
    the staged-file sweep leaves no file that no record names."""
    calls = StateCalls(1.0)
    catalog = pg_catalog(own_postgres.dsn, time.time, timeout_s=1.0, calls=calls)
    service = EvidenceService(EvidenceStore(tmp_path / "ev"), catalog, shared=True)
    tenant = make_tenant("acme")
    outcomes: Counter[str] = Counter()
    stop = asyncio.Event()

    async def uploader(n: int) -> None:
        for i in range(100_000):
            if stop.is_set():
                return
            try:
                await service.upload(tenant, PNG + f"{n}:{i}".encode(), "image/png", None)
            except GatewayError as exc:
                outcomes[exc.code] += 1
            else:
                outcomes["ok"] += 1

    async def flowing(more: int) -> None:
        target = outcomes["ok"] + more
        await eventually_async(lambda: outcomes["ok"] >= target, "uploads succeed")

    try:
        await service.upload(tenant, PNG, "image/png", None)  # connected and migrated
        # The test server commits asynchronously (no durability): an immediate
        # restart may lose the newest commits, never the schema once checkpointed.
        admin = await asyncpg.connect(own_postgres.dsn)
        try:
            await admin.execute("CHECKPOINT")
        finally:
            await admin.close()
        uploaders = [asyncio.create_task(uploader(n)) for n in range(4)]
        try:
            for restart in range(7):
                await flowing(5)
                if restart < 6:
                    await asyncio.to_thread(own_postgres.restart_immediate)
        finally:
            stop.set()
            async with asyncio.timeout(60):
                # Any other exception (InterfaceError was one) fails the test here.
                await asyncio.gather(*uploaders)
        assert set(outcomes) <= {"ok", "state_unavailable"}, outcomes
        assert outcomes["state_unavailable"], "no upload was cut off: the restarts tested nothing"
        await service.sweep_staged()
        assert not calls.degraded, "the sweep's calls reached the store"
        records, _ = await catalog.page("acme", 1_000_000)
        named = {f"{r.sha256}.{r.ext}" for r in records}
        on_disk = {p.name for p in (tmp_path / "ev").iterdir() if not p.name.startswith(".")}
        assert on_disk == named, "a staged file no record names is left"
        assert not [p for p in (tmp_path / "ev").iterdir() if p.name.startswith(".tmp-")]
    finally:
        await service.close()
