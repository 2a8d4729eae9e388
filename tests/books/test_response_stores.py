"""The response stores, SQLite and PostgreSQL on one contract: kept rows,
conversations read back in one query, each tenant's byte bound oldest first
(counted as rows come and go), expiry; and every SQLite failure as
``state_unavailable``."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.books.protocols import KeptResponse, ResponseStore
from gateway.books.state.calls import StateCalls
from gateway.books.state.postgres.pool import PgPool
from gateway.books.state.postgres.responses import PgResponseStore
from gateway.books.state.sqlite.catalog import Catalog
from gateway.books.state.sqlite.responses import SqliteResponseStore
from gateway.core.errors import GatewayError

NOW = 1_000_000.0


def row(
    rid: str,
    *,
    tenant: str = "acme",
    previous: str | None = None,
    created: float = NOW,
    expires: int = int(NOW) + 60,
    size: int = 10,
    body: bytes | None = b"{}",
) -> KeptResponse:
    return KeptResponse(
        tenant=tenant,
        id=rid,
        alias="small",
        created=created,
        expires=expires,
        previous_id=previous,
        input_items=b"[" + b" " * max(size - 4, 0) + b"]",
        output_items=b"[]",
        body=body,
        upstream_id="w-" + rid,
    )


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteResponseStore]:
    opened = SqliteResponseStore(tmp_path / "catalog.sqlite3")
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ResponseStore]:
    """The protocol's contract holds on both backends (spec §17)."""
    if request.param == "sqlite":
        opened: ResponseStore = SqliteResponseStore(tmp_path / "catalog.sqlite3")
        pool = None
    else:
        dsn = request.getfixturevalue("postgres_dsn")
        pool = PgPool(dsn, 5.0)
        opened = PgResponseStore(pool, StateCalls(5.0))
    try:
        yield opened
    finally:
        await opened.close()
        if pool is not None:
            await pool.close()


async def test_the_count_follows_every_change(store: ResponseStore) -> None:
    """Keeps, replacements, forgets and expiry move the tenant's count; the bound
    then holds exactly at the edge (a row of exactly what is left fits)."""
    size = row("resp_x", size=100).size
    await store.keep([row(f"resp_{i}", created=NOW + i, size=100) for i in range(3)], {})
    await store.keep([row("resp_1", created=NOW + 1, size=100)], {})  # replaced, not added
    assert await store.forget("acme", "resp_0")
    assert not await store.forget("acme", "resp_0")
    await store.keep([row("resp_old", created=NOW - 5, expires=int(NOW) + 1, size=100)], {})
    assert await store.expire(NOW + 2) == 1
    # resp_1 and resp_2 are left: two rows' worth. One more fits a bound of three.
    await store.keep([row("resp_3", created=NOW + 3, size=100)], {"acme": 3 * size})
    assert [i for i in range(4) if await store.get("acme", f"resp_{i}", NOW)] == [1, 2, 3]
    await store.keep([row("resp_4", created=NOW + 4, size=100)], {"acme": 3 * size})
    assert [i for i in range(5) if await store.get("acme", f"resp_{i}", NOW)] == [2, 3, 4]


async def keep_chain(store: ResponseStore, length: int, tenant: str = "acme") -> None:
    rows, previous = [], None
    for i in range(length):
        rows.append(row(f"resp_{i}", tenant=tenant, previous=previous, created=NOW + i))
        previous = f"resp_{i}"
    await store.keep(rows, {})


async def test_a_kept_row_is_the_tenants_until_it_expires(store: ResponseStore) -> None:
    kept = row("resp_a")
    await store.keep([kept], {"acme": 1 << 20})
    assert await store.get("acme", "resp_a", NOW) == kept
    assert await store.get("globex", "resp_a", NOW) is None
    assert await store.get("acme", "resp_a", kept.expires) is None, "invisible once expired"


async def test_a_row_of_the_same_id_replaces_the_old_one(store: ResponseStore) -> None:
    await store.keep([row("resp_a", body=b"1")], {})
    await store.keep([row("resp_a", body=None)], {})
    found = await store.get("acme", "resp_a", NOW)
    assert found is not None and found.body is None


async def test_a_chain_is_read_oldest_first(store: ResponseStore) -> None:
    await keep_chain(store, 4)
    chain = await store.chain("acme", "resp_3", NOW, 100)
    assert [r.id for r in chain] == ["resp_0", "resp_1", "resp_2", "resp_3"]
    assert chain[0].previous_id is None, "whole: its oldest starts the conversation"
    assert await store.chain("globex", "resp_3", NOW, 100) == []
    assert await store.chain("acme", "resp_9", NOW, 100) == []


async def test_a_chain_is_bounded_by_max_links(store: ResponseStore) -> None:
    await keep_chain(store, 5)
    chain = await store.chain("acme", "resp_4", NOW, 2)
    assert [r.id for r in chain] == ["resp_3", "resp_4"]
    assert chain[0].previous_id == "resp_2", "cut: an earlier link exists past the bound"


async def test_a_broken_chain_ends_where_a_link_is_gone(store: ResponseStore) -> None:
    await keep_chain(store, 4)
    assert await store.forget("acme", "resp_1") is True
    assert await store.forget("acme", "resp_1") is False
    chain = await store.chain("acme", "resp_3", NOW, 100)
    assert [r.id for r in chain] == ["resp_2", "resp_3"]
    assert chain[0].previous_id == "resp_1"


async def test_a_chain_stops_at_an_expired_link(store: ResponseStore) -> None:
    await store.keep(
        [row("resp_old", expires=int(NOW) + 5), row("resp_new", previous="resp_old")], {}
    )
    assert [r.id for r in await store.chain("acme", "resp_new", NOW, 10)] == [
        "resp_old",
        "resp_new",
    ]
    later = await store.chain("acme", "resp_new", NOW + 10, 10)
    assert [r.id for r in later] == ["resp_new"] and later[0].previous_id == "resp_old"


async def test_a_chain_never_crosses_tenants(store: ResponseStore) -> None:
    await store.keep(
        [row("resp_x", tenant="globex"), row("resp_y", tenant="acme", previous="resp_x")], {}
    )
    chain = await store.chain("acme", "resp_y", NOW, 10)
    assert [r.id for r in chain] == ["resp_y"]


async def test_expire_deletes_rows_past_their_expiry(store: ResponseStore) -> None:
    await store.keep([row("resp_a", expires=int(NOW) + 1), row("resp_b", expires=int(NOW) + 9)], {})
    assert await store.expire(NOW + 5) == 1
    assert await store.get("acme", "resp_b", NOW) is not None
    assert await store.expire(NOW + 5) == 0


async def test_the_byte_bound_forgets_the_oldest_first(store: ResponseStore) -> None:
    for i in range(5):
        await store.keep([row(f"resp_{i}", created=NOW + i, size=100)], {"acme": 1000})
    size = row("resp_0", size=100).size
    # Five rows fit; three more push the two oldest out.
    bound = size * 5
    await store.keep([row(f"resp_{i}", created=NOW + i, size=100) for i in (5, 6)], {"acme": bound})
    kept = [i for i in range(7) if await store.get("acme", f"resp_{i}", NOW)]
    assert kept == [2, 3, 4, 5, 6]


async def test_the_byte_bound_is_per_tenant(store: ResponseStore) -> None:
    await store.keep([row("resp_g", tenant="globex", size=500)], {})
    await store.keep([row("resp_a", size=500), row("resp_b", created=NOW + 1, size=500)], {})
    one = row("resp_a", size=500).size
    await store.keep([row("resp_c", created=NOW + 2, size=500)], {"acme": one})
    assert await store.get("globex", "resp_g", NOW) is not None, "another tenant is untouched"
    assert [i for i in "abc" if await store.get("acme", f"resp_{i}", NOW)] == ["c"]


async def test_the_store_shares_a_file_with_the_catalog(tmp_path: Path) -> None:
    path = tmp_path / "catalog.sqlite3"
    catalog = Catalog(path)
    first = SqliteResponseStore(path)
    await first.keep([row("resp_a")], {})
    await first.close()
    again = SqliteResponseStore(path)  # the schema step is idempotent
    try:
        assert await again.get("acme", "resp_a", NOW) is not None
    finally:
        await again.close()
        catalog.close()


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "catalog.sqlite3"
    await SqliteResponseStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE gateway_schema_parts SET version = 99 WHERE part = 'kept_responses'")
    with pytest.raises(GatewayError) as caught:
        SqliteResponseStore(path)
    assert caught.value.code == "state_unavailable"


async def test_a_full_volume_is_state_unavailable(sqlite_store: SqliteResponseStore) -> None:
    await sqlite_store.keep([row("resp_small")], {})

    # SQLITE_FULL without filling a disk: the file may not grow past its pages now.
    def cap(conn: sqlite3.Connection) -> None:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")

    await sqlite_store._file.read(cap)
    big = KeptResponse(
        "acme", "resp_big", "small", NOW, int(NOW) + 60, None, b"[]", b"[]", b"x" * 200_000
    )
    with pytest.raises(GatewayError) as caught:
        await sqlite_store.keep([big], {})
    assert caught.value.code == "state_unavailable"
    assert await sqlite_store.get("acme", "resp_big", NOW) is None, "nothing of the failed write"
    assert await sqlite_store.get("acme", "resp_small", NOW) is not None


async def test_a_closed_store_is_state_unavailable(sqlite_store: SqliteResponseStore) -> None:
    await sqlite_store.close()
    with pytest.raises(GatewayError) as caught:
        await sqlite_store.get("acme", "resp_a", NOW)
    assert caught.value.code == "state_unavailable"
