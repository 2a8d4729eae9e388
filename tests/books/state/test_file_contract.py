"""One contract, two backends: every FileCatalog behaves alike (spec §22 "Files", §17).

Each test runs on SQLite (one file in ``tmp_path``) and on PostgreSQL (a fresh
database of the test's own). Two replicas are two catalogs on the same file
or database, as two gateway processes would open them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gateway.books.files.records import FileRecord, new_file_id
from gateway.books.protocols import FileCatalog
from gateway.books.state.calls import StateCalls
from gateway.books.state.sqlite.files import SqliteFileCatalog
from tests.books.state.support import (
    SHA_A,
    SHA_B,
    SHA_C,
    ContractBackend,
    contract_backend,
)

NOW = 1_700_000_000


if TYPE_CHECKING:
    from gateway.books.state.postgres.pool import PgPool

Backend = ContractBackend[FileCatalog]


def _sqlite(path: Path) -> tuple[FileCatalog, Callable[[], Awaitable[None]]]:
    catalog = SqliteFileCatalog(path)
    return catalog, catalog.close


def _postgres(pool: PgPool, calls: StateCalls) -> FileCatalog:
    # Imported here, as the factory does: the SQLite half needs no driver.
    from gateway.books.state.postgres.files import PgFileCatalog

    return PgFileCatalog(pool, calls)


@pytest.fixture(params=["sqlite", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async with contract_backend(request, tmp_path, _sqlite, _postgres) as made:
        yield made


@pytest.fixture
def catalog(backend: Backend) -> FileCatalog:
    return backend.open()


def record(
    tenant: str = "acme", sha: str = SHA_A, *, size: int = 10, created: int = NOW
) -> FileRecord:
    return FileRecord(
        id=new_file_id(),
        tenant=tenant,
        name="report.csv",
        sha256=sha,
        mime_type="text/plain",
        ext="txt",
        bytes=size,
        created=created,
    )


async def test_add_then_get_round_trips_through_every_replica(backend: Backend) -> None:
    one, other = backend.open(), backend.open()
    made = dataclasses.replace(record(), name="r\u00e9sum\u00e9 (final).pdf")
    assert await one.add(made) == []
    assert await other.get("acme", made.id) == made
    assert await one.get("acme", new_file_id()) is None
    assert await one.get("acme", "nonsense'; DROP TABLE tenant_files; --") is None
    assert await other.get("acme", made.id) == made  # and nothing was dropped


async def test_another_tenants_id_is_an_unknown_one(catalog: FileCatalog) -> None:
    mine, theirs = record("acme"), record("globex")
    await catalog.add(mine)
    await catalog.add(theirs)
    assert await catalog.get("globex", mine.id) is None
    assert await catalog.get("acme", theirs.id) is None
    assert await catalog.delete("globex", mine.id) is None
    assert await catalog.delete("acme", theirs.id) is None
    assert await catalog.get("acme", mine.id) == mine
    assert await catalog.get("globex", theirs.id) == theirs


async def test_delete_forgets_at_once_on_every_replica(backend: Backend) -> None:
    one, other = backend.open(), backend.open()
    made = record()
    await one.add(made)
    assert await other.delete("acme", made.id) == made
    assert await one.get("acme", made.id) is None
    assert await one.delete("acme", made.id) is None


async def test_past_the_ttl_a_file_is_invisible_then_expired(catalog: FileCatalog) -> None:
    old, new = record(created=NOW - 100), record(sha=SHA_B, created=NOW)
    await catalog.add(old)
    await catalog.add(new)
    assert await catalog.get("acme", old.id, not_before=NOW - 50) is None
    assert await catalog.get("acme", new.id, not_before=NOW - 50) == new
    assert await catalog.get("acme", old.id) == old  # no TTL: still there
    assert await catalog.expire("globex", NOW) == []
    assert await catalog.expire("acme", NOW - 50) == [old]
    assert await catalog.get("acme", old.id) is None
    assert await catalog.referenced([SHA_A, SHA_B]) == {SHA_B}


async def test_references_by_digest_across_tenants(catalog: FileCatalog) -> None:
    assert await catalog.referenced([]) == set()
    assert not await catalog.is_referenced(SHA_A)
    first, second = record("acme", SHA_A), record("globex", SHA_A)
    await catalog.add(first)
    await catalog.add(second)
    assert await catalog.is_referenced(SHA_A)
    assert await catalog.referenced([SHA_A, SHA_B, SHA_C, SHA_A]) == {SHA_A}
    await catalog.delete("acme", first.id)
    assert await catalog.is_referenced(SHA_A)  # globex still names it
    await catalog.delete("globex", second.id)
    assert not await catalog.is_referenced(SHA_A)


async def test_past_its_bound_the_tenants_oldest_files_are_forgotten(
    catalog: FileCatalog,
) -> None:
    made = [record(size=10, created=NOW + i) for i in range(3)]
    for r in made:
        assert await catalog.add(r, (3, 100)) == []
    # Same second as the newest: insertion order decides which is older.
    fourth = record(size=10, created=NOW + 2)
    assert await catalog.add(fourth, (3, 100)) == [made[0]]
    assert await catalog.get("acme", made[0].id) is None
    # Bytes too: 75 + 10 + 10 + 10 > 100, so the oldest left goes; 85 more, two more.
    big = record(size=75, created=NOW + 3)
    assert await catalog.add(big, (10, 100)) == [made[1]]
    bigger = record(size=85, created=NOW + 4)
    forgotten = await catalog.add(bigger, (10, 100))
    assert sorted(r.id for r in forgotten) == sorted(r.id for r in (made[2], fourth, big))
    assert await catalog.get("acme", bigger.id) == bigger
    # Another tenant's files are never counted nor forgotten for it.
    other = record("globex", size=90)
    assert await catalog.add(other, (1, 100)) == []
    assert await catalog.get("acme", bigger.id) == bigger


async def test_the_new_file_is_never_the_one_forgotten(catalog: FileCatalog) -> None:
    older = record(size=10, created=NOW)
    await catalog.add(older)
    # Clock skew between replicas: the new file carries an older second.
    skewed = record(size=10, created=NOW - 60)
    assert await catalog.add(skewed, (1, 100)) == [older]
    assert await catalog.get("acme", skewed.id) == skewed


async def test_a_bound_holds_under_concurrent_adds_through_two_replicas(
    backend: Backend,
) -> None:
    one, other = backend.open(), backend.open()
    made = [record(size=10, created=NOW) for _ in range(12)]
    await asyncio.gather(*((one if i % 2 else other).add(r, (5, 1000)) for i, r in enumerate(made)))
    kept = [r for r in made if await one.get("acme", r.id) is not None]
    assert len(kept) == 5
