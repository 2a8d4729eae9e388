"""``mistralrs-gateway receipts verify|merge``: two replicas' audit folders,
rotated files included, read as one fleet."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gateway.books.receipt_chain import line_sha256
from gateway.books.receipts import ReceiptWriter
from gateway.books.state.sqlite.anchors import SqliteAnchorStore
from gateway.config.loader import load_config
from gateway.testing.harness import default_policy, write_config
from gateway.tools.cli import main
from tests.support.receipts import make_receipt

_receipt = make_receipt


async def _replica(
    folder: Path, replica: str, created: list[float], rotate_bytes: int = 0, keep: int = 10
) -> Path:
    path = folder / "receipts.jsonl"
    writer = ReceiptWriter(path, replica=replica, rotate_bytes=rotate_bytes, keep=keep)
    await writer.start()
    for n, at in enumerate(created):
        writer.write(_receipt(n, at))
        assert await writer.flush(5) == 0
    await writer.aclose(5)
    return path


@pytest.fixture
async def fleet(tmp_path: Path) -> tuple[Path, Path]:
    a = await _replica(tmp_path / "a", "gw-a", [1, 3, 5, 7], rotate_bytes=700, keep=10)
    b = await _replica(tmp_path / "b", "gw-b", [2, 3, 4])
    assert (a.parent / "receipts.jsonl.1").exists(), "gw-a's file rotated"
    return a.parent, b.parent


def _verify(capsys: pytest.CaptureFixture[str], *paths: Path) -> tuple[int, list[str]]:
    code = main(["receipts", "verify", *map(str, paths)])
    return code, capsys.readouterr().out.splitlines()


def test_whole_chains_verify(fleet: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _verify(capsys, *fleet)
    assert code == 0
    assert out[-1].startswith("receipts verify: ") and out[-1].endswith(
        "2 replicas, 7 receipts, 0 findings"
    ), out
    assert len(out) == 1


def test_a_deleted_line_is_found(
    fleet: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    live = fleet[1] / "receipts.jsonl"
    lines = live.read_bytes().splitlines(keepends=True)
    live.write_bytes(lines[0] + lines[2])
    code, out = _verify(capsys, *fleet)
    assert code == 1
    assert out[:-1] == ["gap: replica gw-b seq 2 missing"]
    assert out[-1].endswith("2 replicas, 6 receipts, 1 findings")


def test_a_duplicate_with_changed_content_is_a_fork(
    fleet: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    live = fleet[1] / "receipts.jsonl"
    first = live.read_bytes().splitlines(keepends=True)[0]
    with live.open("ab") as handle:
        handle.write(first.replace(b'"outcome":"complete"', b'"outcome":"rejected"'))
    code, out = _verify(capsys, *fleet)
    assert code == 1
    assert out[0].startswith("fork: replica gw-b seq 1: 2 different lines"), out


def test_a_torn_line_is_found(fleet: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    live = fleet[0] / "receipts.jsonl"
    with live.open("ab") as handle:
        handle.write(b'{"request_id": "cut sh')
    code, out = _verify(capsys, *fleet)
    assert code == 1
    last = len(live.read_bytes().splitlines())
    assert out[:-1] == [f"torn: {live} line {last}: no newline at the end"]


def test_a_folder_given_twice_counts_each_file_once(
    fleet: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _verify(capsys, *fleet, fleet[0], fleet[0] / "receipts.jsonl")
    assert code == 0 and out[-1].endswith("2 replicas, 7 receipts, 0 findings")


def test_what_cannot_be_read_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["receipts", "verify", str(tmp_path / "empty")]) == 2
    assert "no audit files" in capsys.readouterr().err
    assert main(["receipts", "merge", str(tmp_path / "nothing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_merge_orders_by_created_then_replica_then_seq(
    fleet: tuple[Path, Path], capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    originals = {
        line
        for folder in fleet
        for path in folder.glob("receipts.jsonl*")
        if not path.name.endswith(".lock")
        for line in path.read_bytes().splitlines(keepends=True)
    }
    assert main(["receipts", "merge", *map(str, fleet)]) == 0
    out = capsysbinary.readouterr().out
    lines = out.splitlines(keepends=True)
    assert set(lines) == originals and len(lines) == 7, "the original bytes, each once"
    order = [(r["created"], r["replica"], r["seq"]) for r in map(json.loads, lines)]
    assert order == [
        (1, "gw-a", 1),
        (2, "gw-b", 1),
        (3, "gw-a", 2),  # one created: gw-a before gw-b
        (3, "gw-b", 2),
        (4, "gw-b", 3),
        (5, "gw-a", 3),
        (7, "gw-a", 4),
    ]


def test_merge_leaves_torn_lines_out(
    fleet: tuple[Path, Path], capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    with (fleet[0] / "receipts.jsonl").open("ab") as handle:
        handle.write(b"not a receipt\n")
    assert main(["receipts", "merge", *map(str, fleet)]) == 0
    captured = capsysbinary.readouterr()
    assert len(captured.out.splitlines()) == 7
    assert b"1 torn lines left out" in captured.err


# -- write-ahead and anchors (spec §24) ------------------------------------------------


async def test_an_admitted_request_without_its_receipt_is_unfinished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gw-a" / "receipts.jsonl"
    writer = ReceiptWriter(path, replica="gw-a")
    await writer.start()
    done = _receipt(1)
    writer.open(done)
    writer.open(_receipt(2))  # admitted; its replica is gone before its receipt
    writer.write(done)
    assert await writer.flush(5) == 0
    await writer.aclose(5)
    code, out = _verify(capsys, path.parent)
    assert code == 1
    assert out[:-1] == [
        f"unfinished: replica gw-a seq 2 ({path} line 2): request req-2 was admitted and "
        "has no receipt"
    ]
    assert out[-1].endswith("1 replicas, 1 receipts, 1 findings; 2 open lines (write-ahead)")
    assert main(["receipts", "verify", "--allow-unfinished", str(path.parent)]) == 0
    assert capsys.readouterr().out.startswith("unfinished: replica gw-a seq 2"), "still said"


def test_verify_against_the_anchors_finds_deleted_newest_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(A plain test: the command runs its own event loop.)"""
    config = write_config(
        tmp_path,
        upstream_port=1234,
        policies={"acme": default_policy("acme")},
        audit={"path": "var/gw-a/receipts.jsonl"},
    )
    loaded = load_config(config)

    async def replica_anchored() -> Path:
        path = await _replica(loaded.audit.path.parent, "gw-a", [1, 2, 3, 4])
        store = SqliteAnchorStore(loaded.staging.catalog)
        last = path.read_bytes().splitlines()[-1]
        await store.anchor("gw-a", 4, line_sha256(last), 1_800_000_000.0)
        await store.close()
        return path

    path = asyncio.run(replica_anchored())
    argv = ["receipts", "verify", "--anchors", "--config", str(config), str(path.parent)]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip().endswith("0 findings; held against 1 anchors")
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-2]))  # the newest two receipts deleted
    assert main(["receipts", "verify", str(path.parent)]) == 0, "links alone cannot see it"
    capsys.readouterr()
    assert main(argv) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "truncated: replica gw-a: the newest line here is seq 2, but the replica anchored "
        "seq 4 at 2027-01-15T08:00:00Z: 2 lines are gone from its end"
    )


def test_anchors_need_a_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["receipts", "verify", "--anchors", str(tmp_path)]) == 2
    assert "--anchors needs --config" in capsys.readouterr().err
