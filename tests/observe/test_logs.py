"""The JSON-lines handler: access lines held briefly, every line in order."""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator

import orjson
import pytest

from gateway.observe.logs import JsonFormatter, JsonLinesHandler, access_writer
from tests.support.poll import eventually_async

_FIELDS = {
    "request_id": "req_1",
    "tenant": "acme",
    "route": "chat.completions",
    "method": "POST",
    "status": 200,
    "outcome": "complete",
    "error_code": None,
    "duration_ms": 1.5,
}


@pytest.fixture
def handler() -> Iterator[JsonLinesHandler]:
    made = JsonLinesHandler()
    made.setStream(io.StringIO())
    made.setFormatter(JsonFormatter())
    yield made
    made.close()


def _lines(handler: JsonLinesHandler) -> list[dict[str, object]]:
    stream = handler.stream
    assert isinstance(stream, io.StringIO)
    return [orjson.loads(line) for line in stream.getvalue().splitlines()]


async def test_an_access_line_is_held_then_written_within_hold_s(handler: JsonLinesHandler) -> None:
    handler.access(_FIELDS)
    assert _lines(handler) == []  # held, not yet written
    await eventually_async(lambda: bool(_lines(handler)), "the held line written", 5)
    (line,) = _lines(handler)
    assert {k: line[k] for k in _FIELDS} == _FIELDS
    assert (line["level"], line["logger"], line["msg"]) == ("info", "gateway.access", "request")
    assert isinstance(line["ts"], str) and line["ts"].endswith("Z")


async def test_other_records_come_after_the_access_lines_made_before_them(
    handler: JsonLinesHandler,
) -> None:
    handler.access({**_FIELDS, "request_id": "req_a"})
    handler.access({**_FIELDS, "request_id": "req_b"})
    record = logging.LogRecord("gateway", logging.WARNING, __file__, 1, "later", None, None)
    handler.handle(record)
    lines = _lines(handler)
    assert [line.get("request_id", line["msg"]) for line in lines] == ["req_a", "req_b", "later"]


async def test_hold_lines_lines_go_out_at_once_and_flush_writes_the_rest(
    handler: JsonLinesHandler,
) -> None:
    for n in range(JsonLinesHandler.HOLD_LINES + 1):
        handler.access({**_FIELDS, "request_id": f"req_{n}"})
    assert len(_lines(handler)) == JsonLinesHandler.HOLD_LINES
    handler.flush()  # what logging.shutdown does at exit
    assert len(_lines(handler)) == JsonLinesHandler.HOLD_LINES + 1


async def test_an_access_line_carries_only_the_access_keys(handler: JsonLinesHandler) -> None:
    handler.access({**_FIELDS, "prompt": "secret words"})
    handler.flush()
    (line,) = _lines(handler)
    assert "prompt" not in line
    assert "secret words" not in str(line)


def test_without_the_handler_access_lines_go_through_the_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("gateway.access")
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        access_writer(logger)(_FIELDS)
    (record,) = [r for r in caplog.records if r.name == "gateway.access"]
    assert record.getMessage() == "request"
    assert record.__dict__["request_id"] == "req_1"


async def test_a_record_from_another_thread_leaves_the_loops_timer_alone(
    handler: JsonLinesHandler,
) -> None:
    handler.access({**_FIELDS, "request_id": "req_held"})
    timer = handler._timer
    assert timer is not None
    record = logging.LogRecord("gateway", logging.WARNING, __file__, 1, "off loop", None, None)
    thread = threading.Thread(target=handler.handle, args=(record,))
    thread.start()
    thread.join(5)
    assert [line.get("request_id", line["msg"]) for line in _lines(handler)] == [
        "req_held",
        "off loop",
    ]
    assert handler._timer is timer and not timer.cancelled()  # only the loop touches it
    handler.access({**_FIELDS, "request_id": "req_after"})
    await eventually_async(lambda: len(_lines(handler)) == 3, "the later line written", 5)
    assert handler._timer is None
