"""One writer per audit path: a second one is refused before it writes, and the
lock outlives the file's rotations."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from gateway.books.audit_file import AuditFileHeld, last_line, lock_path
from gateway.books.receipts import Receipt, ReceiptWriter


def _receipt(n: int) -> Receipt:
    return Receipt(
        request_id=f"req-{n}", tenant="acme", subject="s", endpoint="e", serve_identity=None
    )


async def test_a_second_writer_on_the_path_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "audit" / "receipts.jsonl"
    first = ReceiptWriter(path, replica="gw-a")
    await first.start()
    second = ReceiptWriter(path, replica="gw-b")
    with pytest.raises(AuditFileHeld) as refused:
        await second.start()
    assert str(refused.value) == "audit.path: the audit file is held by another gateway process"
    assert str(tmp_path) not in str(refused.value)
    first.write(_receipt(1))
    await first.aclose(5)
    assert path.read_bytes().count(b"\n") == 1, "the refused writer wrote nothing"
    # Let go at close: the next writer starts (and goes on from nothing of its own).
    await second.start()
    second.write(_receipt(2))
    await second.aclose(5)


async def test_the_lock_holds_across_rotations(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    writer = ReceiptWriter(path, rotate_bytes=300, keep=3)
    await writer.start()
    for n in range(6):
        writer.write(_receipt(n))
        assert await writer.flush(5) == 0
    assert (tmp_path / "receipts.jsonl.2").exists(), "the file rotated"
    with pytest.raises(AuditFileHeld):
        await ReceiptWriter(path).start()
    await writer.aclose(5)


async def test_a_writer_in_another_process_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    writer = ReceiptWriter(path)
    await writer.start()
    probe = (
        "import sys; from pathlib import Path; "
        "from gateway.books.audit_file import AuditFileHeld, lock\n"
        "try:\n    lock(Path(sys.argv[1]))\nexcept AuditFileHeld as exc:\n"
        "    print(exc); sys.exit(3)\n"
    )
    with anyio.fail_after(30):
        done = await anyio.run_process([sys.executable, "-c", probe, str(path)], check=False)
    await writer.aclose(5)
    assert (done.returncode, done.stdout) == (
        3,
        b"audit.path: the audit file is held by another gateway process\n",
    )
    assert lock_path(path).exists()


def test_last_line_reads_past_a_window(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    long = b'{"replica":"gw-a","seq":1,"pad":"' + b"x" * 200_000 + b'"}'
    path.write_bytes(b'{"seq":0}\n' + long + b"\n" + b'{"torn')
    assert last_line(path) == long
    path.write_bytes(b"")
    assert last_line(path) is None
    (tmp_path / "receipts.jsonl.1").write_bytes(b'{"seq":9}\n')
    assert last_line(path) == b'{"seq":9}'
