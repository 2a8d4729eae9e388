"""ApprovalBook: a decision reaches the waiting stream at once through the
same replica and within a second through another (spec §22 "Asking the
caller"), on both backends; timeouts, closing, the poller's life, a store
that fails for a while."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from gateway.apis.agents.frames import new_approval_id
from gateway.books.approvals import POLL_S, ApprovalBook
from gateway.books.protocols import ApprovalStore, Decision, Resolution
from gateway.books.state.calls import StateCalls
from gateway.books.state.sqlite.approvals import SqliteApprovalStore
from gateway.core.errors import GatewayError
from tests.books.evidence.support import FakeClock
from tests.books.state.support import TIMEOUT_S

#: the spec's bound for a decision made through another replica
CROSS_REPLICA_S = 1.0


@pytest.fixture(params=["sqlite", "postgres"])
async def stores(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[ApprovalStore, ApprovalStore]]:
    """Two replicas' stores on one backend."""
    if request.param == "sqlite":
        made = [SqliteApprovalStore(tmp_path / "catalog.sqlite3") for _ in range(2)]
        yield made[0], made[1]
        for store in made:
            await store.shutdown()
        return
    from gateway.books.state.postgres.approvals import PgApprovalStore
    from gateway.books.state.postgres.pool import PgPool

    dsn = request.getfixturevalue("postgres_dsn")
    pools = [PgPool(dsn, TIMEOUT_S) for _ in range(2)]
    yield (
        PgApprovalStore(pools[0], StateCalls(TIMEOUT_S)),
        PgApprovalStore(pools[1], StateCalls(TIMEOUT_S)),
    )
    for pool in pools:
        await pool.close()


async def until(check: object, what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def test_a_decision_through_the_same_replica_wakes_the_stream_at_once(
    stores: tuple[ApprovalStore, ApprovalStore],
) -> None:
    # A poll interval no test waits for: only the in-process path can deliver.
    book = ApprovalBook(stores[0], timeout_s=TIMEOUT_S, poll_s=60)
    approval = new_approval_id()
    await book.open("acme", "req-1", approval)
    waiting = asyncio.create_task(book.wait(approval, 10))
    await asyncio.sleep(0)  # the stream is waiting
    began = time.monotonic()
    assert await book.decide("acme", approval, "approve") == "resolved"
    assert await waiting == "approve"
    latency = time.monotonic() - began
    assert latency < 0.1, latency
    assert book.polls == 0  # no store read: the registry carried it
    await book.close(approval)
    await book.aclose()


async def test_a_decision_through_another_replica_is_seen_within_a_second(
    stores: tuple[ApprovalStore, ApprovalStore],
) -> None:
    holder = ApprovalBook(stores[0], timeout_s=TIMEOUT_S)
    elsewhere = ApprovalBook(stores[1], timeout_s=TIMEOUT_S)
    latencies = []
    for n in range(3):
        approval = new_approval_id()
        await holder.open("acme", f"req-{n}", approval)
        waiting = asyncio.create_task(holder.wait(approval, 10))
        await asyncio.sleep(0.05 * n)  # decisions land at different points of a poll
        began = time.monotonic()
        assert await elsewhere.decide("acme", approval, "deny") == "resolved"
        assert await waiting == "deny"
        latencies.append(time.monotonic() - began)
        await holder.close(approval)
    assert max(latencies) < CROSS_REPLICA_S, latencies
    assert max(latencies) < POLL_S + 0.2, latencies  # one poll, give or take a query
    assert holder.polls >= 3 and elsewhere.polls == 0
    await holder.aclose()
    await elsewhere.aclose()


async def test_a_wait_times_out_and_a_closed_approval_takes_no_decision(
    stores: tuple[ApprovalStore, ApprovalStore],
) -> None:
    holder = ApprovalBook(stores[0], timeout_s=TIMEOUT_S)
    elsewhere = ApprovalBook(stores[1], timeout_s=TIMEOUT_S)
    approval = new_approval_id()
    await holder.open("acme", "req-1", approval)
    began = time.monotonic()
    assert await holder.wait(approval, 0.3) is None
    assert time.monotonic() - began >= 0.3
    await holder.close(approval)
    assert holder.pending == 0
    assert await elsewhere.decide("acme", approval, "approve") == "not_found"
    assert await holder.decide("acme", approval, "approve") == "not_found"
    await until(lambda: not holder.polling, "the poller stops with nothing registered")
    await holder.aclose()
    await elsewhere.aclose()


async def test_another_tenant_cannot_decide_and_a_second_decision_is_refused(
    stores: tuple[ApprovalStore, ApprovalStore],
) -> None:
    holder = ApprovalBook(stores[0], timeout_s=TIMEOUT_S)
    elsewhere = ApprovalBook(stores[1], timeout_s=TIMEOUT_S)
    approval = new_approval_id()
    await holder.open("acme", "req-1", approval)
    assert await elsewhere.decide("globex", approval, "approve") == "not_found"
    assert await holder.decide("globex", approval, "approve") == "not_found"
    assert await holder.wait(approval, 0.4) is None  # nothing was decided
    assert await elsewhere.decide("acme", approval, "deny") == "resolved"
    assert await holder.decide("acme", approval, "approve") == "already_resolved"
    assert await holder.wait(approval, 5) == "deny"
    await holder.close(approval)
    await holder.aclose()
    await elsewhere.aclose()


async def test_a_decision_made_before_the_wait_is_not_lost(
    stores: tuple[ApprovalStore, ApprovalStore],
) -> None:
    holder = ApprovalBook(stores[0], timeout_s=TIMEOUT_S)
    mine = new_approval_id()
    await holder.open("acme", "req-1", mine)
    theirs = new_approval_id()
    await holder.open("acme", "req-2", theirs)
    assert await holder.decide("acme", mine, "approve") == "resolved"
    assert (
        await ApprovalBook(stores[1], timeout_s=TIMEOUT_S).decide("acme", theirs, "deny")
        == "resolved"
    )
    assert await holder.wait(mine, 0) == "approve"
    assert await holder.wait(theirs, 5) == "deny"
    await holder.aclose()


class FlakyStore:
    """An approval store whose reads fail ``failures`` times (a store outage)."""

    def __init__(self, inner: ApprovalStore, failures: int) -> None:
        self.inner = inner
        self.failures = failures

    async def open(self, tenant: str, request_id: str, approval_id: str, expires: float) -> None:
        await self.inner.open(tenant, request_id, approval_id, expires)

    async def decide(
        self, tenant: str, approval_id: str, decision: Decision, now: float
    ) -> Resolution:
        return await self.inner.decide(tenant, approval_id, decision, now)

    async def read(self, approval_id: str) -> Decision | None:
        return await self.inner.read(approval_id)

    async def read_many(self, approval_ids: Sequence[str]) -> dict[str, Decision]:
        if self.failures:
            self.failures -= 1
            raise GatewayError("state_unavailable")
        return await self.inner.read_many(approval_ids)

    async def close(self, approval_id: str) -> None:
        await self.inner.close(approval_id)

    async def sweep(self, now: float) -> int:
        return await self.inner.sweep(now)


async def test_a_store_failing_for_a_while_delays_the_decision_but_never_breaks_the_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    inner = SqliteApprovalStore(tmp_path / "catalog.sqlite3")
    holder = ApprovalBook(FlakyStore(inner, failures=3), timeout_s=TIMEOUT_S, poll_s=0.02)
    elsewhere = ApprovalBook(inner, timeout_s=TIMEOUT_S)
    approval = new_approval_id()
    await holder.open("acme", "req-1", approval)
    assert await elsewhere.decide("acme", approval, "approve") == "resolved"
    with caplog.at_level("INFO", logger="gateway.approvals"):
        assert await holder.wait(approval, 5) == "approve"
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 1  # once per episode, not per poll
    await holder.aclose()
    await inner.shutdown()


async def test_registrations_past_their_expiry_are_dropped_and_swept(tmp_path: Path) -> None:
    store = SqliteApprovalStore(tmp_path / "catalog.sqlite3")
    clock = FakeClock()
    book = ApprovalBook(store, timeout_s=TIMEOUT_S, poll_s=0.01, clock=clock)
    approval = new_approval_id()
    await book.open("acme", "req-1", approval, ttl_s=30)
    waiting = asyncio.create_task(book.wait(approval, 0.5))
    clock.advance(31)  # the stream's replica never closed it
    assert await waiting is None
    await until(lambda: book.pending == 0 and not book.polling, "the registration is dropped")
    assert await book.decide("acme", approval, "approve") == "not_found"
    assert await book.sweep() == 1
    await book.aclose()
    await store.shutdown()


async def test_an_id_is_opened_once_and_a_failed_open_registers_nothing(tmp_path: Path) -> None:
    store = SqliteApprovalStore(tmp_path / "catalog.sqlite3")
    book = ApprovalBook(store, timeout_s=TIMEOUT_S)
    made = {new_approval_id() for _ in range(20)}
    assert len(made) == 20 and all(len(i) == 36 and i.startswith("apr_") for i in made)
    for approval in made:
        await book.open("acme", "req-1", approval)
    given = new_approval_id()
    await book.open("acme", "req-2", given)
    with pytest.raises(ValueError, match="opened once"):
        await book.open("acme", "req-3", given)
    with pytest.raises(GatewayError) as info:
        # Another replica's book: the store refuses the taken id.
        await ApprovalBook(store, timeout_s=TIMEOUT_S).open("acme", "req-3", given)
    assert info.value.code == "state_unavailable"
    assert book.pending == 21
    failing = ApprovalBook(store, timeout_s=TIMEOUT_S)
    with pytest.raises(GatewayError):
        await failing.open("acme", "req-3", given)
    assert failing.pending == 0  # a failed open leaves nothing registered
    with pytest.raises(ValueError, match="approve or deny"):
        await book.decide("acme", given, "maybe")  # type: ignore[arg-type]
    await book.aclose()
    with pytest.raises(GatewayError):
        await book.open("acme", "req-4", new_approval_id())
    await store.shutdown()
