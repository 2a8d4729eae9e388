from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
from pathlib import Path

import pytest

from gateway.books.evidence.sniff import PNG, WAV
from gateway.books.evidence.store import EvidenceStore
from gateway.core.errors import GatewayError
from tests.books.evidence.support import fixture_bytes

DATA = fixture_bytes("tiny.png")
DIGEST = hashlib.sha256(DATA).hexdigest()


def names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir() if p.name != ".lock"}


def test_put_names_file_by_digest_read_only(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path / "ev")
    stored = store.put(DATA, PNG)
    assert (stored.sha256, stored.ext, stored.bytes) == (DIGEST, "png", len(DATA))
    assert stored.path == tmp_path / "ev" / f"{DIGEST}.png" == store.path_for(DIGEST, "png")
    assert stat.S_IMODE(stored.path.stat().st_mode) == 0o444
    assert store.read(DIGEST, "png") == DATA
    assert names(tmp_path / "ev") == {f"{DIGEST}.png"}
    assert store.files() == [(DIGEST, "png")]


def test_identical_bytes_stored_once(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    first = store.put(DATA, PNG)
    inode = first.path.stat().st_ino
    second = store.put(DATA, PNG)
    assert first == second
    assert first.path.stat().st_ino == inode
    assert names(tmp_path) == {f"{DIGEST}.png"}


def test_put_repairs_a_damaged_copy(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    path = store.put(DATA, PNG).path
    path.chmod(0o644)
    path.write_bytes(b"damaged")
    store.put(DATA, PNG)
    assert store.read(DIGEST, "png") == DATA
    assert stat.S_IMODE(path.stat().st_mode) == 0o444


def test_tampered_file_fails_digest_check(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    path = store.put(DATA, PNG).path
    path.chmod(path.stat().st_mode | stat.S_IWUSR)
    damaged = bytearray(DATA)
    damaged[-1] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with pytest.raises(GatewayError) as info:
        store.read(DIGEST, "png")
    assert info.value.code == "storage_error"
    assert str(tmp_path) not in info.value.message


def test_missing_file_is_storage_error(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    with pytest.raises(GatewayError) as info:
        store.read(DIGEST, "png")
    assert info.value.code == "storage_error"
    assert isinstance(info.value.__cause__, OSError)


@pytest.mark.parametrize(
    ("sha", "ext"),
    [("../" + DIGEST[3:], "png"), (DIGEST.upper(), "png"), (DIGEST, "exe"), (DIGEST[:-1], "png")],
)
def test_path_for_refuses_bad_names(tmp_path: Path, sha: str, ext: str) -> None:
    with pytest.raises(GatewayError) as info:
        EvidenceStore(tmp_path).path_for(sha, ext)
    assert info.value.code == "storage_error"


def test_remove(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    store.put(DATA, PNG)
    store.remove(DIGEST, "png")
    store.remove(DIGEST, "png")  # already gone: fine
    assert names(tmp_path) == set()


def _assert_clean_failure(store: EvidenceStore, tmp_path: Path) -> None:
    with pytest.raises(GatewayError) as info:
        store.put(DATA, PNG)
    assert info.value.code == "storage_error"
    assert isinstance(info.value.__cause__, OSError)
    assert str(tmp_path) not in info.value.message
    assert names(tmp_path) == set()


def test_crash_before_rename_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = EvidenceStore(tmp_path)

    def failing_replace(src: object, dst: object) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(os, "replace", failing_replace)
    _assert_clean_failure(store, tmp_path)


@pytest.mark.parametrize("call", ["write", "fsync", "fchmod"])
def test_disk_error_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    store = EvidenceStore(tmp_path)

    def disk_full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, call, disk_full)
    _assert_clean_failure(store, tmp_path)


def test_short_writes_are_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write

    def dribble(fd: int, data: bytes | memoryview) -> int:
        return real_write(fd, bytes(data[:7]))

    monkeypatch.setattr(os, "write", dribble)
    EvidenceStore(tmp_path).put(DATA, PNG)
    monkeypatch.undo()
    assert EvidenceStore(tmp_path).read(DIGEST, "png") == DATA


def test_sweep_temp(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    store.put(DATA, PNG)
    (tmp_path / ".tmp-abc123").write_bytes(b"partial")
    (tmp_path / ".tmp-def456").write_bytes(b"")
    assert store.sweep_temp() == 2
    assert names(tmp_path) == {f"{DIGEST}.png"}
    assert store.sweep_temp() == 0


def test_files_ignores_foreign_names(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    wav = fixture_bytes("tiny.wav")
    store.put(wav, WAV)
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / f"{DIGEST}.exe").write_text("x")
    assert store.files() == [(hashlib.sha256(wav).hexdigest(), "wav")]


def test_exclusive_is_reentrant_and_excludes_other_threads(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    entered, trying = threading.Event(), threading.Event()
    with store.exclusive(), store.exclusive():
        store.put(DATA, PNG)  # takes the lock again on this thread

        def contender() -> None:
            trying.set()
            with store.exclusive():
                entered.set()

        thread = threading.Thread(target=contender)
        thread.start()
        assert trying.wait(5)  # the contender is at the lock ...
        assert not entered.wait(0.2)  # ... and does not get past it while we hold it
    assert entered.wait(5)
    thread.join(5)


def test_unusable_directory_is_storage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(GatewayError) as info:
        EvidenceStore(blocker / "ev")
    assert info.value.code == "storage_error"
