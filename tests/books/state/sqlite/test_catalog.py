from __future__ import annotations

import dataclasses
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from gateway.books.evidence.records import (
    EvidenceRecord,
    StorageFull,
    is_evidence_id,
    new_evidence_id,
)
from gateway.books.state.sqlite.catalog import Catalog
from gateway.core.errors import GatewayError
from tests.books.evidence.support import FakeClock

SHA_A = "a" * 64
SHA_B = "b" * 64
SHA_C = "c" * 64


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    with Catalog(tmp_path / "cat.sqlite3", clock=lambda: 1_700_000_000.7) as cat:
        yield cat


def add(catalog: Catalog, tenant: str = "acme", sha: str = SHA_A) -> EvidenceRecord:
    return catalog.add(
        tenant=tenant, sha256=sha, media_type="image/png", ext="png", size=82, locator_sha256=None
    )


def test_ids_are_unguessable_format() -> None:
    ids = {new_evidence_id() for _ in range(1000)}
    assert len(ids) == 1000
    for evidence_id in ids:
        assert is_evidence_id(evidence_id)
        assert len(evidence_id) == 3 + 26
    assert not is_evidence_id("ev_" + "A" * 26)
    assert not is_evidence_id("ev_1")


def test_add_get_round_trip(catalog: Catalog) -> None:
    record = add(catalog)
    assert record.created == 1_700_000_000
    assert catalog.get("acme", record.id) == record
    assert record.modality == "image"
    assert record.to_api() == {
        "id": record.id,
        "object": "evidence",
        "sha256": SHA_A,
        "media_type": "image/png",
        "bytes": 82,
        "created": 1_700_000_000,
        "locator_sha256": None,
    }


def test_tenant_isolation(catalog: Catalog) -> None:
    mine = add(catalog, "acme")
    theirs = add(catalog, "globex")
    assert catalog.get("globex", mine.id) is None
    assert catalog.get("acme", theirs.id) is None
    assert catalog.delete("globex", mine.id) is None
    assert catalog.delete("acme", theirs.id) is None
    assert catalog.get("acme", mine.id) == mine
    assert catalog.get("globex", theirs.id) == theirs
    assert catalog.get("acme", "nonsense'; DROP TABLE records; --") is None


def test_delete(catalog: Catalog) -> None:
    record = add(catalog)
    assert catalog.delete("acme", record.id) == record
    assert catalog.get("acme", record.id) is None
    assert catalog.delete("acme", record.id) is None
    assert not catalog.is_referenced(SHA_A)


def test_leases(catalog: Catalog) -> None:
    one, two = add(catalog, sha=SHA_A), add(catalog, sha=SHA_B)
    catalog.take_leases("req-1", [one, two, one])
    assert catalog.active_leases() == 2
    catalog.delete("acme", one.id)
    assert catalog.is_referenced(SHA_A)  # still leased
    assert catalog.release_leases("req-1") == [(SHA_A, "png"), (SHA_B, "png")]
    assert not catalog.is_referenced(SHA_A)
    assert catalog.is_referenced(SHA_B)  # still a record
    assert catalog.release_leases("req-1") == []
    assert catalog.active_leases() == 0


def test_take_leases_is_all_or_nothing(catalog: Catalog) -> None:
    kept, gone = add(catalog, sha=SHA_A), add(catalog, sha=SHA_B)
    catalog.delete("acme", gone.id)
    with pytest.raises(GatewayError) as info:
        catalog.take_leases("req-1", [kept, gone])
    assert info.value.code == "evidence_not_found"
    assert catalog.active_leases() == 0


def test_take_leases_checks_tenant(catalog: Catalog) -> None:
    record = add(catalog, "acme")
    forged = dataclasses.replace(record, tenant="globex")
    with pytest.raises(GatewayError):
        catalog.take_leases("req-1", [forged])


def test_clear_stale_leases(tmp_path: Path) -> None:
    path = tmp_path / "cat.sqlite3"
    with Catalog(path) as first:
        record = add(first)
        first.take_leases("req-1", [record])
    with Catalog(path) as second:
        assert second.active_leases() == 1
        assert second.clear_stale_leases() == 1
        assert second.active_leases() == 0
        assert second.get("acme", record.id) == record


def clocked(tmp_path: Path) -> tuple[Catalog, FakeClock]:
    clock = FakeClock()
    return Catalog(tmp_path / "cat.sqlite3", clock=clock), clock


def test_is_referenced_ignores_expired_leases(tmp_path: Path) -> None:
    catalog, clock = clocked(tmp_path)
    with catalog:
        record = add(catalog)
        catalog.take_leases("req-1", [record], ttl_s=10)
        catalog.delete("acme", record.id)
        assert catalog.is_referenced(SHA_A)  # the lease holds it
        clock.advance(9.9)
        assert catalog.is_referenced(SHA_A)
        clock.advance(0.1)  # at its expiry the lease holds nothing
        assert not catalog.is_referenced(SHA_A)


def test_a_record_is_referenced_whatever_its_leases(tmp_path: Path) -> None:
    catalog, clock = clocked(tmp_path)
    with catalog:
        record = add(catalog)
        catalog.take_leases("req-1", [record], ttl_s=1)
        clock.advance(5)
        assert catalog.is_referenced(SHA_A)  # the record still names it
        assert catalog.sweep_leases() == [(SHA_A, "png")]
        assert catalog.is_referenced(SHA_A)


def test_sweep_leases_drops_only_expired_ones_and_returns_their_files(tmp_path: Path) -> None:
    catalog, clock = clocked(tmp_path)
    with catalog:
        one, two, three = add(catalog, sha=SHA_A), add(catalog, sha=SHA_B), add(catalog, sha=SHA_C)
        catalog.take_leases("short", [one, two], ttl_s=10)
        catalog.take_leases("short-too", [one], ttl_s=10)
        catalog.take_leases("long", [two], ttl_s=100)
        catalog.take_leases("for-good", [three])  # no TTL: the CLI's, never expires
        assert catalog.sweep_leases() == []
        clock.advance(10)
        # distinct digests of the leases dropped, sorted
        assert catalog.sweep_leases() == [(SHA_A, "png"), (SHA_B, "png")]
        assert catalog.active_leases() == 2  # "long" and "for-good" stay
        assert catalog.release_leases("short") == []  # already swept
        assert catalog.sweep_leases() == []
        clock.advance(1_000_000)
        assert catalog.sweep_leases() == [(SHA_B, "png")]
        assert catalog.active_leases() == 1
        assert catalog.release_leases("for-good") == [(SHA_C, "png")]


def test_an_old_catalog_gains_lease_expiry(tmp_path: Path) -> None:
    """A catalog written before leases expired: its leases hold for good."""
    path = tmp_path / "cat.sqlite3"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(
            "CREATE TABLE leases (request_id TEXT NOT NULL, evidence_id TEXT NOT NULL, "
            "sha256 TEXT NOT NULL, ext TEXT NOT NULL, taken_at INTEGER NOT NULL, "
            "PRIMARY KEY (request_id, evidence_id))"
        )
        conn.execute(
            "INSERT INTO leases VALUES ('req-old', ?, ?, 'png', 1)", (new_evidence_id(), SHA_A)
        )
        conn.commit()
    clock = FakeClock()
    with Catalog(path, clock=clock) as catalog:
        clock.advance(10**9)
        assert catalog.is_referenced(SHA_A)
        assert catalog.sweep_leases() == []
        assert catalog.release_leases("req-old") == [(SHA_A, "png")]


def test_wal_mode(tmp_path: Path, catalog: Catalog) -> None:
    with closing(sqlite3.connect(tmp_path / "cat.sqlite3")) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_concurrent_writers(catalog: Catalog) -> None:
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for _ in range(20):
                record = add(catalog, f"t{n}")
                catalog.take_leases(f"req-{n}", [record])
                assert catalog.get(f"t{n}", record.id) == record
            catalog.release_leases(f"req-{n}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert catalog.active_leases() == 0


def test_closed_catalog_is_state_unavailable(tmp_path: Path) -> None:
    catalog = Catalog(tmp_path / "cat.sqlite3")
    catalog.close()
    catalog.close()
    with pytest.raises(GatewayError) as info:
        catalog.get("acme", new_evidence_id())
    assert info.value.code == "state_unavailable"
    assert info.value.status == 503


def test_unopenable_catalog_is_state_unavailable(tmp_path: Path) -> None:
    (tmp_path / "dir.sqlite3").mkdir()
    with pytest.raises(GatewayError) as info:
        Catalog(tmp_path / "dir.sqlite3")
    assert info.value.code == "state_unavailable"
    assert str(tmp_path) not in info.value.message


class _FullVolume:
    """A connection whose ``failing`` statement fails as SQLite does on a full volume."""

    def __init__(self, real: sqlite3.Connection, failing: str) -> None:
        self.real = real
        self.failing = failing

    def _check(self, sql: str) -> None:
        if sql.startswith(self.failing):
            exc = sqlite3.OperationalError("database or disk is full")
            exc.sqlite_errorcode = sqlite3.SQLITE_FULL
            raise exc

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        self._check(sql)
        return self.real.execute(sql, *args)

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        self._check(sql)
        return self.real.executemany(sql, rows)


@pytest.mark.parametrize("failing", ["BEGIN IMMEDIATE", "INSERT INTO records"])
def test_a_full_volume_is_storage_full_whichever_statement_hits_it(
    catalog: Catalog, failing: str
) -> None:
    real = catalog._conn
    assert real is not None
    catalog._conn = _FullVolume(real, failing)  # type: ignore[assignment]
    try:
        with pytest.raises(StorageFull) as info:
            catalog.add(
                tenant="acme",
                sha256=SHA_A,
                media_type="image/png",
                ext="png",
                size=3,
                locator_sha256=None,
            )
    finally:
        catalog._conn = real
    assert info.value.code == "state_unavailable"  # spec §17: never a 500
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    assert catalog.usage("acme") == (0, 0)
