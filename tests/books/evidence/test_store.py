from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import stat
import sys
import time
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
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
    assert stat.S_IMODE(stored.path.stat().st_mode) == 0o440
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
    assert stat.S_IMODE(path.stat().st_mode) == 0o440


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


def _assert_clean_failure(
    store: EvidenceStore, tmp_path: Path, code: str = "storage_error"
) -> None:
    with pytest.raises(GatewayError) as info:
        store.put(DATA, PNG)
    assert info.value.code == code
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
def test_a_full_disk_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    store = EvidenceStore(tmp_path)

    def disk_full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, call, disk_full)
    # A full volume is the state's, never a 500 (spec §24), and noted until a write succeeds.
    _assert_clean_failure(store, tmp_path, "state_unavailable")
    assert store.volume.full
    monkeypatch.undo()
    store.put(DATA, PNG)
    assert not store.volume.full


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


_FLOCK_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
sys.stdout.write("held\\n")
sys.stdout.flush()
sys.stdin.readline()  # holds the lock until told to go (or killed)
"""

_FLOCK_PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    print("busy")
else:
    print("free")
"""


async def probe_lock(directory: Path) -> str:
    """What another process finds when it tries the store's lock without waiting."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _FLOCK_PROBE, str(directory / ".lock"), stdout=PIPE
    )
    out, _ = await asyncio.wait_for(child.communicate(), 30)
    assert child.returncode == 0
    return out.decode().strip()


@contextlib.asynccontextmanager
async def lock_held_by_child(directory: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """A child process holding the flock on ``<dir>/.lock`` until it is told to go."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _FLOCK_HOLDER, str(directory / ".lock"), stdin=PIPE, stdout=PIPE
    )
    try:
        assert child.stdout is not None
        assert await asyncio.wait_for(child.stdout.readline(), 30) == b"held\n"
        yield child
    finally:
        if child.returncode is None:
            child.kill()
        await asyncio.wait_for(child.wait(), 30)


async def test_locked_excludes_other_tasks(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    inside, most = 0, 0

    async def critical() -> None:
        nonlocal inside, most
        async with store.locked():
            inside += 1
            most = max(most, inside)
            for _ in range(5):
                await asyncio.sleep(0)  # give every other task its chance to barge in
            inside -= 1

    async with asyncio.timeout(30):
        await asyncio.gather(*(critical() for _ in range(10)))
    assert (most, inside) == (1, 0)


async def test_locked_holds_a_contender_until_released(tmp_path: Path) -> None:
    """Also a nested ``locked()`` of the holder's: it is not re-entrant."""
    store = EvidenceStore(tmp_path)
    order: list[str] = []

    async def contender() -> None:
        async with store.locked():
            order.append("contender in")

    async with store.locked():
        waiting = asyncio.create_task(contender())
        done, _ = await asyncio.wait({waiting}, timeout=0.2)
        assert not done
        order.append("holder out")
    await asyncio.wait_for(waiting, 10)
    assert order == ["holder out", "contender in"]


async def test_locked_is_released_when_its_body_raises(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    with pytest.raises(RuntimeError):
        async with store.locked():
            raise RuntimeError("the body failed")
    assert await probe_lock(tmp_path) == "free"
    async with asyncio.timeout(10), store.locked():
        assert await probe_lock(tmp_path) == "busy"


async def test_locked_excludes_another_process(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    assert await probe_lock(tmp_path) == "free"
    async with store.locked():
        assert await probe_lock(tmp_path) == "busy"
    assert await probe_lock(tmp_path) == "free"


@pytest.mark.parametrize("ending", ["exits", "is_killed"])
async def test_locked_waits_for_another_process_holding_the_lock(
    tmp_path: Path, ending: str
) -> None:
    store = EvidenceStore(tmp_path)
    entered = asyncio.Event()

    async def take() -> None:
        async with store.locked():
            entered.set()

    async with lock_held_by_child(tmp_path) as child:
        waiting = asyncio.create_task(take())
        done, _ = await asyncio.wait({waiting}, timeout=0.3)
        assert not done, "entered while another process held the lock"
        if ending == "exits":
            assert child.stdin is not None
            child.stdin.write(b"go\n")
            await child.stdin.drain()
        else:
            child.kill()  # the kernel drops a dead process's flock
        await asyncio.wait_for(waiting, 10)
        assert entered.is_set()
        assert await asyncio.wait_for(child.wait(), 10) == (0 if ending == "exits" else -9)


def _close_descriptors_of(path: Path) -> int:
    """Close this process's descriptors open on ``path`` (what a leak left); how many."""
    closed = 0
    for entry in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            if Path(os.readlink(entry)) == path:
                os.close(int(entry.name))
                closed += 1
    return closed


async def test_a_task_cancelled_while_waiting_for_the_lock_leaves_it_free(tmp_path: Path) -> None:
    """A request cancelled (caller gone) while it waits for the store's lock must
    not take the lock with it."""
    store = EvidenceStore(tmp_path)

    async def take() -> None:
        async with store.locked():
            pass

    try:
        async with lock_held_by_child(tmp_path) as child:
            waiting = asyncio.create_task(take())
            done, _ = await asyncio.wait({waiting}, timeout=0.3)
            assert not done
            waiting.cancel()
            assert child.stdin is not None
            child.stdin.write(b"go\n")
            await child.stdin.drain()
            await asyncio.wait_for(child.wait(), 10)
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(waiting, 10)
        assert await probe_lock(tmp_path) == "free"
    finally:
        # With the bug, a descriptor of ours still holds the flock: close it, so
        # nothing of this test outlives it.
        _close_descriptors_of(tmp_path / ".lock")


def test_sweep_temp_min_age_keeps_a_fresh_temp(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    store.put(DATA, PNG)
    fresh, old = tmp_path / ".tmp-fresh", tmp_path / ".tmp-old"
    fresh.write_bytes(b"an upload under way")
    old.write_bytes(b"a crashed writer's")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    assert store.sweep_temp(min_age_s=3600) == 1
    assert names(tmp_path) == {f"{DIGEST}.png", ".tmp-fresh"}
    assert store.sweep_temp(min_age_s=3600) == 0
    assert store.sweep_temp() == 1  # no minimum age: every temp goes (one replica's start)
    assert names(tmp_path) == {f"{DIGEST}.png"}


def test_unusable_directory_is_storage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(GatewayError) as info:
        EvidenceStore(blocker / "ev")
    assert info.value.code == "storage_error"
