"""The receipt writer: whole lines, once each, under concurrency and after a crash."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import orjson

from gateway.receipts import Receipt, ReceiptWriter, Usage


def _receipt(n: int) -> Receipt:
    return Receipt(
        request_id=f"req-{n}",
        tenant="acme",
        subject="s",
        endpoint="chat.completions",
        serve_identity=None,
        outcome="complete",
        usage=Usage(1, 2, 3, "reported"),
    )


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
