"""Receipt chains: the writer links every line to the one before (across
rotations and restarts), and the checks find what a fleet's files lost."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import orjson

from gateway.books.receipt_chain import (
    Anchor,
    ChainHead,
    Entry,
    Report,
    check,
    last_receipt,
    line_sha256,
    read_line,
)
from gateway.books.receipts import ReceiptWriter
from tests.support.receipts import make_receipt

_receipt = make_receipt


async def _write(
    path: Path, replica: str, ids: range, rotate_bytes: int = 0, keep: int = 10
) -> ReceiptWriter:
    """Write receipts ``ids`` through a real writer, flushed one by one, then closed."""
    writer = ReceiptWriter(path, replica=replica, rotate_bytes=rotate_bytes, keep=keep)
    await writer.start()
    for n in ids:
        writer.write(_receipt(n, created=float(n)))
        assert await writer.flush(5) == 0
    await writer.aclose(5)
    return writer


def _files_oldest_first(path: Path) -> list[Path]:
    rotated = sorted(path.parent.glob(f"{path.name}.[0-9]*"), key=lambda p: -int(p.suffix[1:]))
    return [*rotated, path]


def _lines(*files: Path) -> list[bytes]:
    return [line for f in files for line in f.read_bytes().splitlines()]


def _assert_one_chain(lines: list[bytes], replica: str, first_seq: int = 1) -> None:
    previous: bytes | None = None
    for seq, line in enumerate(lines, first_seq):
        receipt = json.loads(line)
        assert (receipt["replica"], receipt["seq"]) == (replica, seq)
        if previous is None:
            assert first_seq > 1 or receipt["prev_sha256"] is None
        else:
            # the exact bytes of the line before, without its newline
            assert receipt["prev_sha256"] == hashlib.sha256(previous).hexdigest()
        previous = line


def _report(lines: list[bytes]) -> Report:
    entries: list[Entry] = []
    offset = 0
    for number, line in enumerate(lines, 1):
        entry, finding = read_line(0, number, offset, line + b"\n", f"f line {number}")
        assert entry is not None and finding is None
        entries.append(entry)
        offset += len(line) + 1
    return check(entries, ["f"])


def _texts(report: Report) -> list[str]:
    return [f.text for f in report.findings]


# -- the writer's chain ---------------------------------------------------------


async def test_the_chain_runs_on_through_rotations(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    await _write(path, "gw-a", range(10), rotate_bytes=900, keep=20)
    files = _files_oldest_first(path)
    assert len(files) > 3, "the files rotated"
    lines = _lines(*files)
    assert [json.loads(line)["request_id"] for line in lines] == [f"req-{i}" for i in range(10)]
    _assert_one_chain(lines, "gw-a")
    # The first line of a rotated-to file names the last line of the file before.
    first_of_new = json.loads(_lines(files[-1])[0])
    assert first_of_new["prev_sha256"] == line_sha256(_lines(files[-2])[-1])
    assert _texts(_report(lines)) == []


async def test_a_restart_goes_on_from_the_replicas_last_line(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    await _write(path, "gw-a", range(3))
    await _write(path, "gw-a", range(3, 5))
    _assert_one_chain(_lines(path), "gw-a")


async def test_a_restart_finds_the_tail_a_rotation_moved(tmp_path: Path) -> None:
    # A crash between a rotation and its first write leaves the chain's tail in .1.
    path = tmp_path / "receipts.jsonl"
    await _write(path, "gw-a", range(3))
    path.rename(tmp_path / "receipts.jsonl.1")
    path.touch()
    await _write(path, "gw-a", range(3, 5))
    _assert_one_chain(_lines(tmp_path / "receipts.jsonl.1", path), "gw-a")


async def test_another_replica_starts_its_own_chain(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    await _write(path, "gw-a", range(2))
    await _write(path, "gw-b", range(2, 4))
    lines = _lines(path)
    _assert_one_chain(lines[:2], "gw-a")
    _assert_one_chain(lines[2:], "gw-b")
    report = _report(lines)
    assert (_texts(report), report.replicas, report.receipts) == ([], 2, 4)


async def test_a_torn_last_line_is_passed_over_and_stays_a_finding(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    await _write(path, "gw-a", range(3))
    with path.open("ab") as handle:
        handle.write(b'{"request_id": "torn')  # a crash mid-append
    await _write(path, "gw-a", range(3, 5))
    lines = _lines(path)
    assert lines[3] == b'{"request_id": "torn'
    _assert_one_chain(lines[:3] + lines[4:], "gw-a")
    entry, finding = read_line(0, 4, 0, lines[3] + b"\n", "f line 4")
    assert entry is None and finding is not None and finding.kind == "torn"


async def test_a_line_cut_just_before_its_newline_keeps_its_place(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    await _write(path, "gw-a", range(3))
    path.write_bytes(path.read_bytes().removesuffix(b"\n"))
    await _write(path, "gw-a", range(3, 5))
    lines = _lines(path)
    assert len(lines) == 5, "the newline was added, not a second seq 3"
    _assert_one_chain(lines, "gw-a")


async def test_receipts_lost_past_the_bound_leave_a_linked_gap(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    lost: list[int] = []
    writer = ReceiptWriter(path, replica="gw-a", max_pending=2, on_lost=lost.append)
    await writer.start()
    for n in range(5):  # no await between them: the flusher has not run
        writer.write(_receipt(n))
    assert sum(lost) == 3
    assert await writer.flush(5) == 0
    writer.write(_receipt(5))
    await writer.aclose(5)
    lines = _lines(path)
    assert [json.loads(line)["seq"] for line in lines] == [1, 2, 6]
    assert json.loads(lines[2])["prev_sha256"] == line_sha256(lines[1])
    findings = _report(lines).findings
    assert [(f.kind, f.text.split(":")[1].strip()) for f in findings] == [
        ("lost", "replica gw-a seq 3..5")
    ]
    assert "gateway_receipts_lost_total" in findings[0].text


# -- the checks -----------------------------------------------------------------


async def _chain(tmp_path: Path, replica: str = "gw-a", count: int = 6) -> list[bytes]:
    path = tmp_path / f"{replica}.jsonl"
    await _write(path, replica, range(count))
    return _lines(path)


async def test_a_line_deleted_by_hand_is_a_gap(tmp_path: Path) -> None:
    lines = await _chain(tmp_path)
    del lines[2]
    assert _texts(_report(lines)) == ["gap: replica gw-a seq 3 missing"]
    del lines[2:4]
    assert _texts(_report(lines)) == ["gap: replica gw-a seq 3..5 missing"]


async def test_a_line_changed_in_place_breaks_the_next_link(tmp_path: Path) -> None:
    lines = await _chain(tmp_path)
    lines[2] = lines[2].replace(b'"outcome":"complete"', b'"outcome":"canceled"')
    (finding,) = _report(lines).findings
    assert finding.kind == "gap"
    assert finding.text.startswith("gap: replica gw-a seq 4 (f line 4): prev_sha256 is not")


async def test_a_line_duplicated_with_changed_content_is_a_fork(tmp_path: Path) -> None:
    lines = await _chain(tmp_path)
    changed = lines[2].replace(b'"req-2"', b'"req-x"')
    report = _report([*lines[:3], changed, *lines[3:]])
    assert _texts(report) == ["fork: replica gw-a seq 3: 2 different lines (f line 3, f line 4)"]
    # Byte-identical copies (a file given twice, a copy beside it) are one receipt.
    report = _report([*lines, *lines])
    assert (_texts(report), report.receipts, report.copies) == ([], 6, 6)


async def test_two_seqs_after_one_line_are_a_fork(tmp_path: Path) -> None:
    lines = await _chain(tmp_path, count=3)
    third = json.loads(lines[2])
    other = orjson.dumps({**third, "seq": 7, "request_id": "req-y"})
    texts = _texts(_report([*lines, other]))
    assert any(
        t.startswith("fork: replica gw-a: seq 3 (f line 3), seq 7 (f line 4)") for t in texts
    )


async def test_a_chain_whose_start_was_rotated_away_is_whole(tmp_path: Path) -> None:
    lines = await _chain(tmp_path)
    report = _report(lines[2:])
    assert (_texts(report), report.partial) == ([], 1)


def test_torn_and_malformed_lines() -> None:
    _, torn = read_line(0, 1, 0, b'{"request_id": "r', "f line 1")
    assert torn is not None and torn.text == "torn: f line 1: no newline at the end"
    _, torn = read_line(0, 1, 0, b'{"request_id": "r\n', "f line 1")
    assert torn is not None and torn.text == "torn: f line 1: not a JSON object"
    _, torn = read_line(0, 1, 0, b"\n", "f line 1")
    assert torn is not None and torn.kind == "torn"
    entry, bad = read_line(0, 1, 0, b'{"replica": "a", "seq": "1"}\n', "f line 1")
    assert entry is not None and bad is not None and bad.kind == "malformed"
    entry, none = read_line(0, 1, 0, b'{"request_id": "old"}\n', "f line 1")
    assert entry is not None and entry.replica is None and none is None
    assert check([entry], ["f"]).unchained == 1


def test_resume_only_from_the_replicas_own_line() -> None:
    line = b'{"replica":"gw-a","seq":41,"prev_sha256":null}'
    head = ChainHead.resume("gw-a", line)
    assert (head.seq, head.last_sha256) == (41, line_sha256(line))
    assert ChainHead.resume("gw-b", line).seq == 0
    assert ChainHead.resume("gw-a", b"not json").seq == 0
    assert ChainHead.resume("gw-a", None).seq == 0


def test_last_receipt_of_a_tail() -> None:
    assert last_receipt(b'{"a":1}\n{"a":2}\n{"a', whole=True) == b'{"a":2}'
    assert last_receipt(b'{"a":1}\n{"a":2}', whole=True) == b'{"a":2}'
    # A window's first piece may be the end of a longer line: never taken.
    assert last_receipt(b'{"a":1}\n{"a', whole=False) is None
    assert last_receipt(b"", whole=True) is None


# -- write-ahead and anchors (spec §24) ---------------------------------------------


async def _admitted(path: Path, replica: str, finished: range, running: range) -> list[bytes]:
    """Requests ``finished`` (open line, then receipt) and ``running`` (open line
    only, as a replica killed mid-request leaves them), through a real writer."""
    writer = ReceiptWriter(path, replica=replica)
    await writer.start()
    for n in running:
        writer.open(_receipt(n))
    for n in finished:
        receipt = _receipt(n)
        writer.open(receipt)
        writer.write(receipt)
    assert await writer.flush(5) == 0
    await writer.aclose(5)
    return _lines(path)


async def test_open_lines_are_links_and_unclosed_ones_are_unfinished(tmp_path: Path) -> None:
    lines = await _admitted(tmp_path / "receipts.jsonl", "gw-a", range(3), range(10, 12))
    _assert_one_chain(lines, "gw-a")
    report = _report(lines)
    assert (report.receipts, report.opens, report.unfinished) == (3, 5, 2)
    assert [f.kind for f in report.findings] == ["unfinished", "unfinished"]
    assert _texts(report) == [
        "unfinished: replica gw-a seq 1 (f line 1): request req-10 was admitted and has no receipt",
        "unfinished: replica gw-a seq 2 (f line 2): request req-11 was admitted and has no receipt",
    ]
    finished = await _admitted(tmp_path / "whole.jsonl", "gw-b", range(3), range(0))
    assert _texts(_report(finished)) == []


def _anchored(lines: list[bytes], anchors: dict[str, Anchor]) -> Report:
    entries = []
    for number, line in enumerate(lines, 1):
        entry, _ = read_line(0, number, 0, line + b"\n", f"f line {number}")
        assert entry is not None
        entries.append(entry)
    return check(entries, ["f"], anchors)


async def test_a_chain_shorter_than_its_anchor_is_truncated(tmp_path: Path) -> None:
    """Deleting the newest lines leaves a whole chain (links cannot show it):
    only the anchor can."""
    lines = await _admitted(tmp_path / "receipts.jsonl", "gw-a", range(4), range(0))
    head = Anchor("gw-a", 8, line_sha256(lines[-1]), 1_800_000_000.0)
    assert _texts(_anchored(lines, {"gw-a": head})) == []
    cut = lines[:-2]  # the newest request's open line and receipt
    assert _texts(_report(cut)) == [], "without the anchor the shorter chain looks whole"
    (finding,) = _anchored(cut, {"gw-a": head}).findings
    assert finding.kind == "truncated"
    assert finding.text == (
        "truncated: replica gw-a: the newest line here is seq 6, but the replica anchored "
        "seq 8 at 2027-01-15T08:00:00Z: 2 lines are gone from its end"
    )
    # A line at the anchored seq that is not the anchored one: changed or replaced.
    other = Anchor("gw-a", 8, "0" * 64, 1_800_000_000.0)
    (changed,) = _anchored(lines, {"gw-a": other}).findings
    assert changed.kind == "gap" and "not the line its anchor names" in changed.text
    # An older anchor (the chain went on since) is no finding.
    older = Anchor("gw-a", 2, line_sha256(lines[1]), 1_700_000_000.0)
    assert _texts(_anchored(lines, {"gw-a": older})) == []


async def test_an_anchored_replica_absent_from_the_files_is_counted_not_found(
    tmp_path: Path,
) -> None:
    lines = await _admitted(tmp_path / "receipts.jsonl", "gw-a", range(2), range(0))
    report = _anchored(lines, {"gw-z": Anchor("gw-z", 9, "0" * 64, 1.0)})
    assert (report.findings, report.anchored_absent) == ([], 1)
