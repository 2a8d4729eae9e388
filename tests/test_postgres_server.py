"""The real PostgreSQL servers the state-store tests run on (tests/support/postgres.py).

Each fixture is what it says: a fresh database per test on the session's
server, isolated from every other; a server of a test's own that pause()
makes unreachable (connects hang, so only a client timeout ends them) and
resume() brings back.
"""

from __future__ import annotations

import asyncio
import re
import time

import asyncpg
import pytest

from tests.support.postgres import PostgresServer, database_name

DSN = re.compile(r"^postgresql://gateway:([A-Za-z0-9_-]{16,})@127\.0\.0\.1:(\d+)/(\w+)$")


async def test_fresh_databases_are_isolated(
    shared_postgres: PostgresServer, postgres_dsn: str
) -> None:
    match = DSN.match(postgres_dsn)
    assert match is not None, postgres_dsn
    assert int(match[2]) == shared_postgres.port
    assert match[3] != "gateway"  # a database of the test's own, not the server's default
    other = database_name("other")
    other_dsn = shared_postgres.new_database(other)
    try:
        first = await asyncpg.connect(postgres_dsn, timeout=5)
        second = await asyncpg.connect(other_dsn, timeout=5)
        try:
            assert await first.fetchval("SELECT current_user") == "gateway"
            await first.execute("CREATE TABLE records (id int PRIMARY KEY)")
            await first.execute("INSERT INTO records VALUES (1), (2)")
            assert await second.fetchval("SELECT to_regclass('records')") is None
            await second.execute("CREATE TABLE records (id int PRIMARY KEY)")
            await second.execute("INSERT INTO records VALUES (3)")
            assert await first.fetchval("SELECT array_agg(id ORDER BY id) FROM records") == [1, 2]
            assert await second.fetchval("SELECT array_agg(id ORDER BY id) FROM records") == [3]
        finally:
            await first.close()
            await second.close()
    finally:
        shared_postgres.drop_database(other)


async def test_pause_makes_the_server_unreachable_and_resume_brings_it_back(
    own_postgres: PostgresServer,
) -> None:
    held = await asyncpg.connect(own_postgres.dsn, timeout=5)
    assert await held.fetchval("SELECT 1") == 1
    own_postgres.pause()
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await asyncpg.connect(own_postgres.dsn, timeout=1)
        assert time.monotonic() - started < 3  # the client's timeout ended it, nothing else
        # The backends are stopped too: a session opened before answers nothing.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(held.fetchval("SELECT 1"), 1)
    finally:
        own_postgres.resume()
    held.terminate()  # its query was abandoned mid-protocol
    again = await asyncpg.connect(own_postgres.dsn, timeout=5)
    try:
        assert await again.fetchval("SELECT 1") == 1
    finally:
        await again.close()


async def test_kill_is_a_crash_and_start_recovers(own_postgres: PostgresServer) -> None:
    pid = own_postgres.pid
    own_postgres.kill()
    assert not own_postgres.running
    with pytest.raises(ConnectionRefusedError):  # nothing listens: refused at once
        await asyncpg.connect(own_postgres.dsn, timeout=1)
    own_postgres.start()  # crash recovery on the same data directory and port
    assert own_postgres.pid != pid
    conn = await asyncpg.connect(own_postgres.dsn, timeout=5)
    try:
        assert await conn.fetchval("SELECT current_database()") == "gateway"
    finally:
        await conn.close()
