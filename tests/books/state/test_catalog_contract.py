"""One contract, two backends: every EvidenceCatalog behaves alike (spec §13, §17).

Each test runs on SQLite (one file in ``tmp_path``) and on PostgreSQL (a fresh
database of the test's own), both on a clock the test moves, so record ages,
TTL cutoffs and lease expiry are exact. What differs by design is said where
it is tested (``recover_leases``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.books.evidence.records import EvidenceRecord
from gateway.books.protocols import EvidenceCatalog
from gateway.core.errors import GatewayError
from tests.books.evidence.support import FakeClock
from tests.books.state.support import SHA_A, SHA_B, SHA_C, add, pg_catalog, sqlite_catalog

UNKNOWN_ID = "ev_" + "a" * 26


@dataclass(frozen=True)
class Backend:
    name: str
    #: SQLite: the catalog file; PostgreSQL: the DSN of the test's database
    where: str

    def open(self, clock: FakeClock, replica: str = "replica-a") -> EvidenceCatalog:
        if self.name == "sqlite":
            return sqlite_catalog(Path(self.where), clock)
        return pg_catalog(self.where, clock, replica)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend("sqlite", str(tmp_path / "cat.sqlite3"))
    dsn: str = request.getfixturevalue("postgres_dsn")
    return Backend("postgres", dsn)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def catalog(backend: Backend, clock: FakeClock) -> AsyncIterator[EvidenceCatalog]:
    made = backend.open(clock)
    yield made
    await made.close()


async def not_found(work: object) -> GatewayError:
    assert asyncio.iscoroutine(work)
    with pytest.raises(GatewayError) as info:
        await work
    assert info.value.code == "evidence_not_found"
    return info.value


async def test_add_then_get_round_trips(catalog: EvidenceCatalog, clock: FakeClock) -> None:
    record = await add(catalog, size=82, locator=SHA_C)
    assert record.created == int(clock.now)
    assert (record.tenant, record.sha256, record.media_type, record.ext) == (
        "acme",
        SHA_A,
        "image/png",
        "png",
    )
    assert (record.bytes, record.locator_sha256) == (82, SHA_C)
    assert await catalog.get("acme", record.id) == record
    assert await catalog.get("acme", UNKNOWN_ID) is None
    assert await catalog.get("acme", "nonsense'; DROP TABLE records; --") is None
    assert await catalog.get("acme", record.id) == record  # and nothing was dropped


async def test_tenants_are_isolated(catalog: EvidenceCatalog) -> None:
    mine = await add(catalog, "acme", SHA_A, size=10)
    theirs = await add(catalog, "globex", SHA_A, size=20)
    assert await catalog.get("globex", mine.id) is None
    assert await catalog.get("acme", theirs.id) is None
    assert await catalog.delete("globex", mine.id) is None
    assert await catalog.delete("acme", theirs.id) is None
    assert await catalog.usage("acme") == (1, 10)
    assert await catalog.usage("globex") == (1, 20)
    assert await catalog.page("acme", 10) == ([mine], False)
    assert await catalog.find_same("globex", SHA_A, None, exclude=frozenset({theirs.id})) is None
    await not_found(catalog.page("globex", 10, after=mine.id))
    await not_found(
        catalog.take_leases("req-1", [dataclasses.replace(mine, tenant="globex")], 0, 60)
    )
    assert await catalog.active_leases() == 0
    assert await catalog.get("acme", mine.id) == mine
    assert await catalog.get("globex", theirs.id) == theirs


async def test_page_is_newest_first_and_continues_after_a_record(
    catalog: EvidenceCatalog, clock: FakeClock
) -> None:
    start = int(clock.now)
    made: list[EvidenceRecord] = []
    for step in (
        0,
        1,
        1,
        0,
        1,
    ):  # two pairs created in the same second: insertion order breaks ties
        clock.advance(step)
        made.append(await add(catalog, sha=SHA_B))
    r0, r1, r2, r3, r4 = made
    assert [r.created for r in made] == [start, start + 1, start + 2, start + 2, start + 3]
    newest_first = [r4, r3, r2, r1, r0]
    assert await catalog.page("acme", 2) == ([r4, r3], True)
    assert await catalog.page("acme", 2, after=r3.id) == ([r2, r1], True)
    assert await catalog.page("acme", 2, after=r1.id) == ([r0], False)
    assert await catalog.page("acme", 2, after=r0.id) == ([], False)
    assert await catalog.page("acme", 5) == (newest_first, False)
    assert await catalog.page("acme", 100) == (newest_first, False)
    # Past the TTL cutoff a record is in no page and no cursor.
    assert await catalog.page("acme", 100, not_before=start + 1) == (newest_first[:4], False)
    error = await not_found(catalog.page("acme", 2, after=r0.id, not_before=start + 1))
    assert error.param == "after"
    assert (await not_found(catalog.page("acme", 2, after=UNKNOWN_ID))).param == "after"
    await catalog.delete("acme", r2.id)
    assert (await not_found(catalog.page("acme", 2, after=r2.id))).param == "after"
    assert await catalog.page("acme", 2, after=r3.id) == ([r1, r0], False)


async def test_find_same_is_the_oldest_live_match_outside_exclude(
    catalog: EvidenceCatalog, clock: FakeClock
) -> None:
    start = int(clock.now)
    first = await add(catalog, locator=SHA_B)
    clock.advance(1)
    second = await add(catalog, locator=SHA_B)
    bare = await add(catalog, locator=None)
    await add(catalog, sha=SHA_C, locator=SHA_B)
    assert await catalog.find_same("acme", SHA_A, SHA_B) == first
    assert await catalog.find_same("acme", SHA_A, SHA_B, exclude=frozenset({first.id})) == second
    excluded = frozenset({first.id, second.id})
    assert await catalog.find_same("acme", SHA_A, SHA_B, exclude=excluded) is None
    assert await catalog.find_same("acme", SHA_A, None) == bare  # no locator matches only none
    assert await catalog.find_same("acme", SHA_A, SHA_C) is None
    assert await catalog.find_same("acme", SHA_A, SHA_B, not_before=start + 1) == second
    assert await catalog.find_same("globex", SHA_A, SHA_B) is None


async def test_usage_counts_the_live_records(catalog: EvidenceCatalog, clock: FakeClock) -> None:
    start = int(clock.now)
    assert await catalog.usage("acme") == (0, 0)
    await add(catalog, size=10)
    clock.advance(5)
    second = await add(catalog, size=20)
    assert await catalog.usage("acme") == (2, 30)
    assert await catalog.usage("acme", not_before=start + 1) == (1, 20)
    await catalog.delete("acme", second.id)
    assert await catalog.usage("acme") == (1, 10)


async def test_expire_forgets_what_is_older_than_the_cutoff(
    catalog: EvidenceCatalog, clock: FakeClock
) -> None:
    start = int(clock.now)
    old = await add(catalog, "acme", SHA_A)
    theirs = await add(catalog, "globex", SHA_A)
    clock.advance(10)
    fresh = await add(catalog, "acme", SHA_B)
    assert await catalog.expire("acme", start + 5) == [old]
    assert await catalog.expire("acme", start + 5) == []
    assert await catalog.get("acme", old.id) is None
    assert await catalog.get("acme", fresh.id) == fresh
    assert await catalog.get("globex", theirs.id) == theirs  # another tenant's TTL, not acme's
    assert await catalog.is_referenced(SHA_A)  # globex's record still names it


async def test_delete_forgets_the_record(catalog: EvidenceCatalog) -> None:
    record = await add(catalog)
    assert await catalog.is_referenced(SHA_A)
    assert await catalog.delete("acme", record.id) == record
    assert await catalog.delete("acme", record.id) is None
    assert await catalog.get("acme", record.id) is None
    assert await catalog.delete("acme", "not an id") is None
    assert not await catalog.is_referenced(SHA_A)


async def test_take_leases_is_all_or_nothing(catalog: EvidenceCatalog) -> None:
    kept, gone = await add(catalog, sha=SHA_A), await add(catalog, sha=SHA_B)
    await catalog.delete("acme", gone.id)
    await not_found(catalog.take_leases("req-1", [kept, gone], 0, 60))
    assert await catalog.active_leases() == 0
    assert await catalog.release_leases("req-1") == []  # nothing was leased
    assert not await catalog.is_referenced(SHA_B)
    await catalog.take_leases("req-1", [kept, kept], 0, 60)
    assert await catalog.active_leases() == 1
    assert await catalog.release_leases("req-1") == [(SHA_A, "png")]


async def test_a_deleted_or_expired_record_cannot_be_leased(
    catalog: EvidenceCatalog, clock: FakeClock
) -> None:
    start = int(clock.now)
    deleted = await add(catalog, sha=SHA_A)
    await catalog.delete("acme", deleted.id)
    await not_found(catalog.take_leases("req-1", [deleted], 0, 60))
    old = await add(catalog, sha=SHA_B)
    clock.advance(10)
    await not_found(catalog.take_leases("req-1", [old], start + 5, 60))
    assert await catalog.active_leases() == 0
    assert not await catalog.is_referenced(SHA_A)


async def test_referenced_names_the_digests_a_record_or_live_lease_holds(
    catalog: EvidenceCatalog, clock: FakeClock
) -> None:
    """The staged-file sweep's batch question (spec §24), as ``is_referenced`` per digest."""
    assert await catalog.referenced([]) == set()
    record = await add(catalog, sha=SHA_A)
    leased = await add(catalog, sha=SHA_B)
    await catalog.take_leases("req-1", [leased], 0, 30)
    await catalog.delete("acme", leased.id)  # the lease alone holds SHA_B
    many = [f"{n:064x}" for n in range(1000)]  # past SQLite's parameters per statement
    assert await catalog.referenced([SHA_A, SHA_B, SHA_C, SHA_A, *many]) == {SHA_A, SHA_B}
    clock.advance(30)  # the lease expired: a crashed replica's holds nothing
    assert await catalog.referenced([SHA_A, SHA_B, SHA_C]) == {SHA_A}
    await catalog.delete("acme", record.id)
    assert await catalog.referenced([SHA_A, SHA_B]) == set()


async def test_is_referenced_by_a_record_or_an_unexpired_lease(
    catalog: EvidenceCatalog, clock: FakeClock
) -> None:
    assert not await catalog.is_referenced(SHA_A)
    record = await add(catalog)
    assert await catalog.is_referenced(SHA_A)
    await catalog.take_leases("req-1", [record], 0, 30)
    await catalog.delete("acme", record.id)
    assert await catalog.is_referenced(SHA_A)  # the lease alone holds it now
    clock.advance(29.5)
    assert await catalog.is_referenced(SHA_A)
    clock.advance(0.5)  # at its expiry a lease holds nothing (a crashed replica's)
    assert not await catalog.is_referenced(SHA_A)
    assert not await catalog.is_referenced(SHA_B)


async def test_release_leases_returns_each_file_once(catalog: EvidenceCatalog) -> None:
    one, two = await add(catalog, sha=SHA_B), await add(catalog, sha=SHA_A)
    same_bytes = await add(catalog, "globex", sha=SHA_A)
    await catalog.take_leases("req-1", [one, two, one], 0, 60)
    await catalog.take_leases("req-2", [same_bytes], 0, 60)
    await catalog.take_leases("req-3", [one], 0, 60)
    assert await catalog.active_leases() == 4
    assert await catalog.release_leases("req-1") == [(SHA_A, "png"), (SHA_B, "png")]
    assert await catalog.release_leases("req-1") == []  # idempotent
    assert await catalog.active_leases() == 2  # the other requests' stay
    await catalog.delete("acme", one.id)
    assert await catalog.is_referenced(SHA_B)  # req-3's
    assert await catalog.release_leases("req-3") == [(SHA_B, "png")]
    assert not await catalog.is_referenced(SHA_B)


async def test_sweep_leases_drops_only_expired_ones(
    catalog: EvidenceCatalog, clock: FakeClock
) -> None:
    one, two, three = [await add(catalog, sha=s) for s in (SHA_A, SHA_B, SHA_C)]
    await catalog.take_leases("short", [one, two], 0, 10)
    await catalog.take_leases("short-too", [one], 0, 10)
    await catalog.take_leases("long", [two, three], 0, 100)
    assert await catalog.sweep_leases() == []
    clock.advance(10)
    assert await catalog.sweep_leases() == [(SHA_A, "png"), (SHA_B, "png")]
    assert await catalog.sweep_leases() == []
    assert await catalog.active_leases() == 2
    assert await catalog.release_leases("short") == []  # swept already
    for record in (one, two, three):
        await catalog.delete("acme", record.id)
    assert not await catalog.is_referenced(SHA_A)
    assert await catalog.is_referenced(SHA_B)  # "long" still holds it
    clock.advance(90)
    assert await catalog.sweep_leases() == [(SHA_B, "png"), (SHA_C, "png")]
    assert await catalog.active_leases() == 0


async def test_recover_leases_drops_a_crashed_runs_leases(
    backend: Backend, catalog: EvidenceCatalog, clock: FakeClock
) -> None:
    """One replica (SQLite): every lease at start is a crashed run's. A fleet
    (PostgreSQL): the others' are live, only the expired ones go."""
    one, two = await add(catalog, sha=SHA_A), await add(catalog, sha=SHA_B)
    await catalog.take_leases("crashed", [one], 0, 10)
    clock.advance(20)
    await catalog.take_leases("live-elsewhere", [two], 0, 100)
    for record in (one, two):
        await catalog.delete("acme", record.id)
    restarted = backend.open(clock, replica="replica-b")
    try:
        if backend.name == "sqlite":
            assert await restarted.recover_leases() == 2
            assert await restarted.active_leases() == 0
            assert not await restarted.is_referenced(SHA_B)
        else:
            assert await restarted.recover_leases() == 1
            assert await restarted.active_leases() == 1
            assert await restarted.is_referenced(SHA_B)
            assert await restarted.release_leases("live-elsewhere") == [(SHA_B, "png")]
        assert not await restarted.is_referenced(SHA_A)
        assert await restarted.release_leases("crashed") == []
    finally:
        await restarted.close()


async def test_recover_leases_counts_leases_not_files(
    request: pytest.FixtureRequest, backend: Backend, catalog: EvidenceCatalog, clock: FakeClock
) -> None:
    one, two = await add(catalog, sha=SHA_A), await add(catalog, sha=SHA_A)
    await catalog.take_leases("crashed", [one, two], 0, 10)
    clock.advance(10)
    assert await catalog.recover_leases() == 2


async def test_a_lease_taken_again_holds_from_the_latest_take(
    request: pytest.FixtureRequest, backend: Backend, catalog: EvidenceCatalog, clock: FakeClock
) -> None:
    """take_leases: "until ttl_s from now", also for a record the request holds already."""
    record = await add(catalog)
    await catalog.take_leases("req-1", [record], 0, 10)
    clock.advance(5)
    await catalog.take_leases("req-1", [record], 0, 10)
    await catalog.delete("acme", record.id)
    clock.advance(6)  # 11 s after the first take, 6 s after the second
    assert await catalog.is_referenced(SHA_A)


async def test_active_leases_counts_only_unexpired_ones(
    request: pytest.FixtureRequest, backend: Backend, catalog: EvidenceCatalog, clock: FakeClock
) -> None:
    record = await add(catalog)
    await catalog.take_leases("req-1", [record], 0, 10)
    assert await catalog.active_leases() == 1
    clock.advance(10)
    assert await catalog.active_leases() == 0


async def test_quota_is_exact_under_concurrent_adds(
    catalog: EvidenceCatalog, clock: FakeClock
) -> None:
    async def attempts(tenant: str, quota: tuple[int, int]) -> list[EvidenceRecord]:
        async with asyncio.timeout(60):
            results = await asyncio.gather(
                *(add(catalog, tenant, size=82, quota=quota) for _ in range(20)),
                return_exceptions=True,
            )
        refused = [r for r in results if not isinstance(r, EvidenceRecord)]
        assert all(isinstance(r, GatewayError) for r in refused), refused
        assert {r.code for r in refused if isinstance(r, GatewayError)} <= {
            "evidence_quota_exceeded"
        }
        return [r for r in results if isinstance(r, EvidenceRecord)]

    assert len(await attempts("acme", (5, 10**9))) == 5
    assert await catalog.usage("acme") == (5, 5 * 82)
    assert len(await attempts("globex", (100, 3 * 82))) == 3  # by bytes
    assert await catalog.usage("globex") == (3, 3 * 82)
    # Only live records count: past the cutoff, acme has room again.
    clock.advance(10)
    cutoff = int(clock.now)
    fresh = await add(catalog, "acme", quota=(1, 10**9), not_before=cutoff)
    with pytest.raises(GatewayError) as info:
        await add(catalog, "acme", quota=(1, 10**9), not_before=cutoff)
    assert info.value.code == "evidence_quota_exceeded"
    assert await catalog.usage("acme", cutoff) == (1, fresh.bytes)


async def test_quota_is_exact_across_two_replicas(postgres_dsn: str, clock: FakeClock) -> None:
    """Two replicas, each with its own pool, upload for one tenant at once."""
    replicas = [pg_catalog(postgres_dsn, clock, f"replica-{n}") for n in range(2)]
    try:
        async with asyncio.timeout(60):
            results = await asyncio.gather(
                *(add(replicas[n % 2], "acme", size=82, quota=(7, 10**9)) for n in range(20)),
                return_exceptions=True,
            )
        kept = [r for r in results if isinstance(r, EvidenceRecord)]
        refused = [r for r in results if isinstance(r, GatewayError)]
        assert len(kept) == 7
        assert len(refused) == 13
        assert {e.code for e in refused} == {"evidence_quota_exceeded"}
        for replica in replicas:
            assert await replica.usage("acme") == (7, 7 * 82)
    finally:
        for replica in replicas:
            await replica.close()
