"""Cancellation the worker confirms, and where the time went (spec §20, issue 24).

The simulator's ``/metrics`` speaks the engine's sequence families; a
canceled stream keeps counting as running there for ``confirm_delay_s``
(``gateway/testing/simulator/metrics.py``), as a sequence the engine notices
only at its next token send.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.poll import eventually
from tests.support.stack import Stack, chat_body, running_stack

_ONE_PERMIT = {"capacity": 1, "max_queue": 16}
_PATIENT = {"admission": {"queue_timeout_s": 20}}


def _open_stream(
    stack: Stack, request_id: str, directive: str = "chunks=400 delay_ms=20"
) -> socket.socket:
    payload = json.dumps(chat_body(f"[[sim {directive}]]", stream=True)).encode()
    sock = socket.create_connection(("127.0.0.1", stack.gw.server.port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"authorization: Bearer {stack.rs256()}\r\nx-request-id: {request_id}\r\n".encode()
        + f"content-length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def _cancel(stack: Stack, request_id: str) -> float:
    """Open a stream, read its first bytes, leave; the monotonic time of leaving."""
    active = stack.sim.active_streams
    sock = _open_stream(stack, request_id)
    try:
        assert sock.recv(4096)
        assert stack.sim.wait_for(lambda: stack.sim.active_streams == active + 1, 5)
    finally:
        left = time.monotonic()
        sock.close()
    return left


def test_the_next_request_waits_for_the_workers_confirmation(tmp_path: Path) -> None:
    with running_stack(tmp_path, admission=_ONE_PERMIT, acme=_PATIENT) as stack:
        stack.sim.set_metrics(confirm_delay_s=2.0)
        left = _cancel(stack, "canceled-1")
        with stack.client() as client:
            answer = client.post("/v1/chat/completions", json=chat_body("[[sim chunks=2]]"))
        waited = time.monotonic() - left
        assert answer.status_code == 200
        assert waited >= 1.8, waited
        receipt = stack.receipt("canceled-1")
        assert receipt["outcome"] == "canceled"
        assert receipt["cancellation"] == [
            "caller_disconnected",
            "upstream_closed",
            "worker_confirmed",
        ]
        nxt = stack.receipt(answer.headers["x-request-id"])
        assert nxt["timings_ms"]["admission"] >= 1000  # it queued behind the held permit
        assert stack.metric("gateway_cancel_confirm_seconds_count", upstream="default") == 1
        assert stack.metric("gateway_cancel_confirm_seconds_sum", upstream="default") >= 1.8
        assert eventually(lambda: stack.metric("gateway_permits_in_use") == 0)


def test_a_worker_that_never_confirms_gets_its_permits_back_at_the_timeout(
    tmp_path: Path,
) -> None:
    upstream = {"confirm_cancel": {"timeout_s": 1.0}}
    with running_stack(tmp_path, admission=_ONE_PERMIT, acme=_PATIENT, upstream=upstream) as stack:
        stack.sim.set_metrics(confirm_delay_s=None)
        left = _cancel(stack, "never-confirmed")
        assert eventually(lambda: stack.metric("gateway_permits_in_use") == 1, timeout_s=1)
        receipt = stack.receipt("never-confirmed", timeout_s=5)
        assert time.monotonic() - left >= 0.9
        assert receipt["cancellation"][-1] == "confirm_timeout"
        assert eventually(lambda: stack.metric("gateway_permits_in_use") == 0)
        assert stack.metric("gateway_cancel_unconfirmed_total", upstream="default") == 1
        assert stack.sim.canceled_running == 1  # the worker really is still busy with it


@pytest.mark.parametrize("mode", ["404", "503", "http_only"])
def test_a_worker_without_sequence_metrics_holds_nothing_and_is_logged_once(
    tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.cancel")
    with running_stack(tmp_path, admission=_ONE_PERMIT, acme=_PATIENT) as stack:
        stack.sim.set_metrics(mode=mode, confirm_delay_s=30.0)
        for n in range(2):
            _cancel(stack, f"unconfirmable-{n}")
            receipt = stack.receipt(f"unconfirmable-{n}")
            assert receipt["cancellation"][-1] == "unconfirmable"
        with stack.client() as client:
            started = time.monotonic()
            answer = client.post("/v1/chat/completions", json=chat_body("[[sim chunks=2]]"))
        assert answer.status_code == 200
        assert time.monotonic() - started < 10  # never the worker's 30 s
        lines = [r.getMessage() for r in caplog.records if r.name == "gateway.cancel"]
        assert len(lines) == 1, lines
        assert "cannot confirm" in lines[0] and "default" in lines[0]


def test_several_cancels_are_released_one_by_one(tmp_path: Path) -> None:
    admission = {"capacity": 3, "max_queue": 16}
    with running_stack(tmp_path, admission=admission, acme=_PATIENT) as stack:
        stack.sim.set_metrics(confirm_delay_s=1.0)
        for n in range(3):
            _cancel(stack, f"one-by-one-{n}")
            time.sleep(0.4)  # staggered cancels: the worker notices each in its turn
        seen: list[float] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            value = stack.metric("gateway_permits_in_use")
            if not seen or seen[-1] != value:
                seen.append(value)
            if value == 0:
                break
            time.sleep(0.02)
        assert seen[-1] == 0
        assert [v for v in seen if v in (1.0, 2.0)] == sorted(
            [v for v in seen if v in (1.0, 2.0)], reverse=True
        )
        assert 1.0 in seen  # not all three at once
        written = [stack.receipt(f"one-by-one-{n}")["cancellation"][-1] for n in range(3)]
        assert written == ["worker_confirmed"] * 3


def test_no_metrics_poll_while_nothing_is_canceled(tmp_path: Path) -> None:
    with running_stack(tmp_path) as stack:
        with stack.client() as client:
            for _ in range(5):
                response = client.post(
                    "/v1/chat/completions", json=chat_body("[[sim chunks=2]]", stream=True)
                )
                assert response.status_code == 200
        assert stack.sim.metrics_requests == 0
        _cancel(stack, "polled")
        stack.receipt("polled")
        polled = stack.sim.metrics_requests
        assert polled >= 1
        time.sleep(0.5)  # five poll intervals with nothing held: none may come
        assert stack.sim.metrics_requests == polled


@pytest.mark.parametrize("mode", ["huge", "slow"])
def test_a_hostile_metrics_answer_is_bounded(tmp_path: Path, mode: str) -> None:
    upstream = {"confirm_cancel": {"timeout_s": 1.5}, "readiness_timeout_s": 0.5}
    with running_stack(tmp_path, acme=_PATIENT, upstream=upstream) as stack:
        stack.sim.set_metrics(mode=mode)
        left = _cancel(stack, f"hostile-{mode}")
        receipt = stack.receipt(f"hostile-{mode}", timeout_s=10)
        assert receipt["cancellation"][-1] == "confirm_timeout"
        assert 1.4 <= time.monotonic() - left < 8
        with stack.client() as client:
            assert client.post("/v1/chat/completions", json=chat_body()).status_code == 200
        assert eventually(lambda: stack.metric("gateway_permits_in_use") == 0)


def test_a_gateway_idle_timeout_holds_the_permits_too(tmp_path: Path) -> None:
    upstream = {"idle_timeout_s": 0.3}
    with running_stack(tmp_path, admission=_ONE_PERMIT, acme=_PATIENT, upstream=upstream) as stack:
        stack.sim.set_metrics(confirm_delay_s=1.5)
        with stack.client() as client:
            started = time.monotonic()
            timed_out = client.post(
                "/v1/chat/completions",
                json=chat_body("[[sim chunks=4 fault=hang_mid]]", stream=True),
            )
            assert "upstream_timeout" in timed_out.text
            after = client.post("/v1/chat/completions", json=chat_body("[[sim chunks=2]]"))
        assert after.status_code == 200
        assert time.monotonic() - started >= 1.5
        receipt = stack.receipt(timed_out.headers["x-request-id"])
        assert receipt["error_code"] == "upstream_timeout"
        assert receipt["cancellation"] == ["upstream_closed", "worker_confirmed"]


def test_timings_are_present_ordered_and_plausible(tmp_path: Path) -> None:
    with running_stack(tmp_path, admission=_ONE_PERMIT, acme=_PATIENT) as stack:
        with stack.client() as client:
            slow = client.post(
                "/v1/chat/completions",
                json=chat_body("[[sim first_delay_ms=300 chunks=2]]", stream=True),
            )
        receipt = stack.receipt(slow.headers["x-request-id"])
        timings = receipt["timings_ms"]
        assert list(timings) == [
            "auth",
            "plan",
            "limits",
            "admission",
            "media",
            "upstream_head",
            "first_token",
            "total",
        ]
        assert timings["media"] is None  # no evidence, no inline data
        assert all(timings[k] is not None and timings[k] >= 0 for k in timings if k != "media")
        assert timings["first_token"] >= 300
        assert timings["upstream_head"] <= timings["first_token"]
        assert timings["first_token"] <= timings["total"]
        assert timings["total"] <= receipt["duration_ms"] + 0.001

        # A request queued behind a stream shows its wait in `admission`.
        results: list[httpx.Response] = []

        def long_stream() -> None:
            with stack.client() as c:
                results.append(
                    c.post(
                        "/v1/chat/completions",
                        json=chat_body("[[sim chunks=10 delay_ms=50]]", stream=True),
                    )
                )

        first = threading.Thread(target=long_stream)
        first.start()
        assert stack.sim.wait_for(lambda: stack.sim.active_streams == 1, 5)
        with stack.client() as client:
            queued = client.post("/v1/chat/completions", json=chat_body("[[sim chunks=2]]"))
        first.join(10)
        assert results and results[0].status_code == 200
        waited = stack.receipt(queued.headers["x-request-id"])["timings_ms"]
        assert waited["admission"] >= 200
        histogram = stack.metric("gateway_stage_seconds_count", stage="first_token")
        assert histogram >= 3
