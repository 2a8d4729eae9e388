"""`mistralrs-gateway demo --engine` prints its one labelled report (tiny model, short)."""

from __future__ import annotations

import json

import pytest

from gateway.tools.cli import main


def test_the_engine_demo_reports_real_usage_and_both_receipts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--engine", "--model-size", "tiny", "--max-tokens", "16"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["note"].startswith(
        "random-weight model, real mistral.rs engine through an adapter"
    )
    stream = report["stream"]
    assert (stream["status"], stream["done"], stream["finish_reason"]) == (200, True, "length")
    assert stream["engine_usage"]["completion_tokens"] == 16
    assert "avg_compl_tok_per_sec" in stream["engine_usage"]
    assert report["stream_receipt"]["usage"]["reported"] == stream["engine_usage"]
    assert report["non_stream"]["engine_usage"]["completion_tokens"] == 8
    assert report["non_stream_receipt"]["outcome"] == "length"
    assert report["adapter"]["stats"]["streams_dropped"] == 0
