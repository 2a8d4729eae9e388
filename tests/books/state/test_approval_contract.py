"""One contract, two backends: every ApprovalStore behaves alike (spec §22
"Asking the caller", §17).

Each test runs on SQLite (one file in ``tmp_path``) and on PostgreSQL (a fresh
database of the test's own). Two replicas are two stores on the same file or
database: the one holding the stream opens and reads, a caller's decision
arrives through either.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gateway.apis.agents.frames import new_approval_id
from gateway.books.protocols import ApprovalStore
from gateway.books.state.calls import StateCalls
from gateway.books.state.sqlite.approvals import SqliteApprovalStore
from tests.books.state.support import ContractBackend, contract_backend

NOW = 1_700_000_000.5
LATER = NOW + 300


if TYPE_CHECKING:
    from gateway.books.state.postgres.pool import PgPool

Backend = ContractBackend[ApprovalStore]


def _sqlite(path: Path) -> tuple[ApprovalStore, Callable[[], Awaitable[None]]]:
    store = SqliteApprovalStore(path)
    return store, store.shutdown


def _postgres(pool: PgPool, calls: StateCalls) -> ApprovalStore:
    # Imported here, as the factory does: the SQLite half needs no driver.
    from gateway.books.state.postgres.approvals import PgApprovalStore

    return PgApprovalStore(pool, calls)


@pytest.fixture(params=["sqlite", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async with contract_backend(request, tmp_path, _sqlite, _postgres) as made:
        yield made


@pytest.fixture
def store(backend: Backend) -> ApprovalStore:
    return backend.open()


async def test_a_decision_through_another_replica_is_read_by_the_holder(
    backend: Backend,
) -> None:
    holder, other = backend.open(), backend.open()
    approval = new_approval_id()
    await holder.open("acme", "req-1", approval, LATER)
    assert await holder.read(approval) is None
    assert await other.decide("acme", approval, "deny", NOW) == "resolved"
    assert await holder.read(approval) == "deny"
    assert await holder.read_many([approval, new_approval_id()]) == {approval: "deny"}


async def test_the_first_decision_wins_and_a_second_finds_it_resolved(
    backend: Backend,
) -> None:
    holder, other = backend.open(), backend.open()
    approval = new_approval_id()
    await holder.open("acme", "req-1", approval, LATER)
    assert await holder.decide("acme", approval, "approve", NOW) == "resolved"
    assert await other.decide("acme", approval, "deny", NOW) == "already_resolved"
    assert await holder.decide("acme", approval, "approve", NOW) == "already_resolved"
    assert await other.read(approval) == "approve"


async def test_racing_decisions_through_two_replicas_resolve_exactly_once(
    backend: Backend,
) -> None:
    replicas = [backend.open(), backend.open()]
    for round_ in range(5):
        approval = new_approval_id()
        await replicas[0].open("acme", f"req-{round_}", approval, LATER)
        outcomes = await asyncio.gather(
            *(
                replicas[i % 2].decide("acme", approval, "approve" if i % 3 else "deny", NOW)
                for i in range(8)
            )
        )
        assert sorted(outcomes) == ["already_resolved"] * 7 + ["resolved"]
        assert await replicas[1].read(approval) in ("approve", "deny")


async def test_another_tenants_approval_is_not_found_and_stays_pending(
    store: ApprovalStore,
) -> None:
    approval = new_approval_id()
    await store.open("acme", "req-1", approval, LATER)
    assert await store.decide("globex", approval, "approve", NOW) == "not_found"
    assert await store.read(approval) is None
    assert await store.decide("acme", approval, "approve", NOW) == "resolved"
    assert await store.decide("globex", approval, "deny", NOW) == "not_found"
    assert await store.read(approval) == "approve"


async def test_unknown_closed_and_expired_approvals_are_not_found(
    store: ApprovalStore,
) -> None:
    assert await store.decide("acme", new_approval_id(), "approve", NOW) == "not_found"
    assert await store.read(new_approval_id()) is None
    closed, expiring = new_approval_id(), new_approval_id()
    await store.open("acme", "req-1", closed, LATER)
    await store.close(closed)
    assert await store.decide("acme", closed, "approve", NOW) == "not_found"
    await store.close(closed)  # idempotent
    await store.open("acme", "req-2", expiring, NOW + 1)
    assert await store.decide("acme", expiring, "approve", NOW + 1) == "not_found"
    assert await store.read(expiring) is None


async def test_the_sweep_deletes_only_approvals_past_their_expiry(
    backend: Backend,
) -> None:
    one, other = backend.open(), backend.open()
    stale, live = new_approval_id(), new_approval_id()
    await one.open("acme", "req-1", stale, NOW + 10)
    await one.open("acme", "req-2", live, NOW + 100)
    assert await other.sweep(NOW) == 0
    assert await other.sweep(NOW + 10) == 1
    assert await one.decide("acme", live, "deny", NOW + 20) == "resolved"
    assert await one.sweep(NOW + 100) == 1
    assert await one.read(live) is None
    assert await one.read_many([]) == {}
