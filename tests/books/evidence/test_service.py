"""EvidenceService on the SQLite backend (spec §5, §13, §17); the factory on both."""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from gateway.books.evidence import sniff
from gateway.books.evidence.records import EvidenceRecord
from gateway.books.evidence.service import RESERVE_BYTES, EvidenceService
from gateway.books.evidence.store import EvidenceStore
from gateway.books.state.factory import evidence_lease_s, evidence_service, open_state
from gateway.books.state.sqlite.catalog import Catalog
from gateway.books.state.sqlite.evidence import SqliteCatalog
from gateway.config import GatewayConfig
from gateway.config.policy import EvidencePolicy, Tenant
from gateway.core.errors import GatewayError
from tests.books.evidence.support import REPO_ROOT, FakeClock, fixture_bytes, make_tenant
from tests.support.tmpfs import fill, free, small_fs

PNG = fixture_bytes("tiny.png")
WAV = fixture_bytes("tiny.wav")
MP4 = fixture_bytes("tiny.mp4")
PNG_SHA = hashlib.sha256(PNG).hexdigest()
WAV_SHA = hashlib.sha256(WAV).hexdigest()

ACME = make_tenant("acme")
GLOBEX = make_tenant("globex")
ROUTE = "/srv/mosaic-models/" + "0" * 64


def sqlite_service(root: Path, **kwargs: Any) -> EvidenceService:
    return EvidenceService(
        EvidenceStore(root / "ev"), SqliteCatalog(Catalog(root / "cat.sqlite3")), **kwargs
    )


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[EvidenceService]:
    svc = sqlite_service(tmp_path)
    yield svc
    await svc.close()


def stored_names(svc: EvidenceService) -> set[str]:
    return {p.name for p in svc.store.directory.iterdir() if p.name != ".lock"}


def code_of(info: pytest.ExceptionInfo[GatewayError]) -> str:
    return info.value.code


async def test_upload_records_digest(service: EvidenceService) -> None:
    record = await service.upload(ACME, PNG, "image/png", "s3://bucket/scan 1.png")
    assert record.sha256 == PNG_SHA
    assert record.media_type == "image/png"
    assert record.bytes == len(PNG)
    assert record.tenant == "acme"
    assert record.locator_sha256 == hashlib.sha256(b"s3://bucket/scan 1.png").hexdigest()
    assert await service.get(ACME, record.id) == record
    assert await service.read_bytes(record) == PNG
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
    ids=["wav", "mp4", "png"],
)
async def test_cli_path_sniffs_type(
    service: EvidenceService, data: bytes, media_type: str, ext: str
) -> None:
    record = await service.upload(ACME, data, None, None)
    assert (record.media_type, record.ext, record.locator_sha256) == (media_type, ext, None)


async def test_unknown_bytes_refused(service: EvidenceService) -> None:
    with pytest.raises(GatewayError) as info:
        await service.upload(ACME, b"plain text, not media", None, None)
    assert code_of(info) == "unsupported_media_type"
    assert stored_names(service) == set()


async def test_mismatched_bytes_are_415_and_store_nothing(service: EvidenceService) -> None:
    with pytest.raises(GatewayError) as info:
        await service.upload(ACME, PNG, "audio/wav", None)
    assert code_of(info) == "unsupported_media_type"
    assert info.value.status == 415
    assert stored_names(service) == set()
    assert not await service.catalog.is_referenced(PNG_SHA)


async def test_modality_not_allowed(service: EvidenceService) -> None:
    text_only = make_tenant("acme", modalities=["text", "image"])
    with pytest.raises(GatewayError) as info:
        await service.upload(text_only, WAV, "audio/wav", None)
    assert code_of(info) == "modality_not_allowed"
    assert stored_names(service) == set()


async def test_size_limit(service: EvidenceService) -> None:
    small = make_tenant("acme", max_media_bytes=len(PNG) - 1)
    with pytest.raises(GatewayError) as info:
        await service.upload(small, PNG, "image/png", None)
    assert code_of(info) == "body_too_large"
    assert info.value.status == 413
    assert stored_names(service) == set()
    exact = make_tenant("acme", max_media_bytes=len(PNG))
    assert (await service.upload(exact, PNG, "image/png", None)).bytes == len(PNG)


@pytest.mark.parametrize("locator", ["", "x" * 1025, "line\nbreak", "tab\there", "nul\x00"])
async def test_bad_locator(service: EvidenceService, locator: str) -> None:
    with pytest.raises(GatewayError) as info:
        await service.upload(ACME, PNG, "image/png", locator)
    assert code_of(info) == "invalid_request"
    assert locator not in info.value.message or locator == ""
    assert stored_names(service) == set()


async def test_locator_limits_accepted(service: EvidenceService) -> None:
    record = await service.upload(ACME, PNG, "image/png", "é" * 1024)
    assert record.locator_sha256 == hashlib.sha256(("é" * 1024).encode()).hexdigest()


async def test_tenant_isolation_both_ways(service: EvidenceService) -> None:
    mine = await service.upload(ACME, PNG, "image/png", None)
    theirs = await service.upload(GLOBEX, WAV, "audio/wav", None)
    calls: list[Callable[[Tenant, str], Awaitable[EvidenceRecord]]] = [
        service.get,
        service.delete,
    ]
    for tenant, foreign in ((GLOBEX, mine.id), (ACME, theirs.id)):
        for call in calls:
            with pytest.raises(GatewayError) as info:
                await call(tenant, foreign)
            assert code_of(info) == "evidence_not_found"
        with pytest.raises(GatewayError) as info:
            await service.lease("req-x", tenant, [foreign])
        assert code_of(info) == "evidence_not_found"
    assert await service.get(ACME, mine.id) == mine
    assert await service.get(GLOBEX, theirs.id) == theirs
    assert await service.active_leases() == 0


async def test_identical_bytes_one_file_two_records(service: EvidenceService) -> None:
    first = await service.upload(ACME, PNG, "image/png", None)
    second = await service.upload(GLOBEX, PNG, "image/png; x=1", None)
    assert first.id != second.id
    assert stored_names(service) == {f"{PNG_SHA}.png"}
    await service.delete(ACME, first.id)
    assert stored_names(service) == {f"{PNG_SHA}.png"}  # GLOBEX still holds it
    assert await service.read_bytes(second) == PNG
    await service.delete(GLOBEX, second.id)
    assert stored_names(service) == set()


@pytest.mark.parametrize("instances", [1, 2], ids=["one_service", "two_services_one_dir"])
@pytest.mark.parametrize("locators", [False, True], ids=["same_locator", "own_locators"])
async def test_concurrent_identical_uploads(tmp_path: Path, locators: bool, instances: int) -> None:
    """Two instances are two processes' worth of exclusion: each has its own
    asyncio lock, so only the flock on ``<dir>/.lock`` keeps them apart."""
    count = 8
    services = [sqlite_service(tmp_path) for _ in range(instances)]
    try:
        async with asyncio.timeout(30):
            records = await asyncio.gather(
                *(
                    services[n % instances].upload(
                        ACME, PNG, "image/png", f"scan-{n}" if locators else None
                    )
                    for n in range(count)
                )
            )
        # The same bytes under the same locator are one record (spec §13); under
        # their own locators, one record each -- and always one file.
        ids = {r.id for r in records}
        assert len(ids) == (count if locators else 1)
        for svc in services:
            assert await svc.usage(ACME) == (len(ids), len(ids) * len(PNG))
        assert stored_names(services[0]) == {f"{PNG_SHA}.png"}
        assert not [p for p in (tmp_path / "ev").iterdir() if p.name.startswith(".tmp-")]
    finally:
        for svc in services:
            await svc.close()


async def test_an_upload_racing_a_delete_of_the_same_bytes_keeps_its_file(
    service: EvidenceService,
) -> None:
    for n in range(20):
        old = await service.upload(ACME, PNG, "image/png", f"old-{n}")
        _, new = await asyncio.gather(
            service.delete(ACME, old.id), service.upload(ACME, PNG, "image/png", f"new-{n}")
        )
        assert await service.read_bytes(new) == PNG, f"round {n}"
        await service.delete(ACME, new.id)
        assert stored_names(service) == set()


async def test_a_lease_racing_a_delete_either_fails_or_keeps_the_file(
    service: EvidenceService,
) -> None:
    for n in range(20):
        record = await service.upload(ACME, PNG, "image/png", f"r{n}")
        deleted, leased = await asyncio.gather(
            service.delete(ACME, record.id),
            service.lease(f"req-{n}", ACME, [record.id]),
            return_exceptions=True,
        )
        assert deleted == record
        if isinstance(leased, GatewayError):
            assert leased.code == "evidence_not_found"
            assert stored_names(service) == set()
        else:
            assert leased == [record]
            assert await service.read_bytes(record) == PNG  # the lease holds it
            await service.release(f"req-{n}")
            assert stored_names(service) == set()
    assert await service.active_leases() == 0


async def test_delete_while_leased_keeps_file_until_release(service: EvidenceService) -> None:
    record = await service.upload(ACME, PNG, "image/png", None)
    assert await service.lease("req-1", ACME, [record.id]) == [record]
    assert await service.active_leases() == 1
    await service.delete(ACME, record.id)
    with pytest.raises(GatewayError):
        await service.get(ACME, record.id)  # forgotten at once
    assert await service.read_bytes(record) == PNG  # the leased request can still read it
    await service.release("req-1")
    assert stored_names(service) == set()
    assert await service.active_leases() == 0
    await service.release("req-1")  # idempotent
    assert await service.active_leases() == 0


async def test_lease_all_or_nothing(service: EvidenceService) -> None:
    good = await service.upload(ACME, PNG, "image/png", None)
    with pytest.raises(GatewayError) as info:
        await service.lease("req-1", ACME, [good.id, "ev_" + "a" * 26])
    assert code_of(info) == "evidence_not_found"
    assert await service.active_leases() == 0


async def test_lease_keeps_order_and_duplicates(service: EvidenceService) -> None:
    png = await service.upload(ACME, PNG, "image/png", None)
    wav = await service.upload(ACME, WAV, "audio/wav", None)
    assert await service.lease("req-1", ACME, [wav.id, png.id, wav.id]) == [wav, png, wav]
    assert await service.active_leases() == 2
    assert await service.lease("req-2", ACME, []) == []
    await service.release("req-1")
    assert await service.active_leases() == 0


async def test_lease_count_reaches_the_callback(tmp_path: Path) -> None:
    seen: list[int] = []
    svc = sqlite_service(tmp_path, on_leases_change=seen.append)
    try:
        png = await svc.upload(ACME, PNG, "image/png", None)
        wav = await svc.upload(ACME, WAV, "audio/wav", None)
        await svc.lease("req-1", ACME, [png.id, wav.id, png.id])
        await svc.lease("req-2", ACME, [wav.id])
        await svc.release("req-1")
        await svc.release("req-1")  # nothing held: no call
        await svc.release("req-2")
        assert seen == [2, 3, 1, 0]
    finally:
        await svc.close()


async def test_lease_checks_modality_at_use(service: EvidenceService) -> None:
    record = await service.upload(ACME, WAV, "audio/wav", None)
    narrowed = make_tenant("acme", modalities=["text", "image"])
    with pytest.raises(GatewayError) as info:
        await service.lease("req-1", narrowed, [record.id])
    assert code_of(info) == "modality_not_allowed"
    assert await service.active_leases() == 0


async def test_quota_counts_records_and_bytes(service: EvidenceService) -> None:
    capped = make_tenant("acme", evidence=EvidencePolicy(max_records=2))
    first = await service.upload(capped, PNG, "image/png", "a")
    second = await service.upload(capped, WAV, "audio/wav", None)
    with pytest.raises(GatewayError) as info:
        await service.upload(capped, MP4, "video/mp4", None)
    assert code_of(info) == "evidence_quota_exceeded"
    assert info.value.status == 403
    assert stored_names(service) == {f"{PNG_SHA}.png", f"{WAV_SHA}.wav"}
    # The same bytes under the same locator are the existing record: no new one.
    assert (await service.upload(capped, PNG, "image/png", "a")).id == first.id
    await service.delete(capped, second.id)
    await service.upload(capped, MP4, "video/mp4", None)
    assert await service.usage(capped) == (2, len(PNG) + len(MP4))

    narrow = make_tenant("globex", evidence=EvidencePolicy(max_bytes=len(PNG) + len(WAV) - 1))
    await service.upload(narrow, PNG, "image/png", None)
    with pytest.raises(GatewayError) as info:
        await service.upload(narrow, WAV, "audio/wav", None)
    assert code_of(info) == "evidence_quota_exceeded"
    assert await service.usage(narrow) == (1, len(PNG))


async def test_quota_holds_under_concurrent_uploads(service: EvidenceService) -> None:
    capped = make_tenant("acme", evidence=EvidencePolicy(max_records=3))
    async with asyncio.timeout(30):
        results = await asyncio.gather(
            *(service.upload(capped, PNG, "image/png", f"loc-{n}") for n in range(12)),
            return_exceptions=True,
        )
    kept = [r for r in results if isinstance(r, EvidenceRecord)]
    refused = [r for r in results if isinstance(r, GatewayError)]
    assert len(kept) == 3
    assert len(refused) == 9
    assert {e.code for e in refused} == {"evidence_quota_exceeded"}
    assert await service.usage(capped) == (3, 3 * len(PNG))


async def test_records_past_the_ttl_are_invisible_then_expired(tmp_path: Path) -> None:
    clock = FakeClock()
    svc = EvidenceService(
        EvidenceStore(tmp_path / "ev"),
        SqliteCatalog(Catalog(tmp_path / "cat.sqlite3", clock=clock)),
        clock=clock,
    )
    brief = make_tenant("acme", evidence=EvidencePolicy(ttl_s=60))
    try:
        old = await svc.upload(brief, PNG, "image/png", None)
        await svc.lease("req-1", brief, [old.id])
        clock.advance(30)
        fresh = await svc.upload(brief, WAV, "audio/wav", None)
        clock.advance(31)  # old is 61 s old, past the TTL; fresh is 31 s old
        with pytest.raises(GatewayError) as info:
            await svc.get(brief, old.id)
        assert code_of(info) == "evidence_not_found"
        assert (await svc.page(brief, 10, None))[0] == [fresh]
        assert await svc.usage(brief) == (1, len(WAV))
        # An upload of the expired bytes is a new record, not the invisible one.
        again = await svc.upload(brief, PNG, "image/png", None)
        assert again.id != old.id
        await svc.delete(brief, again.id)
        assert await svc.expire(brief) == 1
        assert await svc.expire(brief) == 0
        assert await svc.read_bytes(old) == PNG  # the lease still holds the file
        await svc.release("req-1")
        assert stored_names(svc) == {f"{WAV_SHA}.wav"}
        assert await svc.expire(ACME) == 0  # no TTL: nothing is ever expired
    finally:
        await svc.close()


async def test_sweep_drops_expired_leases_and_the_files_only_they_held(tmp_path: Path) -> None:
    clock = FakeClock()
    svc = EvidenceService(
        EvidenceStore(tmp_path / "ev"),
        SqliteCatalog(Catalog(tmp_path / "cat.sqlite3", clock=clock)),
        lease_ttl_s=100,
        clock=clock,
    )
    try:
        gone = await svc.upload(ACME, PNG, "image/png", None)
        kept = await svc.upload(ACME, WAV, "audio/wav", None)
        await svc.lease("crashed-request", ACME, [gone.id, kept.id])
        await svc.delete(ACME, gone.id)
        clock.advance(99.5)
        assert await svc.sweep() == 0
        assert stored_names(svc) == {f"{PNG_SHA}.png", f"{WAV_SHA}.wav"}
        clock.advance(0.5)  # at the expiry: the lease no longer holds
        assert await svc.sweep() == 2
        assert stored_names(svc) == {f"{WAV_SHA}.wav"}  # still a record's
        assert await svc.active_leases() == 0
        assert await svc.sweep() == 0
    finally:
        await svc.close()


async def test_read_back_detects_tampering(service: EvidenceService) -> None:
    record = await service.upload(ACME, PNG, "image/png", None)
    path = service.store.path_for(record.sha256, record.ext)
    path.chmod(path.stat().st_mode | stat.S_IWUSR)
    path.write_bytes(PNG[:-1] + b"\x00")
    with pytest.raises(GatewayError) as info:
        await service.read_bytes(record)
    assert code_of(info) == "storage_error"
    assert "/" not in info.value.message


async def test_crash_before_rename_leaves_no_record(
    service: EvidenceService, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(src: object, dst: object) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(GatewayError) as info:
        await service.upload(ACME, PNG, "image/png", None)
    assert code_of(info) == "storage_error"
    assert stored_names(service) == set()
    assert not await service.catalog.is_referenced(PNG_SHA)


async def test_disk_error_leaves_nothing(
    service: EvidenceService, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(GatewayError) as info:
        await service.upload(ACME, WAV, "audio/wav", None)
    assert code_of(info) == "state_unavailable"  # a full volume, never a 500 (spec §24)
    assert isinstance(info.value.__cause__, OSError)
    monkeypatch.undo()
    assert stored_names(service) == set()
    assert not await service.catalog.is_referenced(WAV_SHA)


class _RefusingAdd(SqliteCatalog):
    """A catalog that refuses the insert, as a store that went away would."""

    async def add(self, *args: Any, **kwargs: Any) -> EvidenceRecord:
        raise GatewayError("state_unavailable")


async def test_a_catalog_failure_is_state_unavailable_and_keeps_no_file(tmp_path: Path) -> None:
    svc = EvidenceService(
        EvidenceStore(tmp_path / "ev"), _RefusingAdd(Catalog(tmp_path / "cat.sqlite3"))
    )
    try:
        with pytest.raises(GatewayError) as info:
            await svc.upload(ACME, PNG, "image/png", None)
        assert code_of(info) == "state_unavailable"
        assert info.value.status == 503
        # The file was renamed into place before the insert failed: removed again.
        assert stored_names(svc) == set()
        assert await svc.usage(ACME) == (0, 0)
    finally:
        await svc.close()


class _StoreDown(SqliteCatalog):
    """A catalog whose store went away at the insert (its COMMIT lost) and
    answers nothing until ``up`` is set again."""

    up = True

    async def add(self, *args: Any, **kwargs: Any) -> EvidenceRecord:
        self.up = False
        raise GatewayError("state_unavailable")

    async def is_referenced(self, sha256: str) -> bool:
        if not self.up:
            raise GatewayError("state_unavailable")
        return await super().is_referenced(sha256)

    async def referenced(self, sha256s: Sequence[str]) -> set[str]:
        if not self.up:
            raise GatewayError("state_unavailable")
        return await super().referenced(sha256s)


async def test_the_periodic_sweep_removes_a_file_an_outage_left_unnamed(tmp_path: Path) -> None:
    """The store is lost at the insert and cannot say whether anything names the
    file either: the upload is 503 ``state_unavailable`` (the insert's own
    error), the file stays, and the periodic sweep removes it once the store
    answers; a file a record names stays (spec §24)."""
    catalog = _StoreDown(Catalog(tmp_path / "cat.sqlite3"))
    svc = EvidenceService(EvidenceStore(tmp_path / "ev"), catalog)
    try:
        named = await sqlite_service(tmp_path).upload(ACME, WAV, "audio/wav", None)
        with pytest.raises(GatewayError) as info:
            await svc.upload(ACME, PNG, "image/png", None)
        assert (code_of(info), info.value.status) == ("state_unavailable", 503)
        assert stored_names(svc) == {f"{PNG_SHA}.png", f"{named.sha256}.wav"}
        assert await svc.sweep_staged() == 0  # the store is still down: nothing is guessed
        assert f"{PNG_SHA}.png" in stored_names(svc)
        catalog.up = True
        assert await svc.sweep_staged() == 1
        assert stored_names(svc) == {f"{named.sha256}.wav"}
        assert await svc.read_bytes(named) == WAV
    finally:
        await svc.close()


async def test_the_periodic_sweep_keeps_a_file_an_upload_is_adding(tmp_path: Path) -> None:
    """A file renamed into place whose record is being inserted (the store's lock
    held) is not an orphan: the sweep waits for the lock and finds the record."""
    svc = sqlite_service(tmp_path)
    try:
        async with svc.store.locked():
            stored = svc.store.put(PNG, sniff.PNG)
            sweep = asyncio.create_task(svc.sweep_staged())
            # The sweep runs while the insert is in its thread: it must wait for the lock.
            await svc.catalog.add(
                tenant="acme",
                sha256=stored.sha256,
                media_type="image/png",
                ext="png",
                size=stored.bytes,
                locator_sha256=None,
            )
        assert await sweep == 0
        assert stored_names(svc) == {f"{PNG_SHA}.png"}
    finally:
        await svc.close()


async def test_a_closed_catalog_is_state_unavailable(service: EvidenceService) -> None:
    record = await service.upload(ACME, PNG, "image/png", None)
    await service.catalog.close()
    for work in (
        service.upload(ACME, WAV, "audio/wav", None),
        service.get(ACME, record.id),
        service.lease("req-1", ACME, [record.id]),
        service.delete(ACME, record.id),
    ):
        with pytest.raises(GatewayError) as info:
            await work
        assert code_of(info) == "state_unavailable"
    assert stored_names(service) == {f"{PNG_SHA}.png"}  # nothing removed blindly


_BLOCKED_WRITER = """
import asyncio, os, sys
from pathlib import Path
from gateway.books.evidence.service import EvidenceService
from gateway.books.evidence.store import EvidenceStore
from gateway.books.state.sqlite.catalog import Catalog
from gateway.books.state.sqlite.evidence import SqliteCatalog
from tests.books.evidence.support import make_tenant

root = Path(sys.argv[1])

def blocked_replace(src, dst):
    sys.stdout.write("between write and rename\\n")
    sys.stdout.flush()
    sys.stdin.read()  # never returns: the test kills us here

os.replace = blocked_replace

async def main():
    catalog = SqliteCatalog(Catalog(root / "cat.sqlite3"))
    service = EvidenceService(EvidenceStore(root / "ev"), catalog)
    data = Path(sys.argv[2]).read_bytes()
    await service.upload(make_tenant("acme"), data, "image/png", None)

asyncio.run(main())
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


async def test_recover_drops_stale_leases_temps_and_orphans(tmp_path: Path) -> None:
    store_dir = tmp_path / "ev"
    crashed = sqlite_service(tmp_path)
    kept = await crashed.upload(ACME, PNG, "image/png", None)
    leased = await crashed.upload(ACME, WAV, "audio/wav", None)
    await crashed.lease("req-1", ACME, [leased.id])
    await crashed.delete(ACME, leased.id)  # file held only by the lease
    orphan = crashed.store.put(MP4, sniff.MP4)  # renamed, never catalogued
    (store_dir / ".tmp-stale").write_bytes(b"partial")
    await crashed.close()

    restarted = sqlite_service(tmp_path)
    try:
        await restarted.recover()
        assert await restarted.active_leases() == 0
        assert stored_names(restarted) == {f"{kept.sha256}.png"}
        assert not orphan.path.exists()
        assert await restarted.read_bytes(kept) == PNG
    finally:
        await restarted.close()


async def test_shared_recover_keeps_a_temp_another_replica_may_be_writing(
    tmp_path: Path,
) -> None:
    store_dir = tmp_path / "ev"
    store_dir.mkdir()
    fresh, stale = store_dir / ".tmp-fresh", store_dir / ".tmp-stale"
    fresh.write_bytes(b"another replica's upload, under way")
    stale.write_bytes(b"a crashed writer's")
    hours_ago = time.time() - 2 * 3600
    os.utime(stale, (hours_ago, hours_ago))
    svc = sqlite_service(tmp_path, shared=True)
    try:
        await svc.recover()
        assert fresh.exists()
        assert not stale.exists()
    finally:
        await svc.close()


def gateway_config(tmp_path: Path, **state: Any) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "upstream": {"route": ROUTE, "total_timeout_s": 300},
            "staging": {
                "dir": str(tmp_path / "ev"),
                "catalog": str(tmp_path / "db" / "cat.sqlite3"),
            },
            "state": state,
        }
    )


async def test_factory_builds_the_sqlite_backend(tmp_path: Path) -> None:
    config = gateway_config(tmp_path)
    assert evidence_lease_s(config) == 310.0  # the longest request + 10 s
    state = open_state(config, {})
    assert not state.shared
    assert isinstance(state.catalog, SqliteCatalog)
    svc = evidence_service(config, state)
    try:
        await svc.recover()
        assert (tmp_path / "db" / "cat.sqlite3.reserve").stat().st_size == RESERVE_BYTES
        record = await svc.upload(ACME, PNG, "image/png", None)
        assert (tmp_path / "ev" / f"{record.sha256}.png").exists()
        before = time.time()
        await svc.lease("req-1", ACME, [record.id])
        after = time.time()
    finally:
        await state.close()
    with closing(sqlite3.connect(tmp_path / "db" / "cat.sqlite3")) as conn:
        (expires,) = conn.execute("SELECT expires FROM leases").fetchone()
    assert before + 310 <= expires <= after + 310


async def test_factory_builds_the_postgres_backend(tmp_path: Path, postgres_dsn: str) -> None:
    config = gateway_config(
        tmp_path, backend="postgres", dsn_env="TEST_STATE_DSN", timeout_ms=5000, replica_id="r-a"
    )
    from gateway.books.state.postgres.evidence import PgCatalog  # here: the driver loads lazily

    env = {"TEST_STATE_DSN": postgres_dsn}
    state, other = open_state(config, env), open_state(config, env)
    assert state.shared
    assert isinstance(state.catalog, PgCatalog)
    svc, peer = evidence_service(config, state), evidence_service(config, other)
    try:
        await svc.recover()
        assert not (tmp_path / "db" / "cat.sqlite3.reserve").exists()  # no SQLite to journal
        record = await svc.upload(ACME, PNG, "image/png", None)
        assert await peer.get(ACME, record.id) == record  # another replica sees it at once
        before = time.time()
        await peer.lease("req-1", ACME, [record.id])
        after = time.time()
    finally:
        await state.close()
        await other.close()
    conn = await asyncpg.connect(postgres_dsn, timeout=5)
    try:
        row = await conn.fetchrow("SELECT replica, expires FROM evidence_leases")
    finally:
        await conn.close()
    assert row is not None
    assert row["replica"] == "r-a"
    assert before + 310 <= row["expires"] <= after + 310


@pytest.mark.parametrize("value", [None, "mysql://user:s3cret@db.internal/x"])
def test_factory_names_a_missing_dsn_and_never_prints_it(tmp_path: Path, value: str | None) -> None:
    config = gateway_config(tmp_path, backend="postgres", dsn_env="TEST_STATE_DSN")
    env = {} if value is None else {"TEST_STATE_DSN": value}
    with pytest.raises(GatewayError) as info:
        open_state(config, env)
    assert info.value.code == "state_unavailable"
    assert "TEST_STATE_DSN" in info.value.message
    assert "s3cret" not in str(info.value)
    assert "db.internal" not in str(info.value)


async def test_delete_on_a_full_volume_uses_the_catalog_reserve(tmp_path: Path) -> None:
    """SQLite must journal even a delete; on a volume with no room for its WAL
    the reserve file next to the catalog is given up for it."""
    with small_fs(tmp_path / "vol", 4096) as vol:
        reserve = vol / "cat.sqlite3.reserve"
        catalog = Catalog(vol / "cat.sqlite3")
        svc = EvidenceService(EvidenceStore(vol / "ev"), SqliteCatalog(catalog), reserve=reserve)
        try:
            await svc.recover()
            assert reserve.stat().st_size == RESERVE_BYTES
            records = [await svc.upload(ACME, PNG, "image/png", f"r{i}") for i in range(3)]
            # An emptied WAL has to grow for the next write: no room left for it.
            with catalog._read() as conn:  # white-box: what a checkpoint leaves
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            fill(vol)
            for record in records:
                await svc.delete(ACME, record.id)
            assert await svc.usage(ACME) == (0, 0)
            assert not reserve.exists(), "the reserve was used"
            assert stored_names(svc) == set()
            free(vol)
            await svc.upload(ACME, WAV, "audio/wav", None)
            assert reserve.exists(), "made again once there is room"
        finally:
            await svc.close()


async def test_an_upload_is_never_answered_with_a_requests_inline_record(
    service: EvidenceService,
) -> None:
    """Inline data is staged as a record of its request only, forgotten when the
    request ends: an upload of the same bytes (no locator) meanwhile must get a
    record of its own, not the one about to be deleted under it."""
    payload = base64.b64encode(PNG).decode()
    inline = await service.upload_inline(ACME, payload, "image/png", "image")
    upload = service.begin_upload()
    upload.write(PNG)
    record, existed = await service.commit_upload(ACME, upload, "image/png", None)
    assert not existed and record.id != inline.id
    await service.delete(ACME, inline.id)  # the request's end (pipeline._after)
    assert await service.get(ACME, record.id) == record
    # And while the inline record lives, the same upload again answers with the upload's.
    again = await service.upload_inline(ACME, payload, "image/png", "image")
    assert (await service.upload(ACME, PNG, "image/png", None)).id == record.id
    await service.delete(ACME, again.id)
    assert stored_names(service) == {f"{PNG_SHA}.png"}


async def test_inline_data_must_match_its_part_kind(service: EvidenceService) -> None:
    with pytest.raises(GatewayError) as info:
        await service.upload_inline(ACME, base64.b64encode(WAV).decode(), None, "image")
    assert code_of(info) == "modality_not_allowed"
    with pytest.raises(GatewayError) as info:
        await service.upload_inline(ACME, "not base64!", None, "image")
    assert code_of(info) == "invalid_request"
    assert stored_names(service) == set()
