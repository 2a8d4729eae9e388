from __future__ import annotations

import base64
import errno
import hashlib
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.books.evidence import sniff
from gateway.books.evidence.catalog import Catalog
from gateway.books.evidence.service import RESERVE_BYTES, EvidenceService
from gateway.books.evidence.store import EvidenceStore
from gateway.config import StagingConfig
from gateway.core.errors import GatewayError
from tests.books.evidence.support import REPO_ROOT, fixture_bytes, make_tenant
from tests.support.tmpfs import fill, free, small_fs

PNG = fixture_bytes("tiny.png")
WAV = fixture_bytes("tiny.wav")
MP4 = fixture_bytes("tiny.mp4")
PNG_SHA = hashlib.sha256(PNG).hexdigest()

ACME = make_tenant("acme")
GLOBEX = make_tenant("globex")


@pytest.fixture
def service(tmp_path: Path) -> Iterator[EvidenceService]:
    svc = EvidenceService(EvidenceStore(tmp_path / "ev"), Catalog(tmp_path / "cat.sqlite3"))
    yield svc
    svc.close()


def stored_names(svc: EvidenceService) -> set[str]:
    return {p.name for p in svc.store.directory.iterdir() if p.name != ".lock"}


def code_of(info: pytest.ExceptionInfo[GatewayError]) -> str:
    return info.value.code


def test_upload_records_digest(service: EvidenceService) -> None:
    record = service.upload(ACME, PNG, "image/png", "s3://bucket/scan 1.png")
    assert record.sha256 == PNG_SHA
    assert record.media_type == "image/png"
    assert record.bytes == len(PNG)
    assert record.tenant == "acme"
    assert record.locator_sha256 == hashlib.sha256(b"s3://bucket/scan 1.png").hexdigest()
    assert service.get(ACME, record.id) == record
    assert service.read_bytes(record) == PNG
    assert stored_names(service) == {f"{PNG_SHA}.png"}
    api = record.to_api()
    assert set(api) == {
        "id",
        "object",
        "sha256",
        "media_type",
        "bytes",
        "created",
        "locator_sha256",
    }


@pytest.mark.parametrize(
    ("data", "media_type", "ext"),
    [(WAV, "audio/wav", "wav"), (MP4, "video/mp4", "mp4"), (PNG, "image/png", "png")],
)
def test_cli_path_sniffs_type(
    service: EvidenceService, data: bytes, media_type: str, ext: str
) -> None:
    record = service.upload(ACME, data, None, None)
    assert (record.media_type, record.ext, record.locator_sha256) == (media_type, ext, None)


def test_unknown_bytes_refused(service: EvidenceService) -> None:
    with pytest.raises(GatewayError) as info:
        service.upload(ACME, b"plain text, not media", None, None)
    assert code_of(info) == "unsupported_media_type"
    assert stored_names(service) == set()


def test_mismatched_bytes_are_415_and_store_nothing(service: EvidenceService) -> None:
    with pytest.raises(GatewayError) as info:
        service.upload(ACME, PNG, "audio/wav", None)
    assert code_of(info) == "unsupported_media_type"
    assert info.value.status == 415
    assert stored_names(service) == set()
    assert not service.catalog.is_referenced(PNG_SHA)


def test_modality_not_allowed(service: EvidenceService) -> None:
    text_only = make_tenant("acme", modalities=["text", "image"])
    with pytest.raises(GatewayError) as info:
        service.upload(text_only, WAV, "audio/wav", None)
    assert code_of(info) == "modality_not_allowed"
    assert stored_names(service) == set()


def test_size_limit(service: EvidenceService) -> None:
    small = make_tenant("acme", max_media_bytes=len(PNG) - 1)
    with pytest.raises(GatewayError) as info:
        service.upload(small, PNG, "image/png", None)
    assert code_of(info) == "body_too_large"
    assert info.value.status == 413
    exact = make_tenant("acme", max_media_bytes=len(PNG))
    service.upload(exact, PNG, "image/png", None)


@pytest.mark.parametrize("locator", ["", "x" * 1025, "line\nbreak", "tab\there", "nul\x00"])
def test_bad_locator(service: EvidenceService, locator: str) -> None:
    with pytest.raises(GatewayError) as info:
        service.upload(ACME, PNG, "image/png", locator)
    assert code_of(info) == "invalid_request"
    assert locator not in info.value.message or locator == ""
    assert stored_names(service) == set()


def test_locator_limits_accepted(service: EvidenceService) -> None:
    record = service.upload(ACME, PNG, "image/png", "é" * 1024)
    assert record.locator_sha256 == hashlib.sha256(("é" * 1024).encode()).hexdigest()


def test_tenant_isolation_both_ways(service: EvidenceService) -> None:
    mine = service.upload(ACME, PNG, "image/png", None)
    theirs = service.upload(GLOBEX, WAV, "audio/wav", None)
    for tenant, foreign in ((GLOBEX, mine.id), (ACME, theirs.id)):
        for call in (service.get, service.delete):
            with pytest.raises(GatewayError) as info:
                call(tenant, foreign)
            assert code_of(info) == "evidence_not_found"
        with pytest.raises(GatewayError) as info:
            service.lease("req-x", tenant, [foreign])
        assert code_of(info) == "evidence_not_found"
    assert service.get(ACME, mine.id) == mine
    assert service.get(GLOBEX, theirs.id) == theirs
    assert service.active_leases() == 0


def test_identical_bytes_one_file_two_records(service: EvidenceService) -> None:
    first = service.upload(ACME, PNG, "image/png", None)
    second = service.upload(GLOBEX, PNG, "image/png; x=1", None)
    assert first.id != second.id
    assert stored_names(service) == {f"{PNG_SHA}.png"}
    service.delete(ACME, first.id)
    assert stored_names(service) == {f"{PNG_SHA}.png"}  # GLOBEX still holds it
    assert service.read_bytes(second) == PNG
    service.delete(GLOBEX, second.id)
    assert stored_names(service) == set()


@pytest.mark.parametrize("locators", [False, True], ids=["same_locator", "own_locators"])
def test_concurrent_identical_uploads(service: EvidenceService, locators: bool) -> None:
    count = 8
    barrier = threading.Barrier(count)
    records, errors = [], []

    def upload(n: int) -> None:
        try:
            barrier.wait(5)
            locator = f"scan-{n}" if locators else None
            records.append(service.upload(ACME, PNG, "image/png", locator))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=upload, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    # The same bytes under the same locator are one record (spec §13); under
    # their own locators, one record each -- and always one file.
    assert len({r.id for r in records}) == (count if locators else 1)
    assert service.catalog.usage("acme") == (
        len({r.id for r in records}),
        len({r.id for r in records}) * len(PNG),
    )
    assert stored_names(service) == {f"{PNG_SHA}.png"}


def test_delete_while_leased_keeps_file_until_release(service: EvidenceService) -> None:
    record = service.upload(ACME, PNG, "image/png", None)
    assert service.lease("req-1", ACME, [record.id]) == [record]
    assert service.active_leases() == 1
    service.delete(ACME, record.id)
    with pytest.raises(GatewayError):
        service.get(ACME, record.id)  # forgotten at once
    assert service.read_bytes(record) == PNG  # the leased request can still read it
    service.release("req-1")
    assert stored_names(service) == set()
    assert service.active_leases() == 0
    service.release("req-1")  # idempotent


def test_lease_all_or_nothing(service: EvidenceService) -> None:
    good = service.upload(ACME, PNG, "image/png", None)
    with pytest.raises(GatewayError) as info:
        service.lease("req-1", ACME, [good.id, "ev_" + "a" * 26])
    assert code_of(info) == "evidence_not_found"
    assert service.active_leases() == 0


def test_lease_keeps_order_and_duplicates(service: EvidenceService) -> None:
    png = service.upload(ACME, PNG, "image/png", None)
    wav = service.upload(ACME, WAV, "audio/wav", None)
    assert service.lease("req-1", ACME, [wav.id, png.id, wav.id]) == [wav, png, wav]
    assert service.lease("req-2", ACME, []) == []
    service.release("req-1")
    assert service.active_leases() == 0


def test_lease_checks_modality_at_use(service: EvidenceService) -> None:
    record = service.upload(ACME, WAV, "audio/wav", None)
    narrowed = make_tenant("acme", modalities=["text", "image"])
    with pytest.raises(GatewayError) as info:
        service.lease("req-1", narrowed, [record.id])
    assert code_of(info) == "modality_not_allowed"
    assert service.active_leases() == 0


def test_read_back_detects_tampering(service: EvidenceService) -> None:
    record = service.upload(ACME, PNG, "image/png", None)
    path = service.store.path_for(record.sha256, record.ext)
    path.chmod(path.stat().st_mode | stat.S_IWUSR)
    path.write_bytes(PNG[:-1] + b"\x00")
    with pytest.raises(GatewayError) as info:
        service.read_bytes(record)
    assert code_of(info) == "storage_error"
    assert "/" not in info.value.message


def test_crash_before_rename_leaves_no_record(
    service: EvidenceService, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(src: object, dst: object) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(GatewayError) as info:
        service.upload(ACME, PNG, "image/png", None)
    assert code_of(info) == "storage_error"
    assert stored_names(service) == set()
    assert not service.catalog.is_referenced(PNG_SHA)


def test_disk_error_leaves_nothing(
    service: EvidenceService, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(GatewayError) as info:
        service.upload(ACME, WAV, "audio/wav", None)
    assert code_of(info) == "storage_error"
    assert isinstance(info.value.__cause__, OSError)
    monkeypatch.undo()
    assert stored_names(service) == set()
    assert not service.catalog.is_referenced(hashlib.sha256(WAV).hexdigest())


_BLOCKED_WRITER = """
import os, sys
from pathlib import Path
from gateway.books.evidence import Catalog, EvidenceService, EvidenceStore
from tests.books.evidence.support import make_tenant

root = Path(sys.argv[1])

def blocked_replace(src, dst):
    sys.stdout.write("between write and rename\\n")
    sys.stdout.flush()
    sys.stdin.read()  # never returns: the test kills us here

os.replace = blocked_replace
service = EvidenceService(EvidenceStore(root / "ev"), Catalog(root / "cat.sqlite3"))
service.upload(make_tenant("acme"), Path(sys.argv[2]).read_bytes(), "image/png", None)
"""


def test_killed_between_write_and_rename(tmp_path: Path) -> None:
    source = tmp_path / "upload.png"
    source.write_bytes(PNG)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    argv = [sys.executable, "-c", _BLOCKED_WRITER, str(tmp_path), str(source)]
    with subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT
    ) as proc:
        watchdog = threading.Timer(60, proc.kill)
        watchdog.start()
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "between write and rename\n"
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()

    evidence_dir = tmp_path / "ev"
    leftovers = {p.name for p in evidence_dir.iterdir() if p.name != ".lock"}
    assert len(leftovers) == 1
    assert next(iter(leftovers)).startswith(".tmp-")
    assert not (evidence_dir / f"{PNG_SHA}.png").exists()

    store = EvidenceStore(evidence_dir)
    with Catalog(tmp_path / "cat.sqlite3") as catalog:
        assert not catalog.is_referenced(PNG_SHA)
        assert store.sweep_temp() == 1
    assert {p.name for p in evidence_dir.iterdir() if p.name != ".lock"} == set()


def test_recover_drops_stale_leases_temps_and_orphans(tmp_path: Path) -> None:
    store_dir, db = tmp_path / "ev", tmp_path / "cat.sqlite3"
    with Catalog(db) as catalog:
        crashed = EvidenceService(EvidenceStore(store_dir), catalog)
        kept = crashed.upload(ACME, PNG, "image/png", None)
        leased = crashed.upload(ACME, WAV, "audio/wav", None)
        crashed.lease("req-1", ACME, [leased.id])
        crashed.delete(ACME, leased.id)  # file held only by the lease
        orphan = crashed.store.put(MP4, sniff.MP4)  # renamed, never catalogued
        (store_dir / ".tmp-stale").write_bytes(b"partial")

    restarted = EvidenceService(EvidenceStore(store_dir), Catalog(db))
    try:
        restarted.recover()
        assert restarted.active_leases() == 0
        assert stored_names(restarted) == {f"{kept.sha256}.png"}
        assert not orphan.path.exists()
        assert restarted.read_bytes(kept) == PNG
    finally:
        restarted.close()


def test_from_config(tmp_path: Path) -> None:
    staging = StagingConfig(dir=tmp_path / "ev", catalog=tmp_path / "db" / "cat.sqlite3")
    svc = EvidenceService.from_config(staging)
    try:
        record = svc.upload(ACME, PNG, "image/png", None)
        assert (tmp_path / "ev" / f"{record.sha256}.png").exists()
        assert (tmp_path / "db" / "cat.sqlite3").exists()
    finally:
        svc.close()


def test_delete_on_a_full_volume_uses_the_catalog_reserve(tmp_path: Path) -> None:
    """SQLite must journal even a delete; on a volume with no room for its WAL
    the reserve file next to the catalog is given up for it."""
    with small_fs(tmp_path / "vol", 4096) as vol:
        reserve = vol / "cat.sqlite3.reserve"
        svc = EvidenceService(
            EvidenceStore(vol / "ev"), Catalog(vol / "cat.sqlite3"), reserve=reserve
        )
        try:
            svc.recover()
            assert reserve.stat().st_size == RESERVE_BYTES
            records = [svc.upload(ACME, PNG, "image/png", f"r{i}") for i in range(3)]
            # An emptied WAL has to grow for the next write: no room left for it.
            with svc.catalog._read() as conn:  # white-box: what a checkpoint leaves
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            fill(vol)
            for record in records:
                svc.delete(ACME, record.id)
            assert svc.catalog.usage("acme") == (0, 0)
            assert not reserve.exists(), "the reserve was used"
            assert stored_names(svc) == set()
            free(vol)
            svc.upload(ACME, WAV, "audio/wav", None)
            assert reserve.exists(), "made again once there is room"
        finally:
            svc.close()


def test_an_upload_is_never_answered_with_a_requests_inline_record(
    service: EvidenceService,
) -> None:
    """Inline data is staged as a record of its request only, forgotten when the
    request ends: an upload of the same bytes (no locator) meanwhile must get a
    record of its own, not the one about to be deleted under it."""
    inline = service.upload_inline(ACME, base64.b64encode(PNG).decode(), "image/png", "image")
    commit = service.commit_upload
    upload = service.begin_upload()
    upload.write(PNG)
    record, existed = commit(ACME, upload, "image/png", None)
    assert not existed and record.id != inline.id
    service.delete(ACME, inline.id)  # the request's end (pipeline._after)
    assert service.get(ACME, record.id) == record
    # And while the inline record lives, the same upload again answers with the upload's.
    again = service.upload_inline(ACME, base64.b64encode(PNG).decode(), "image/png", "image")
    assert service.upload(ACME, PNG, "image/png", None).id == record.id
    service.delete(ACME, again.id)
