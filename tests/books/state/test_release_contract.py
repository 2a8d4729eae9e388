"""One contract, two backends: every ReleaseStore behaves alike (spec §18).

Each test runs on SQLite (one file in ``tmp_path``) and on PostgreSQL (a fresh
database of the test's own). Two replicas are two stores on the same file or
database, as two gateway processes would open them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gateway.books.protocols import FORGET_AFTER_S, ArmCounts, ReleaseOverride, ReleaseStore
from gateway.books.state.calls import StateCalls
from gateway.books.state.sqlite.releases import SqliteReleaseStore
from tests.books.state.support import ContractBackend, contract_backend

NOW = 1_700_000_000.5
STABLE = ArmCounts(120, 2, 310.5)
CANARY = ArmCounts(7, 1, None)


if TYPE_CHECKING:
    from gateway.books.state.postgres.pool import PgPool

Backend = ContractBackend[ReleaseStore]


def _sqlite(path: Path) -> tuple[ReleaseStore, Callable[[], Awaitable[None]]]:
    store = SqliteReleaseStore(path)
    return store, store.close


def _postgres(pool: PgPool, calls: StateCalls) -> ReleaseStore:
    # Imported here, as the factory does: the SQLite half needs no driver.
    from gateway.books.state.postgres.releases import PgReleaseStore

    return PgReleaseStore(pool, calls)


@pytest.fixture(params=["sqlite", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async with contract_backend(request, tmp_path, _sqlite, _postgres) as made:
        yield made


@pytest.fixture
def store(backend: Backend) -> ReleaseStore:
    return backend.open()


async def test_no_decision_until_one_is_made(store: ReleaseStore) -> None:
    assert await store.overrides() == {}
    assert await store.clear("chat") is False


async def test_a_decision_is_seen_by_every_replica_until_cleared(backend: Backend) -> None:
    one, other = backend.open(), backend.open()
    await one.decide("chat", "override", 25, NOW)
    assert await other.overrides() == {"chat": ReleaseOverride("chat", "override", 25.0, NOW)}
    # The next decision replaces it (a gate's rollback over an operator's override).
    await other.decide("chat", "rolled_back", 0, NOW + 1)
    await one.decide("embed", "override", 2.5, NOW + 2)
    assert await one.overrides() == {
        "chat": ReleaseOverride("chat", "rolled_back", 0.0, NOW + 1),
        "embed": ReleaseOverride("embed", "override", 2.5, NOW + 2),
    }
    assert await other.clear("chat") is True
    assert await one.clear("chat") is False
    assert list(await one.overrides()) == ["embed"]


@pytest.mark.parametrize(
    ("state", "percent"),
    [
        ("config", 5),
        ("rolledback", 0),
        ("override", -1),
        ("override", 100.5),
        ("override", float("nan")),
        ("override", float("inf")),
    ],
)
async def test_a_malformed_decision_is_refused_and_nothing_is_written(
    store: ReleaseStore, state: str, percent: float
) -> None:
    with pytest.raises(ValueError, match="release decision"):
        await store.decide("chat", state, percent, NOW)
    assert await store.overrides() == {}


async def test_the_percent_bounds_are_decisions(store: ReleaseStore) -> None:
    await store.decide("a", "override", 0, NOW)
    await store.decide("b", "override", 100, NOW)
    assert {n: o.percent for n, o in (await store.overrides()).items()} == {"a": 0.0, "b": 100.0}


async def test_figures_are_per_release_replica_and_arm(backend: Backend) -> None:
    one, other = backend.open(), backend.open()
    await one.publish("replica-a", {"chat": {"stable": STABLE, "canary": CANARY}}, NOW)
    await other.publish("replica-b", {"chat": {"stable": ArmCounts(3, 0, 12.0)}}, NOW + 1)
    assert await one.figures(NOW - 30) == {
        "chat": {
            "replica-a": {"stable": STABLE, "canary": CANARY},
            "replica-b": {"stable": ArmCounts(3, 0, 12.0)},
        }
    }


async def test_publish_replaces_every_row_of_its_replica(store: ReleaseStore) -> None:
    await store.publish(
        "replica-a", {"chat": {"stable": STABLE, "canary": CANARY}, "old": {"stable": STABLE}}, NOW
    )
    await store.publish("replica-b", {"old": {"canary": CANARY}}, NOW)
    # replica-a's next window: "old" left its config, chat's canary published nothing.
    await store.publish("replica-a", {"chat": {"stable": ArmCounts(1, 1, 9.0)}}, NOW + 1)
    assert await store.figures(0) == {
        "chat": {"replica-a": {"stable": ArmCounts(1, 1, 9.0)}},
        "old": {"replica-b": {"canary": CANARY}},
    }
    await store.publish("replica-a", {}, NOW + 2)  # no release: nothing of it stays
    assert await store.figures(0) == {"old": {"replica-b": {"canary": CANARY}}}


async def test_figures_since_keeps_rows_updated_at_or_after_it(store: ReleaseStore) -> None:
    await store.publish("replica-old", {"chat": {"stable": STABLE}}, NOW - 31)
    await store.publish("replica-edge", {"chat": {"stable": STABLE}}, NOW - 30)
    await store.publish("replica-new", {"chat": {"canary": CANARY}}, NOW)
    assert set((await store.figures(NOW - 30))["chat"]) == {"replica-edge", "replica-new"}
    assert set((await store.figures(NOW - 31))["chat"]) == {
        "replica-old",
        "replica-edge",
        "replica-new",
    }
    assert await store.figures(NOW + 1) == {}


async def test_a_long_silent_replica_is_forgotten_by_the_next_publish(
    store: ReleaseStore,
) -> None:
    await store.publish("replica-gone", {"chat": {"stable": STABLE}}, NOW)
    await store.publish("replica-quiet", {"chat": {"stable": STABLE}}, NOW + 10)
    await store.publish("replica-live", {"chat": {"canary": CANARY}}, NOW + FORGET_AFTER_S + 5)
    assert set((await store.figures(0))["chat"]) == {"replica-quiet", "replica-live"}


async def test_names_are_values_never_sql(store: ReleaseStore) -> None:
    name = "chat'; DROP TABLE release_decisions; --"
    await store.decide(name, "override", 1, NOW)
    await store.publish(name, {name: {name: CANARY}}, NOW)
    assert list(await store.overrides()) == [name]
    assert await store.figures(0) == {name: {name: {name: CANARY}}}
