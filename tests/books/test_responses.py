"""The Responses id book: noted in memory at once, written to the catalog in
batches, kept through a failing volume, never rewritten once forgotten."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.books import responses as response_book
from gateway.books.evidence.catalog import Catalog, ResponseRow, StorageFull
from gateway.books.responses import ResponseBook
from tests.support.poll import eventually_async


class CountingCatalog(Catalog):
    """The real catalog, counting its response writes and failing the first
    ``fail`` of them as a full volume would."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.writes: list[int] = []
        self.fail = 0

    def record_responses(self, rows: list[ResponseRow]) -> None:
        if self.fail:
            self.fail -= 1
            raise StorageFull()
        self.writes.append(len(rows))
        super().record_responses(rows)


@pytest.fixture
async def book(tmp_path: Path) -> AsyncIterator[tuple[ResponseBook, CountingCatalog]]:
    catalog = CountingCatalog(tmp_path / "cat.sqlite3")
    book = ResponseBook(catalog, ttl_s=3600)
    book.start()
    try:
        yield book, catalog
    finally:
        await book.aclose(5)
        catalog.close()


async def test_a_noted_id_is_the_tenants_at_once_and_in_the_catalog_soon(
    book: tuple[ResponseBook, CountingCatalog],
) -> None:
    responses, catalog = book
    responses.note("acme", "resp_1", "small", b'{"id":"resp_1"}')
    assert await responses.entry("acme", "resp_1") == ("small", b'{"id":"resp_1"}', None)
    assert await responses.entry("globex", "resp_1") is None
    await eventually_async(lambda: responses.pending == 0, "every id written", 5)
    assert catalog.response_entry("acme", "resp_1") == ("small", b'{"id":"resp_1"}', None)
    assert catalog.response_entry("globex", "resp_1") is None


async def test_notes_of_one_moment_share_one_write(
    book: tuple[ResponseBook, CountingCatalog],
) -> None:
    responses, catalog = book
    for i in range(50):
        responses.note("acme", f"resp_{i}", "small", None)
    await eventually_async(lambda: responses.pending == 0, "every id written", 5)
    assert catalog.writes == [50]
    assert all(catalog.response_entry("acme", f"resp_{i}") for i in range(50))


async def test_a_failing_volume_keeps_ids_in_memory_until_it_recovers(
    book: tuple[ResponseBook, CountingCatalog], caplog: pytest.LogCaptureFixture
) -> None:
    responses, catalog = book
    catalog.fail = 2
    with caplog.at_level(logging.INFO, logger="gateway.responses"):
        responses.note("acme", "resp_full", "small", b"{}")
        await eventually_async(lambda: catalog.fail == 0, "the failing writes tried", 5)
        # Still the tenant's meanwhile, from memory.
        assert (await responses.entry("acme", "resp_full") or ("",))[0] == "small"
        await eventually_async(lambda: responses.pending == 0, "every id written", 5)
    assert catalog.response_entry("acme", "resp_full") == ("small", b"{}", None)
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("responses: catalog write failed (storage_error), retrying") == 1
    assert "responses: catalog writes recovered" in messages


async def test_a_forgotten_id_is_never_written_back(
    book: tuple[ResponseBook, CountingCatalog],
) -> None:
    responses, catalog = book
    responses.note("acme", "resp_gone", "small", b"{}")
    await responses.forget("acme", "resp_gone")
    await responses.flush()
    assert await responses.entry("acme", "resp_gone") is None
    assert catalog.response_entry("acme", "resp_gone") is None
    assert responses.pending == 0


async def test_a_note_during_a_write_stays_for_the_next(tmp_path: Path) -> None:
    catalog = CountingCatalog(tmp_path / "cat.sqlite3")
    responses = ResponseBook(catalog, ttl_s=3600)
    try:
        responses.note("acme", "resp_x", "first", None)
        original = catalog.record_responses

        def renote_while_writing(rows: list[ResponseRow]) -> None:
            original(rows)
            # As a request on the loop would, while the batch's thread writes.
            responses.note("acme", "resp_x", "second", None)

        catalog.record_responses = renote_while_writing  # type: ignore[method-assign]
        assert await responses.flush() == 1
        assert responses.pending == 1
        assert (await responses.entry("acme", "resp_x") or ("",))[0] == "second"
        catalog.record_responses = original  # type: ignore[method-assign]
        assert await responses.flush() == 1
        assert catalog.response_entry("acme", "resp_x") == ("second", None, None)
    finally:
        catalog.close()


async def test_kept_bodies_waiting_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(response_book, "MAX_PENDING_BODY_BYTES", 10)
    catalog = CountingCatalog(tmp_path / "cat.sqlite3")
    responses = ResponseBook(catalog, ttl_s=3600)
    try:
        responses.note("acme", "resp_a", "small", b"123456")
        responses.note("acme", "resp_b", "small", b"123456")  # past the bound: no body
        responses.note("acme", "resp_a", "small", b"1234")  # replaces its own bytes
        assert await responses.entry("acme", "resp_a") == ("small", b"1234", None)
        assert await responses.entry("acme", "resp_b") == ("small", None, None)
        await responses.flush()
        responses.note("acme", "resp_c", "small", b"123456789")  # room again once written
        assert await responses.entry("acme", "resp_c") == ("small", b"123456789", None)
    finally:
        catalog.close()


async def test_close_writes_what_is_left(tmp_path: Path) -> None:
    catalog = CountingCatalog(tmp_path / "cat.sqlite3")
    responses = ResponseBook(catalog, ttl_s=3600)
    responses.start()
    responses.note("acme", "resp_last", "small", None)
    assert await responses.aclose(5) == 0
    assert catalog.response_entry("acme", "resp_last") == ("small", None, None)
    catalog.fail = 100
    responses.note("acme", "resp_lost", "small", None)
    assert await responses.aclose(1) == 1
    catalog.close()


async def test_an_id_expires_in_memory_too(tmp_path: Path) -> None:
    now = [1000.0]
    catalog = CountingCatalog(tmp_path / "cat.sqlite3")
    responses = ResponseBook(catalog, ttl_s=60, clock=lambda: now[0])
    try:
        responses.note("acme", "resp_old", "small", None)
        now[0] += 61
        assert await responses.entry("acme", "resp_old") is None
    finally:
        catalog.close()


class BrokenCatalog(CountingCatalog):
    """Raises what a translated SQLite error is not (e.g. an integer too big to bind)."""

    def record_responses(self, rows: list[ResponseRow]) -> None:
        if self.fail:
            self.fail -= 1
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        super().record_responses(rows)


async def test_the_flusher_outlives_an_unexpected_error(tmp_path: Path) -> None:
    catalog = BrokenCatalog(tmp_path / "cat.sqlite3")
    catalog.fail = 1
    responses = ResponseBook(catalog, ttl_s=3600)
    responses.start()
    try:
        responses.note("acme", "resp_odd", "small", None)
        await eventually_async(lambda: responses.pending == 0, "every id written", 5)
        assert catalog.response_entry("acme", "resp_odd") == ("small", None, None)
    finally:
        catalog.fail = 100
        responses.note("acme", "resp_late", "small", None)
        assert await responses.aclose(1) == 1  # counted, not raised
        catalog.close()


async def test_ids_no_caller_could_name_are_not_kept(tmp_path: Path) -> None:
    catalog = CountingCatalog(tmp_path / "cat.sqlite3")
    responses = ResponseBook(catalog, ttl_s=3600)
    try:
        for odd in ("", "resp_" + "x" * 65, "chatcmpl-1", "resp_a/b"):
            responses.note("acme", odd, "small", None)
        assert responses.pending == 0
    finally:
        catalog.close()


async def test_pending_ids_are_bounded_and_expired_ones_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(response_book, "MAX_PENDING_IDS", 3)
    now = [1000.0]
    catalog = CountingCatalog(tmp_path / "cat.sqlite3")
    responses = ResponseBook(catalog, ttl_s=60, clock=lambda: now[0])
    try:
        for i in range(3):
            responses.note("acme", f"resp_{i}", "small", None)
        responses.note("acme", "resp_over", "small", None)
        assert responses.pending == 3
        assert await responses.entry("acme", "resp_over") is None
        now[0] += 61  # the three expire: room again
        responses.note("acme", "resp_after", "small", None)
        assert responses.pending == 1
        assert (await responses.entry("acme", "resp_after") or ("",))[0] == "small"
    finally:
        catalog.close()


async def test_a_failed_forget_leaves_the_id_as_it_was(tmp_path: Path) -> None:
    catalog = CountingCatalog(tmp_path / "cat.sqlite3")
    responses = ResponseBook(catalog, ttl_s=3600)
    try:
        responses.note("acme", "resp_keep", "small", None)

        def refuse(tenant: str, response_id: str) -> None:
            raise StorageFull()

        catalog.forget_response = refuse  # type: ignore[method-assign]
        with pytest.raises(StorageFull):
            await responses.forget("acme", "resp_keep")
        assert (await responses.entry("acme", "resp_keep") or ("",))[0] == "small"
    finally:
        catalog.close()


async def test_the_workers_id_is_kept_beside_the_gateways(
    book: tuple[ResponseBook, CountingCatalog],
) -> None:
    """Callers name the gateway's id (spec §21); the worker knows its own."""
    responses, catalog = book
    responses.note("acme", "resp_gateway", "small", None, "resp_worker-7")
    assert await responses.entry("acme", "resp_gateway") == ("small", None, "resp_worker-7")
    await responses.flush()
    assert catalog.response_entry("acme", "resp_gateway") == ("small", None, "resp_worker-7")
    assert catalog.response_entry("acme", "resp_worker-7") is None


def test_a_catalog_from_before_gateway_ids_gains_the_column(tmp_path: Path) -> None:
    import sqlite3
    import time

    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE responses (tenant TEXT NOT NULL, id TEXT NOT NULL, alias TEXT NOT "
            "NULL, expires INTEGER NOT NULL, body BLOB, PRIMARY KEY (tenant, id))"
        )
        conn.execute(
            "INSERT INTO responses VALUES ('acme', 'resp_old', 'small', ?, NULL)",
            (int(time.time()) + 3600,),
        )
    conn.close()
    catalog = Catalog(path)
    try:
        # An old row's id is the worker's own: no upstream id recorded.
        assert catalog.response_entry("acme", "resp_old") == ("small", None, None)
        catalog.record_responses(
            [ResponseRow("acme", "resp_new", "small", int(time.time()) + 60, None, "w")]
        )
        assert catalog.response_entry("acme", "resp_new") == ("small", None, "w")
    finally:
        catalog.close()
