"""The SQLite release store: its own tables in the catalog's file, an idempotent
schema, one transaction per publish, and every SQLite failure as
``state_unavailable`` (the contract both backends share is in
tests/books/state/test_release_contract.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.books.protocols import ArmCounts, ReleaseOverride
from gateway.books.state.sqlite.catalog import Catalog
from gateway.books.state.sqlite.releases import SqliteReleaseStore
from gateway.books.state.sqlite.responses import SqliteResponseStore
from gateway.core.errors import GatewayError

NOW = 1_700_000_000.0
COUNTS = ArmCounts(10, 1, 250.0)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteReleaseStore]:
    opened = SqliteReleaseStore(tmp_path / "catalog.sqlite3")
    try:
        yield opened
    finally:
        await opened.close()


def tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {r[0] for r in rows}


async def test_the_store_shares_a_file_with_the_other_books(tmp_path: Path) -> None:
    path = tmp_path / "state" / "catalog.sqlite3"  # the folder is made
    catalog = Catalog(path)
    responses = SqliteResponseStore(path)
    first = SqliteReleaseStore(path)
    await first.decide("chat", "rolled_back", 0, NOW)
    await first.close()
    again = SqliteReleaseStore(path)  # the schema step is idempotent
    try:
        assert await again.overrides() == {"chat": ReleaseOverride("chat", "rolled_back", 0.0, NOW)}
    finally:
        await again.close()
        await responses.close()
        catalog.close()
    assert {"release_decisions", "release_figures", "kept_responses", "records"} <= tables(path)
    with sqlite3.connect(path) as conn:
        parts = dict(conn.execute("SELECT part, version FROM gateway_schema_parts").fetchall())
    assert parts == {"kept_responses": 2, "releases": 1}


async def test_a_decision_outlives_the_process_that_made_it(tmp_path: Path) -> None:
    """The CLI writes, closes and exits; the gateway's own connection reads it."""
    path = tmp_path / "catalog.sqlite3"
    gateway = SqliteReleaseStore(path)
    try:
        cli = SqliteReleaseStore(path)
        await cli.decide("chat", "override", 40, NOW)
        await cli.close()
        assert (await gateway.overrides())["chat"].percent == 40.0
    finally:
        await gateway.close()


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "catalog.sqlite3"
    await SqliteReleaseStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE gateway_schema_parts SET version = 99 WHERE part = 'releases'")
    with pytest.raises(GatewayError) as caught:
        SqliteReleaseStore(path)
    assert caught.value.code == "state_unavailable"


async def test_an_unusable_path_is_state_unavailable(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(GatewayError) as caught:
        SqliteReleaseStore(tmp_path / "a-file" / "catalog.sqlite3")
    assert caught.value.code == "state_unavailable"
    assert str(tmp_path) not in str(caught.value), "no path in an error"


async def test_a_failed_publish_keeps_the_rows_it_would_have_replaced(
    store: SqliteReleaseStore,
) -> None:
    await store.publish("replica-a", {"chat": {"stable": COUNTS}}, NOW)

    # SQLITE_FULL without filling a disk: the file may not grow past its pages now.
    def cap(conn: sqlite3.Connection) -> None:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")

    await store._file.read(cap)
    many = {f"release-{i}": {"stable": COUNTS, "canary": COUNTS} for i in range(2000)}
    with pytest.raises(GatewayError) as caught:
        await store.publish("replica-a", many, NOW + 1)
    assert caught.value.code == "state_unavailable"
    assert await store.figures(0) == {"chat": {"replica-a": {"stable": COUNTS}}}, "one transaction"


async def test_a_locked_file_is_state_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "catalog.sqlite3"
    store = SqliteReleaseStore(path, busy_timeout_s=0.05)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process writing, and never finishing
        with pytest.raises(GatewayError) as caught:
            await store.decide("chat", "override", 10, NOW)
        assert caught.value.code == "state_unavailable"
        holder.execute("ROLLBACK")
        await store.decide("chat", "override", 10, NOW)  # and the next call after succeeds
        assert list(await store.overrides()) == ["chat"]
    finally:
        holder.close()
        await store.close()


async def test_a_closed_store_is_state_unavailable(store: SqliteReleaseStore) -> None:
    await store.close()
    for work in (store.overrides(), store.figures(0), store.clear("chat")):
        with pytest.raises(GatewayError) as caught:
            await work
        assert caught.value.code == "state_unavailable"
    await store.close()  # twice is harmless
