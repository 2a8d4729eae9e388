"""Every ``/v1/responses`` fault produces its bytes (``RESPONSES_FAULTS``)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable

import pytest

from gateway.testing.simulator import RESPONSES_FAULTS, Simulator
from tests.testing.simulator.wire import Raw, exchange, http_request, parse, read_raw, sse_events

RESPONSES = "/v1/responses"
ERROR_EVENT = (
    b'event: error\ndata: {"type":"error","sequence_number":6,'
    b'"error":{"type":"internal_error","message":"simulated engine error"}}'
)


def _names(raw: Raw) -> list[str | None]:
    return [e.name for e in sse_events(raw.body)]


def _deltas(raw: Raw) -> list[str]:
    events = sse_events(raw.body)
    return [e.json()["delta"] for e in events if e.name == "response.output_text.delta"]


def _terminal(raw: Raw) -> dict[str, object]:
    (event,) = [e for e in sse_events(raw.body) if e.name == "response.completed"]
    response: dict[str, object] = event.json()["response"]
    return response


def _usage(raw: Raw) -> dict[str, int]:
    usage = _terminal(raw)["usage"]
    assert isinstance(usage, dict)
    return usage


def _ends_well(raw: Raw) -> bool:
    return _names(raw)[-2:] == ["response.completed", None] and raw.body.endswith(
        b"data: [DONE]\n\n"
    )


def _ids(raw: Raw) -> list[str]:
    events = [e.json() for e in sse_events(raw.body) if e.name]
    return [e["response"]["id"] for e in events if "response" in e]


def _seq(raw: Raw) -> list[int]:
    return [e.json()["sequence_number"] for e in sse_events(raw.body) if e.name]


def _gzip_sse(raw: Raw) -> bool:
    encoded = raw.header("content-encoding") == "gzip"
    return encoded and gzip.decompress(raw.body).endswith(b"data: [DONE]\n\n")


FAULT_CHECKS: dict[str, Callable[[Raw], bool]] = {
    "missing_done": lambda r: r.terminated and _names(r)[-1] == "response.completed",
    "close_mid": lambda r: not r.terminated and len(_deltas(r)) == 2,
    "error_json": lambda r: r.events()[-2:] == [ERROR_EVENT, b"data: [DONE]"],
    "error_first": lambda r: (
        _names(r) == ["response.created", "error", None]
        and sse_events(r.body)[1].json()["sequence_number"] == 1
    ),
    "id_change": lambda r: len(set(_ids(r))) == 2 and _ids(r)[0] != _ids(r)[-1],
    "named_event": lambda r: "agentic_tool_call_progress" in _names(r) and _ends_well(r),
    "after_done": lambda r: _names(r)[-2:] == [None, "response.output_text.delta"],
    "bad_usage": lambda r: (
        _usage(r)["total_tokens"] == _usage(r)["input_tokens"] + _usage(r)["output_tokens"] + 1
    ),
    "too_many_tokens": lambda r: _usage(r)["output_tokens"] == 11,
    "nul_text": lambda r: _deltas(r)[2] == "sim-\x00-nul " and _ends_well(r),
    "invalid_utf8": lambda r: b'"delta":"sim-\xff\xfe-bad "' in r.body,
    "seq_gap": lambda r: _seq(r) == [0, 1, 2, 3, 4, 5, *range(7, 13)],
    "hang": lambda r: r.status == 200 and r.body == b"" and r.ending == "timeout",
    "hang_headers": lambda r: r.head_bytes == 0 and r.ending == "timeout",
    "hang_mid": lambda r: len(_deltas(r)) == 2 and r.ending == "timeout" and not r.terminated,
    "json_body": lambda r: (
        r.header("content-type") == "application/json"
        and json.loads(r.body)["object"] == "response"
    ),
    "wrong_content_type": lambda r: (
        r.header("content-type") == "text/plain; charset=utf-8" and _ends_well(r)
    ),
    "gzip": _gzip_sse,
    "redirect": lambda r: r.status == 307 and r.header("location") == "/sim/redirected",
    "wrong_request_id": lambda r: r.header("x-request-id") not in (None, "mine-1"),
    "no_request_id": lambda r: r.header("x-request-id") is None,
    "huge_headers": lambda r: r.head_bytes > 200 * 1024 and _ends_well(r),
    "endless_line": lambda r: r.body.startswith(b"data: xxx") and b"\n" not in r.body,
}

_SLOW = {"hang", "hang_headers", "hang_mid"}


def test_every_fault_has_a_check() -> None:
    assert set(FAULT_CHECKS) == RESPONSES_FAULTS


@pytest.mark.parametrize("fault", sorted(FAULT_CHECKS))
def test_fault_produces_its_bytes(sim: Simulator, fault: str) -> None:
    sim.reset()
    body = {"input": f"[[sim chunks=4 fault={fault}]]", "stream": True, "max_output_tokens": 10}
    request = http_request(RESPONSES, body, headers={"x-request-id": "mine-1"})
    timeout = 0.3 if fault in _SLOW else 5.0
    if fault == "endless_line":
        raw = parse(exchange(sim.port, request, timeout, limit=1 << 20))
    else:
        raw = read_raw(sim.port, request, timeout)
    assert FAULT_CHECKS[fault](raw), raw
    if fault == "endless_line":
        assert sim.wait_for(lambda: sim.active_streams == 0, 2)


def test_mid_faults_with_no_chunks_hit_the_final_delta(sim: Simulator) -> None:
    sim.reset()
    body = {"input": "[[sim chunks=0 fault=nul_text]]", "stream": True}
    raw = read_raw(sim.port, http_request(RESPONSES, body))
    assert _deltas(raw) == ["sim-\x00-nul "]
    assert _terminal(raw)["output_text"] == "sim-\x00-nul "
    body = {"input": "[[sim chunks=0 fault=close_mid]]", "stream": True}
    raw = read_raw(sim.port, http_request(RESPONSES, body))
    assert _names(raw) == ["response.created"] and not raw.terminated


@pytest.mark.parametrize(
    ("fault", "check"),
    [
        ("bad_usage", lambda b: b["usage"]["total_tokens"] == b["usage"]["input_tokens"] + 5),
        ("too_many_tokens", lambda b: b["usage"]["output_tokens"] == 11),
        ("nul_text", lambda b: "\x00" in b["output_text"]),
        ("missing_done", lambda b: b["status"] == "completed"),  # stream-only: no effect
    ],
)
def test_non_stream_body_faults(
    sim: Simulator, fault: str, check: Callable[[dict[str, object]], bool]
) -> None:
    sim.reset()
    body = {"input": f"[[sim chunks=4 fault={fault}]]", "max_output_tokens": 10}
    raw = read_raw(sim.port, http_request(RESPONSES, body))
    assert raw.status == 200 and check(json.loads(raw.body))


def test_non_stream_invalid_utf8_and_close_mid(sim: Simulator) -> None:
    sim.reset()
    body = {"input": "[[sim chunks=4 fault=invalid_utf8]]"}
    raw = read_raw(sim.port, http_request(RESPONSES, body))
    assert raw.status == 200 and b"sim-\xff\xfe-bad " in raw.body
    body = {"input": "[[sim chunks=4 fault=close_mid]]"}
    raw = read_raw(sim.port, http_request(RESPONSES, body))
    assert raw.head_bytes == 0 and raw.ending in ("eof", "reset")


def test_a_chat_fault_of_another_dialect_is_refused(sim: Simulator) -> None:
    sim.reset()
    body = {"messages": "[[sim fault=seq_gap]]"}
    raw = read_raw(sim.port, http_request("/v1/chat/completions", body))
    assert raw.status == 400
    assert raw.body == b"simulator: fault 'seq_gap' does not apply to /v1/chat/completions"
