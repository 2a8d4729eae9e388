"""FileBook on the SQLite backend (spec §22 "Files", §24 modes); the backends
themselves are held to one contract in ``tests/books/state/test_file_contract.py``."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest

from gateway.books.evidence.service import EvidenceService
from gateway.books.evidence.store import TEMP_PREFIX, EvidenceStore
from gateway.books.files.book import PIECE, FileBook, file_store
from gateway.books.files.records import FILE_ID, FileRecord
from gateway.books.state.sqlite.catalog import Catalog
from gateway.books.state.sqlite.evidence import SqliteCatalog
from gateway.books.state.sqlite.files import SqliteFileCatalog
from gateway.config.policy import EvidencePolicy
from gateway.core.errors import GatewayError
from tests.books.evidence.support import FakeClock, fixture_bytes, make_tenant

PNG = fixture_bytes("tiny.png")
PNG_SHA = hashlib.sha256(PNG).hexdigest()
HTML = b"<!doctype html><script>alert(document.cookie)</script>"
ACME = "acme"
GLOBEX = "globex"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def opened(
    tmp_path: Path, clock: FakeClock, **policies: EvidencePolicy
) -> tuple[FileBook, SqliteFileCatalog]:
    """A book whose tenants have ``policies`` (the defaults otherwise)."""
    catalog = SqliteFileCatalog(tmp_path / "catalog.sqlite3")

    def policy_of(tenant: str) -> EvidencePolicy:
        return policies.get(tenant, EvidencePolicy())

    book = FileBook(file_store(tmp_path / "staging"), catalog, policy_of=policy_of, clock=clock)
    return book, catalog


@pytest.fixture
async def book(tmp_path: Path, clock: FakeClock) -> AsyncIterator[FileBook]:
    made, catalog = opened(tmp_path, clock)
    yield made
    await catalog.close()


def blobs(book: FileBook) -> set[str]:
    return {p.name for p in book.store.directory.iterdir() if p.name != ".lock"}


async def not_found(work: Awaitable[object]) -> None:
    with pytest.raises(GatewayError) as info:
        await work
    assert info.value.code == "file_not_found"


async def content_of(book: FileBook, record: FileRecord) -> bytes:
    content = await book.open(record)
    try:
        await content.verify()
        return b"".join([piece async for piece in content.pieces()])
    finally:
        content.close()


async def test_put_keeps_the_bytes_under_a_sniffed_type_and_a_random_id(
    book: FileBook, clock: FakeClock
) -> None:
    record = await book.put(ACME, HTML, "../../etc/report.png")
    assert FILE_ID.fullmatch(record.id)
    # The model called it a PNG: the bytes say text, and text it is served as.
    assert (record.mime_type, record.ext, record.name) == ("text/plain", "txt", "report.png")
    assert (record.tenant, record.bytes, record.created) == ("acme", len(HTML), int(clock.now))
    assert record.sha256 == hashlib.sha256(HTML).hexdigest()
    assert await book.get(ACME, record.id) == record
    assert await book.read(record) == HTML
    assert await content_of(book, record) == HTML
    blob = book.store.directory / f"{record.sha256}.txt"
    assert blobs(book) == {blob.name}
    # Never world-readable, never writable (spec §24).
    assert stat.S_IMODE(blob.stat().st_mode) == 0o440
    assert record.to_event() == {
        "id": record.id,
        "name": "report.png",
        "bytes": len(HTML),
        "sha256": record.sha256,
        "mime_type": "text/plain",
    }


@pytest.mark.parametrize(
    ("name", "shown"),
    [("a\x00b\nc.txt", "a_b_c.txt"), ("..", "file"), ("", "file"), ("dir\\x.csv", "x.csv")],
)
async def test_a_name_is_only_ever_a_plain_file_name(book: FileBook, name: str, shown: str) -> None:
    assert (await book.put(ACME, b"x", name)).name == shown
    assert len((await book.put(ACME, b"x", "n" * 1000)).name) == 255


async def test_content_comes_in_bounded_pieces(book: FileBook) -> None:
    data = os.urandom(2 * PIECE + 17)
    record = await book.put(ACME, data, "blob.bin")
    assert record.mime_type == "application/octet-stream"
    content = await book.open(record)
    try:
        sizes = [len(piece) async for piece in content.pieces()]
    finally:
        content.close()
    assert sizes == [PIECE, PIECE, 17]


async def test_another_tenants_id_is_an_unknown_one_both_ways(book: FileBook) -> None:
    mine = await book.put(ACME, PNG, "a.png")
    theirs = await book.put(GLOBEX, HTML, "b.html")
    for tenant, foreign in ((GLOBEX, mine.id), (ACME, theirs.id)):
        await not_found(book.get(tenant, foreign))
        await not_found(book.delete(tenant, foreign))
    for malformed in ("file_x", "", "ev_" + "a" * 26, mine.id.upper(), mine.id + "0"):
        await not_found(book.get(ACME, malformed))
        await not_found(book.delete(ACME, malformed))
    assert await book.get(ACME, mine.id) == mine
    assert await book.get(GLOBEX, theirs.id) == theirs


async def test_identical_bytes_one_blob_until_the_last_record_goes(book: FileBook) -> None:
    first = await book.put(ACME, PNG, "a.png")
    second = await book.put(GLOBEX, PNG, "b.png")
    assert first.id != second.id and first.mime_type == "image/png"
    assert blobs(book) == {f"{PNG_SHA}.png"}
    assert await book.delete(ACME, first.id) == first
    await not_found(book.get(ACME, first.id))
    assert blobs(book) == {f"{PNG_SHA}.png"}  # globex still names it
    assert await book.read(second) == PNG
    await book.delete(GLOBEX, second.id)
    assert blobs(book) == set()
    await not_found(book.delete(GLOBEX, second.id))


async def test_a_download_under_way_outlives_a_delete(book: FileBook) -> None:
    data = os.urandom(3 * PIECE)
    record = await book.put(ACME, data, "big.bin")
    content = await book.open(record)
    try:
        pieces = content.pieces()
        first = await anext(pieces)
        await book.delete(ACME, record.id)
        assert blobs(book) == set()
        rest = [piece async for piece in pieces]
    finally:
        content.close()
    assert first + b"".join(rest) == data
    # A lookup made before the delete finds no blob to open afterwards.
    await not_found(book.open(record))


async def test_a_changed_blob_fails_its_digest_check_before_a_byte_is_served(
    book: FileBook,
) -> None:
    record = await book.put(ACME, b"hello, world\n", "a.txt")
    blob = book.store.directory / f"{record.sha256}.txt"
    blob.chmod(0o640)
    blob.write_bytes(b"HELLO, WORLD\n")
    content = await book.open(record)
    try:
        with pytest.raises(GatewayError) as info:
            await content.verify()
    finally:
        content.close()
    assert info.value.code == "storage_error"
    with pytest.raises(GatewayError):
        await book.read(record)


async def test_past_the_tenants_ttl_files_are_invisible_then_forgotten(
    tmp_path: Path, clock: FakeClock
) -> None:
    book, catalog = opened(tmp_path, clock, acme=EvidencePolicy(ttl_s=60))
    brief = ACME
    try:
        old = await book.put(brief, PNG, "old.png")
        clock.advance(30)
        new = await book.put(brief, HTML, "new.html")
        assert await book.expire(brief) == 0
        clock.advance(31)
        await not_found(book.get(brief, old.id))
        assert await book.get(brief, new.id) == new
        assert await book.expire(brief) == 1
        assert blobs(book) == {f"{new.sha256}.txt"}
        assert await book.expire(GLOBEX) == 0  # ttl 0: kept until deleted
    finally:
        await catalog.close()


async def test_past_the_tenants_bound_its_oldest_files_go_with_their_blobs(
    tmp_path: Path, clock: FakeClock
) -> None:
    book, catalog = opened(tmp_path, clock, acme=EvidencePolicy(max_records=2, max_bytes=1000))
    small = ACME
    try:
        made = []
        for text in (b"one", b"two", b"three"):
            clock.advance(1)
            made.append(await book.put(small, text, "n.txt"))
        await not_found(book.get(small, made[0].id))
        assert [await book.get(small, r.id) for r in made[1:]] == made[1:]
        assert blobs(book) == {f"{r.sha256}.txt" for r in made[1:]}
        with pytest.raises(GatewayError) as info:
            await book.put(small, b"x" * 1001, "too-big.txt")
        assert info.value.code == "evidence_quota_exceeded"
        assert blobs(book) == {f"{r.sha256}.txt" for r in made[1:]}
    finally:
        await catalog.close()


async def test_the_sweep_removes_unnamed_blobs_and_only_stale_temps(
    book: FileBook, clock: FakeClock
) -> None:
    kept = await book.put(ACME, PNG, "a.png")
    directory = book.store.directory
    # A crash between the blob's rename and its record's insert.
    orphan = book.store.put(HTML, _Txt())
    fresh = directory / f"{TEMP_PREFIX}fresh"
    stale = directory / f"{TEMP_PREFIX}stale"
    for temp in (fresh, stale):
        temp.write_bytes(b"half")
    os.utime(stale, (1, 1))
    assert await book.sweep() == 1
    assert blobs(book) == {f"{kept.sha256}.png", fresh.name}
    assert not orphan.path.exists()
    # At a one-replica start no put is under way: every temp is a crashed one.
    assert await book.sweep(at_start=True) == 0
    assert blobs(book) == {f"{kept.sha256}.png"}
    assert await book.read(kept) == PNG


class _Txt:
    ext = "txt"


async def test_evidence_and_files_never_take_each_others_blobs(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The same bytes uploaded as evidence and produced as a file: each book's
    deletes, expiry and sweeps leave the other's blob alone."""
    staging = tmp_path / "staging"
    evidence = EvidenceService(EvidenceStore(staging), SqliteCatalog(Catalog(tmp_path / "e.db")))
    files_catalog = SqliteFileCatalog(tmp_path / "e.db")
    book = FileBook(file_store(staging), files_catalog, clock=clock)
    tenant = make_tenant(ACME)
    try:
        uploaded = await evidence.upload(tenant, PNG, "image/png", None)
        produced = await book.put(ACME, PNG, "same.png")
        evidence_blob = staging / f"{PNG_SHA}.png"
        file_blob = book.store.directory / f"{PNG_SHA}.png"
        assert evidence_blob.exists() and file_blob.exists()
        # The evidence store's sweeps list only its own directory.
        assert evidence.store.files() == [(PNG_SHA, "png")]
        await evidence.delete(tenant, uploaded.id)
        await evidence.recover()
        assert not evidence_blob.exists()
        assert await book.read(produced) == PNG
        again = await evidence.upload(tenant, PNG, "image/png", None)
        await book.delete(ACME, produced.id)
        assert await book.sweep(at_start=True) == 0
        assert not file_blob.exists()
        assert await evidence.read_bytes(again) == PNG
    finally:
        await evidence.close()
        await files_catalog.close()
