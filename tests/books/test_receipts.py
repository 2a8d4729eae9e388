"""The receipt writer: whole lines, once each, under concurrency and after a crash."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time
from pathlib import Path

import orjson

from gateway.books.receipts import (
    MAX_SUBJECT_CHARS,
    OPEN_DUE_S,
    Receipt,
    ReceiptWriter,
    Usage,
    receipt_line,
)
from tests.support.poll import eventually_async
from tests.support.receipts import make_receipt
from tests.support.tmpfs import fill, free, small_fs


def _receipt(n: int) -> Receipt:
    return make_receipt(n, usage=Usage(1, 2, 3, "reported"))


async def test_concurrent_writes_are_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "audit" / "receipts.jsonl"
    writer = ReceiptWriter(path)
    await writer.start()

    async def burst(base: int) -> None:
        for i in range(100):
            writer.write(_receipt(base + i))
            if i % 10 == 0:
                await asyncio.sleep(0)

    await asyncio.gather(*(burst(k * 1000) for k in range(8)))
    await writer.flush()
    await writer.aclose()
    lines = path.read_bytes().splitlines()
    assert len(lines) == 800
    ids = {json.loads(line)["request_id"] for line in lines}
    assert len(ids) == 800
    assert writer.written == 800


async def test_torn_last_line_leaves_earlier_lines_intact(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    writer = ReceiptWriter(path)
    await writer.start()
    for i in range(3):
        writer.write(_receipt(i))
    await writer.aclose()
    # A crash mid-append can at worst leave a torn final line.
    with path.open("ab") as handle:
        handle.write(b'{"request_id": "torn')
    writer = ReceiptWriter(path)
    await writer.start()
    writer.write(_receipt(99))
    await writer.aclose()
    lines = path.read_bytes().split(b"\n")
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line)["request_id"])
        except ValueError:
            continue
    assert parsed == ["req-0", "req-1", "req-2", "req-99"]


def test_receipt_holds_no_text_fields() -> None:
    fields = set(orjson.loads(orjson.dumps(_receipt(1))))
    assert not fields & {"prompt", "messages", "content", "text", "authorization"}
    assert {"request_sha256", "stream_sha256", "usage", "outcome", "cancellation"} <= fields


def test_receipt_line_is_every_field_in_order() -> None:
    # The writer dumps the dataclass itself: the line must hold every field, as asdict().
    receipt = Receipt(
        request_id="r",
        tenant="acme",
        subject="s",
        endpoint="chat.completions",
        serve_identity="sha256:" + "a" * 64,
        model_alias="m",
        route="/srv/x",
        request_sha256="b" * 64,
        request_bytes=10,
        artifacts=[{"evidence_id": "ev_1", "sha256": "c" * 64, "media_type": "image/png"}],
        locator_sha256=["d" * 64, None],
        dropped_parts=[2],
        max_tokens=5,
        stream=True,
        outcome="complete",
        error_code="upstream_timeout",
        finish_reason="stop",
        usage=Usage(1, 2, 3, "reported", {"prompt_tokens": 1, "x": [1]}),
        stream_sha256="e" * 64,
        queue_ms=1.5,
        ttft_ms=2.5,
        duration_ms=3.5,
        cancellation=["caller_disconnected"],
        created=4.0,
    )
    assert orjson.loads(orjson.dumps(receipt)) == dataclasses.asdict(receipt)
    assert list(orjson.loads(orjson.dumps(receipt))) == [
        f.name for f in dataclasses.fields(receipt)
    ]


# -- never failing open (spec §13): a real full filesystem ---------------------


def _ids(path: Path) -> list[str]:
    return [json.loads(line)["request_id"] for line in path.read_bytes().splitlines()]


async def test_a_full_disk_keeps_receipts_and_recovers_by_itself(tmp_path: Path) -> None:
    errors: list[int] = []
    with small_fs(tmp_path / "audit", 256) as fs:
        path = fs / "receipts.jsonl"
        writer = ReceiptWriter(path, on_error=lambda: errors.append(1))
        await writer.start()
        writer.write(_receipt(0))
        assert await writer.flush(5) == 0
        fill(fs)
        for i in range(1, 60):
            writer.write(_receipt(i))
        await eventually_async(lambda: not writer.healthy and errors != [], "writer failing")
        assert writer.pending > 0
        free(fs)
        await eventually_async(lambda: writer.healthy and writer.pending == 0, "writer recovered")
        await writer.aclose(5)
        # Each receipt exactly once and whole: a line cut by the full disk was completed.
        assert _ids(path) == [f"req-{i}" for i in range(60)]
        assert writer.written == 60 and writer.lost == 0


async def test_past_the_backlog_bound_receipts_are_counted_lost(tmp_path: Path) -> None:
    lost: list[int] = []
    with small_fs(tmp_path / "audit", 128) as fs:
        path = fs / "receipts.jsonl"
        writer = ReceiptWriter(path, max_pending=10, on_lost=lost.append)
        await writer.start()
        fill(fs)
        for i in range(15):
            writer.write(_receipt(i))
        assert writer.lost == 5 and sum(lost) == 5
        await eventually_async(lambda: not writer.healthy, "writer failing")
        free(fs)
        await eventually_async(lambda: writer.pending == 0, "backlog written")
        await writer.aclose(5)
        assert _ids(path) == [f"req-{i}" for i in range(10)]


async def test_flush_and_close_stop_waiting_on_a_full_disk(tmp_path: Path) -> None:
    with small_fs(tmp_path / "audit", 128) as fs:
        writer = ReceiptWriter(fs / "receipts.jsonl")
        await writer.start()
        fill(fs)
        for i in range(5):
            writer.write(_receipt(i))
        assert await writer.flush(0.2) > 0, "flush reports what it could not write"
        assert await writer.aclose(0.2) > 0
        assert writer.pending > 0


async def test_rotation_keeps_the_newest_files(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    # As the writer stamps it: its chain fields are part of the line's size.
    stamped = dataclasses.replace(_receipt(0), replica="replica", seq=10, prev_sha256="0" * 64)
    line = len(orjson.dumps(stamped)) + 1
    writer = ReceiptWriter(path, rotate_bytes=line * 3, keep=2)
    await writer.start()
    for i in range(10):
        writer.write(_receipt(i))
        assert await writer.flush(5) == 0
    await writer.aclose(5)
    _check_rotated(tmp_path, path, line * 3)


def _check_rotated(folder: Path, path: Path, bound: int) -> None:
    files = sorted(p.name for p in folder.iterdir())
    # The lock file stays where it is while the audit files rotate past it.
    assert files == [
        "receipts.jsonl",
        "receipts.jsonl.1",
        "receipts.jsonl.2",
        "receipts.jsonl.lock",
    ]
    kept = _ids(folder / "receipts.jsonl.2") + _ids(folder / "receipts.jsonl.1") + _ids(path)
    assert kept == [f"req-{i}" for i in range(10 - len(kept), 10)]
    assert all(p.stat().st_size <= bound for p in folder.iterdir())


async def test_reopen_follows_an_external_rotation(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    writer = ReceiptWriter(path)
    await writer.start()
    writer.write(_receipt(1))
    assert await writer.flush(5) == 0
    path.rename(tmp_path / "receipts.jsonl.old")  # logrotate's move
    writer.reopen()
    writer.write(_receipt(2))
    assert await writer.flush(5) == 0
    await writer.aclose(5)
    assert _ids(tmp_path / "receipts.jsonl.old") == ["req-1"]
    assert _ids(path) == ["req-2"]


# -- one receipt, one line (spec §21) -------------------------------------------

#: characters str.splitlines() (and JavaScript) end a line at, which orjson leaves raw
_SEPARATORS = "\u2028\u2029\x85"


async def test_line_separators_are_escaped_and_the_subject_bounded(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    writer = ReceiptWriter(path)
    await writer.start()
    hostile = f"a{_SEPARATORS}b\ud800" + "x" * 12_000
    first = _receipt(1)
    first.subject = hostile
    first.finish_reason = f"stop{_SEPARATORS}"  # any string field, not only the subject
    first.usage = Usage(1, 2, 3, "reported", {f"k{_SEPARATORS}": [f"v{_SEPARATORS}"]})
    writer.write(first)
    writer.write(_receipt(2))
    await writer.aclose(5)
    data = path.read_bytes()
    for raw in (b"\xe2\x80\xa8", b"\xe2\x80\xa9", b"\xc2\x85"):
        assert raw not in data
    lines = data.decode().splitlines()
    assert len(lines) == 2, "every reader sees one line per receipt"
    parsed = [json.loads(line) for line in lines]
    assert [r["request_id"] for r in parsed] == ["req-1", "req-2"]
    # Escaped, not dropped: the JSON means what the receipt held (a lone
    # surrogate, which no UTF-8 line can carry, became U+FFFD).
    assert parsed[0]["subject"] == hostile[:256].replace("\ud800", "\ufffd")
    assert len(parsed[0]["subject"]) == 256
    assert parsed[0]["finish_reason"] == f"stop{_SEPARATORS}"
    assert parsed[0]["usage"]["reported"] == {f"k{_SEPARATORS}": [f"v{_SEPARATORS}"]}
    assert orjson.loads(lines[0]) == parsed[0]


def test_a_line_of_plain_text_is_orjson_unchanged() -> None:
    receipt = _receipt(3)
    receipt.subject = "user-é-1"  # non-ASCII, nothing to escape
    assert receipt_line(receipt) == orjson.dumps(receipt) + b"\n"
    assert receipt_line(_receipt(4)) == orjson.dumps(_receipt(4)) + b"\n"


def test_a_subject_at_the_bound_is_kept_whole() -> None:
    receipt = _receipt(5)
    receipt.subject = "s" * MAX_SUBJECT_CHARS
    assert json.loads(receipt_line(receipt))["subject"] == "s" * MAX_SUBJECT_CHARS
    receipt.subject = "s" * (MAX_SUBJECT_CHARS + 1)
    assert json.loads(receipt_line(receipt))["subject"] == "s" * MAX_SUBJECT_CHARS


async def test_a_steady_stream_is_written_in_batches_of_the_flush_interval(
    tmp_path: Path,
) -> None:
    # Receipts arriving faster than an fsync takes: the writer must not chase
    # the lines queued during each fsync with a fsync of their own.
    writer = ReceiptWriter(tmp_path / "receipts.jsonl", linger_s=0.05)
    await writer.start()
    loop = asyncio.get_running_loop()
    began = loop.time()
    sent = 0
    while loop.time() - began < 0.3 and sent < 50_000:
        writer.write(_receipt(sent))
        sent += 1
        await asyncio.sleep(0)
    spent = loop.time() - began
    await writer.flush(5)
    assert writer.written == sent
    await writer.aclose()
    written = (tmp_path / "receipts.jsonl").read_bytes()
    assert len(written.splitlines()) == sent
    # One batch per interval begun and a last one, plus one per 1 MiB (a
    # batch's bound): the old writer made 182 here, one per fsync.
    bound = spent / 0.05 + 2 + len(written) / (1 << 20)
    assert writer.batches <= bound, (writer.batches, spent, sent)


async def test_lines_queued_during_close_are_all_written(tmp_path: Path) -> None:
    writer = ReceiptWriter(tmp_path / "receipts.jsonl", linger_s=0.05)
    await writer.start()
    for i in range(10):
        writer.write(_receipt(i))
    closing = asyncio.ensure_future(writer.aclose(5))
    await asyncio.sleep(0)
    for i in range(10, 20):
        writer.write(_receipt(i))
    assert await closing == 0
    assert len((tmp_path / "receipts.jsonl").read_bytes().splitlines()) == 20


async def test_flush_waits_for_what_was_queued_not_for_a_quiet_queue(tmp_path: Path) -> None:
    writer = ReceiptWriter(tmp_path / "receipts.jsonl", linger_s=0.02)
    await writer.start()
    stop = asyncio.Event()

    async def traffic() -> None:
        n = 0
        until = asyncio.get_running_loop().time() + 6
        # Faster than the writer's fsyncs: the queue is never empty meanwhile.
        while not stop.is_set() and n < 2_000_000 and asyncio.get_running_loop().time() < until:
            writer.write(_receipt(n))
            n += 1
            await asyncio.sleep(0)

    running = asyncio.ensure_future(traffic())
    await eventually_async(lambda: writer.batches >= 1, "a first batch under way", 5)
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await writer.flush(3) == 0
    assert loop.time() - began < 2  # not the whole timeout: lines keep coming meanwhile
    stop.set()
    await running
    await writer.aclose()


# -- write-ahead (spec §24) ---------------------------------------------------------


async def test_an_open_line_is_chained_and_rides_its_receipts_batch(tmp_path: Path) -> None:
    """The open line at admission is a link of the chain, and the receipt names
    its seq; written in the receipt's batch, it adds no fsync of its own."""
    path = tmp_path / "receipts.jsonl"
    writer = ReceiptWriter(path, replica="gw-a", linger_s=0.05)
    await writer.start()
    receipt = _receipt(1)
    writer.open(receipt)
    assert receipt.open_seq == 1
    writer.write(receipt)
    assert await writer.flush(5) == 0
    assert writer.batches == 1, "the open line rode the receipt's batch"
    await writer.aclose(5)
    first, second = path.read_bytes().splitlines()
    opened = orjson.loads(first)
    assert list(opened) == [
        "kind",
        "request_id",
        "replica",
        "seq",
        "prev_sha256",
        "tenant",
        "endpoint",
        "created",
    ]
    assert (opened["kind"], opened["request_id"], opened["replica"], opened["seq"]) == (
        "open",
        "req-1",
        "gw-a",
        1,
    )
    assert (opened["tenant"], opened["endpoint"]) == ("acme", "chat.completions")
    closed = orjson.loads(second)
    assert (closed["open_seq"], closed["seq"]) == (1, 2)
    assert closed["prev_sha256"] == hashlib.sha256(first).hexdigest()
    assert writer.durable == (2, hashlib.sha256(second).hexdigest())


async def test_an_open_line_alone_is_written_once_it_is_due(tmp_path: Path) -> None:
    """A long request and nothing else ending: its open line does not wait for a
    receipt forever (a SIGKILL must find it on disk), only OPEN_DUE_S."""
    path = tmp_path / "receipts.jsonl"
    writer = ReceiptWriter(path, linger_s=0.01)
    await writer.start()
    started = time.monotonic()
    writer.open(_receipt(1))
    await eventually_async(lambda: path.exists() and path.read_bytes().count(b"\n") == 1, "due")
    assert time.monotonic() - started >= OPEN_DUE_S * 0.9
    assert writer.batches == 1 and writer.durable is not None and writer.durable[0] == 1
    await writer.aclose(5)


async def test_open_lines_of_a_steady_stream_add_no_batches(tmp_path: Path) -> None:
    """Requests shorter than OPEN_DUE_S one after another (the bench's C=1): open
    and receipt lines share the receipts' batches, so an open line costs no fsync."""
    path = tmp_path / "receipts.jsonl"
    with_opens, without = (
        ReceiptWriter(path.with_name(name), linger_s=0.02) for name in ("a.jsonl", "b.jsonl")
    )
    for writer, opens in ((with_opens, True), (without, False)):
        await writer.start()
        for n in range(30):
            receipt = _receipt(n)
            if opens:
                writer.open(receipt)
            await asyncio.sleep(0.005)  # the request runs
            writer.write(receipt)
        assert await writer.flush(5) == 0
        await writer.aclose(5)
    assert with_opens.written == 60 and without.written == 30
    assert with_opens.batches <= without.batches + 1, (with_opens.batches, without.batches)


async def test_the_durable_head_goes_on_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    writer = ReceiptWriter(path, replica="gw-a")
    await writer.start()
    assert writer.durable is None
    for n in range(3):
        writer.write(_receipt(n))
    await writer.aclose(5)
    last = path.read_bytes().splitlines()[-1]
    again = ReceiptWriter(path, replica="gw-a")
    await again.start()
    assert again.durable == (3, hashlib.sha256(last).hexdigest())
    await again.aclose(5)
