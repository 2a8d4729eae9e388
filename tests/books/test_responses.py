"""The response book over a store: keeps of one moment share one commit, every
waiter is released only once its commit is done, a failing or slow store is
``state_unavailable`` for its waiters, and the expiry sweep runs on its own."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import pytest

from gateway.books.protocols import KeptResponse
from gateway.books.responses import MAX_KEPT_BYTES, ResponseBook
from gateway.books.state.sqlite.responses import SqliteResponseStore
from gateway.core.errors import GatewayError
from tests.support.poll import eventually_async

NOW = 1_000_000.0


class CountingStore(SqliteResponseStore):
    """The real store, counting its commits; ``gate`` holds each commit until
    set, ``fail`` makes the next ones fail as a refused write would."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.commits: list[int] = []
        self.gate: asyncio.Event | None = None
        self.fail = 0
        self.expired = 0

    async def keep(self, rows: Sequence[KeptResponse], max_bytes: Mapping[str, int]) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            self.fail -= 1
            raise GatewayError("state_unavailable")
        await super().keep(rows, max_bytes)
        self.commits.append(len(rows))

    async def expire(self, now: float) -> int:
        self.expired += 1
        return await super().expire(now)


def make_book(store: CountingStore, **options: float) -> ResponseBook:
    timeout_s = options.pop("timeout_s", 5.0)
    return ResponseBook(store, ttl_s=60, timeout_s=timeout_s, clock=lambda: NOW, **options)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[CountingStore]:
    opened = CountingStore(tmp_path / "catalog.sqlite3")
    try:
        yield opened
    finally:
        await opened.close()


def kept(book: ResponseBook, rid: str, previous: str | None = None) -> KeptResponse:
    return book.row(
        tenant="acme",
        response_id=rid,
        alias="small",
        previous_id=previous,
        input_items=b'[{"type":"message"}]',
        output_items=b"[]",
        body=b'{"id":"%s"}' % rid.encode(),
        upstream_id=None,
    )


async def test_a_kept_row_is_found_as_soon_as_keep_returns(store: CountingStore) -> None:
    book = make_book(store)
    await book.keep(kept(book, "resp_1"), 1 << 20)
    found = await book.get("acme", "resp_1")
    assert found is not None and found.body == b'{"id":"resp_1"}'
    assert (found.created, found.expires) == (NOW, int(NOW) + 60)
    assert await book.get("globex", "resp_1") is None


async def test_keeps_of_one_moment_share_one_commit(store: CountingStore) -> None:
    book = make_book(store)
    await asyncio.gather(*(book.keep(kept(book, f"resp_{i}"), 1 << 20) for i in range(50)))
    assert sum(store.commits) == 50 and len(store.commits) <= 2, store.commits
    assert all([await book.get("acme", f"resp_{i}") for i in range(50)])


async def test_keeps_during_a_commit_go_into_the_next_one(store: CountingStore) -> None:
    book = make_book(store)
    store.gate = asyncio.Event()
    first = asyncio.create_task(book.keep(kept(book, "resp_first"), 1 << 20))
    await eventually_async(lambda: book._committer is not None and not book._rows, "committing")
    later = [asyncio.create_task(book.keep(kept(book, f"resp_{i}"), 1 << 20)) for i in range(9)]
    await asyncio.sleep(0)
    assert not first.done() and not any(t.done() for t in later), "nobody before its commit"
    store.gate.set()
    await asyncio.gather(first, *later)
    assert store.commits == [1, 9]


async def test_a_waiter_is_released_only_after_its_commit(store: CountingStore) -> None:
    book = make_book(store)
    store.gate = asyncio.Event()
    task = asyncio.create_task(book.keep(kept(book, "resp_1"), 1 << 20))
    # The commit has begun (held at the store's gate): its waiter must still wait.
    await eventually_async(lambda: book._committer is not None and not book._rows, "committing")
    assert not task.done() and store.commits == []
    store.gate.set()
    await task
    assert store.commits == [1]


async def test_a_failing_store_is_state_unavailable_for_every_waiter(
    store: CountingStore, caplog: pytest.LogCaptureFixture
) -> None:
    book = make_book(store)
    store.fail = 1
    with caplog.at_level(logging.INFO, logger="gateway.responses"):
        results = await asyncio.gather(
            *(book.keep(kept(book, f"resp_{i}"), 1 << 20) for i in range(5)),
            return_exceptions=True,
        )
        assert all(isinstance(r, GatewayError) and r.code == "state_unavailable" for r in results)
        assert await book.get("acme", "resp_0") is None
        await book.keep(kept(book, "resp_again"), 1 << 20)
    assert await book.get("acme", "resp_again") is not None
    messages = [r.getMessage() for r in caplog.records]
    assert any("failed (state_unavailable)" in m for m in messages)
    assert any("accepts writes again" in m for m in messages)


async def test_a_store_slower_than_the_timeout_is_state_unavailable(store: CountingStore) -> None:
    book = make_book(store, timeout_s=0.05)
    store.gate = asyncio.Event()
    with pytest.raises(GatewayError) as caught:
        await book.keep(kept(book, "resp_slow"), 1 << 20)
    assert caught.value.code == "state_unavailable"
    store.gate.set()
    await eventually_async(lambda: book._committer is None, "the commit ended")


async def test_a_body_over_the_bound_is_kept_without_it(store: CountingStore) -> None:
    book = make_book(store)
    big = book.row(
        tenant="acme",
        response_id="resp_big",
        alias="small",
        previous_id=None,
        input_items=b"[]",
        output_items=b"[]",
        body=b"x" * (MAX_KEPT_BYTES + 1),
        upstream_id="w",
    )
    assert big.body is None and big.upstream_id == "w"


async def test_chain_and_forget_go_through_the_book(store: CountingStore) -> None:
    book = make_book(store)
    await book.keep(kept(book, "resp_a"), 1 << 20)
    await book.keep(kept(book, "resp_b", previous="resp_a"), 1 << 20)
    assert [r.id for r in await book.chain("acme", "resp_b", 10)] == ["resp_a", "resp_b"]
    assert await book.forget("acme", "resp_a") is True
    chain = await book.chain("acme", "resp_b", 10)
    assert [r.id for r in chain] == ["resp_b"] and chain[0].previous_id == "resp_a"


async def test_the_expiry_sweep_runs_until_closed(store: CountingStore) -> None:
    book = make_book(store, sweep_s=0.01)
    book.start()
    try:
        await eventually_async(lambda: store.expired >= 2, "the sweep ran twice")
    finally:
        assert await book.aclose(1) == 0
    swept = store.expired
    await asyncio.sleep(0.05)  # (the absence of sweeps after closing: nothing to poll for)
    assert store.expired == swept, "no sweep after close"


async def test_a_closed_book_refuses_keeps(store: CountingStore) -> None:
    book = make_book(store)
    await book.aclose(1)
    with pytest.raises(GatewayError) as caught:
        await book.keep(kept(book, "resp_late"), 1 << 20)
    assert caught.value.code == "state_unavailable"


async def test_close_waits_for_a_running_commit(store: CountingStore) -> None:
    book = make_book(store)
    store.gate = asyncio.Event()
    task = asyncio.create_task(book.keep(kept(book, "resp_1"), 1 << 20))
    await eventually_async(lambda: not book._rows and book._committer is not None, "committing")
    asyncio.get_running_loop().call_later(0.05, store.gate.set)
    assert await book.aclose(5) == 0
    await task
    assert store.commits == [1]
