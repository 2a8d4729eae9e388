"""The interim tenant files behind url image links (spec §23): written 0640 under
random ids, read back until they expire, expired ones swept a bounded few at a time."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.books.interim_files import InterimFiles
from gateway.core.errors import GatewayError
from gateway.core.signed_urls import FILE_ID


async def test_a_file_is_kept_and_read_back(tmp_path: Path) -> None:
    files = InterimFiles(tmp_path / "files", keep_s=60)
    record = await files.put("acme", b"\x89PNG\r\n\x1a\n data", "image-1.png")
    assert FILE_ID.fullmatch(record.id) and record.bytes == 13
    assert record.sha256 == hashlib.sha256(b"\x89PNG\r\n\x1a\n data").hexdigest()
    found = await files.get(record.id)
    assert found is not None
    got, data = found
    assert (got.tenant, got.name, got.mime_type) == ("acme", "image-1.png", "image/png")
    assert data == b"\x89PNG\r\n\x1a\n data"
    for path in (tmp_path / "files").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) & 0o007 == 0  # nothing for others
    other = await files.put("acme", b"x", "image-2.png")
    assert other.id != record.id


async def test_pieces_are_written_as_they_come(tmp_path: Path) -> None:
    files = InterimFiles(tmp_path, keep_s=60)
    record = await files.put("acme", iter([b"ab", b"", b"cde"]), "x.png")
    found = await files.get(record.id)
    assert record.bytes == 5 and found is not None and found[1] == b"abcde"
    assert record.mime_type == "application/octet-stream"  # sniffed, not named


async def test_a_piece_that_fails_leaves_no_file(tmp_path: Path) -> None:
    def pieces() -> Iterator[bytes]:
        yield b"ab"
        raise OSError("the disk went away")

    files = InterimFiles(tmp_path, keep_s=60)
    with pytest.raises(GatewayError, match="state_unavailable"):
        await files.put("acme", pieces(), "x.png")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("file_id", ["file_nope12345678", "../../etc/passwd", "file_", ""])
async def test_unknown_or_malformed_ids_are_none(tmp_path: Path, file_id: str) -> None:
    files = InterimFiles(tmp_path, keep_s=60)
    assert await files.get(file_id) is None


async def test_expired_files_are_not_read_and_are_swept(tmp_path: Path) -> None:
    files = InterimFiles(tmp_path / "f", keep_s=60)
    old = await files.put("acme", b"old", "a.png")
    # Age it past keep_s: its record says when it was made, the sweep reads mtimes.
    meta = tmp_path / "f" / f"{old.id}.json"
    meta.write_text(meta.read_text().replace(str(old.created), str(old.created - 61)))
    past = time.time() - 120
    for path in (meta, tmp_path / "f" / old.id):
        os.utime(path, (past, past))
    assert await files.get(old.id) is None
    await files.put("acme", b"new", "b.png")
    assert not (tmp_path / "f" / old.id).exists() and not meta.exists()


async def test_a_disk_that_refuses_is_state_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"")
    files = InterimFiles(blocker / "files", keep_s=60)
    with pytest.raises(GatewayError) as caught:
        await files.put("acme", b"x", "a.png")
    assert caught.value.code == "state_unavailable"
    assert str(blocker) not in caught.value.message
