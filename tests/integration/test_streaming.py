"""Validated re-streaming, faults, timeouts, cancellation, receipts (issue 3).

Each simulator fault is driven through the real gateway; the caller must get
either an HTTP error (failure before the first byte) or one final SSE error
event and never ``[DONE]``, and the receipt must say what happened.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.testing.simulator.plans import UNICODE_WORDS
from tests.support.faults import CHAT_FAULTS, STATUS
from tests.support.stack import Stack, chat_body, running_stack, sse_data, worker_posts

# Small timeouts keep every timeout test to about a second.
FAST = {
    "first_event_timeout_s": 0.6,
    "idle_timeout_s": 0.6,
    "total_timeout_s": 5,
    "max_line_bytes": 65_536,
}


@pytest.fixture(scope="module")
def fast_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    mp = pytest.MonkeyPatch()
    from gateway.testing.harness import DEMO_SECRET_ENV
    from tests.support.jwt import HS_SECRET

    mp.setenv(DEMO_SECRET_ENV, HS_SECRET)
    try:
        with running_stack(tmp_path_factory.mktemp("fast"), upstream=FAST) as stack:
            yield stack
    finally:
        mp.undo()


def _result(response: httpx.Response) -> tuple[int, str | None, bool]:
    """(status, error code or None, saw [DONE])."""
    if response.status_code != 200:
        return response.status_code, response.json()["error"]["code"], False
    data = sse_data(response.text)
    done = bool(data) and data[-1] == "[DONE]"
    if done:
        assert data.count("[DONE]") == 1
        return 200, None, True
    last = json.loads(data[-1])
    return 200, last["error"]["code"], False


FAULTS = CHAT_FAULTS


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_every_fault(fast_stack: Stack, fault: str, stream: bool) -> None:
    code, outcome, column = FAULTS[fault]
    body = chat_body(f"go [[sim fault={fault} chunks=6]]", stream=stream)
    with fast_stack.client(timeout=10) as client:
        response = client.post("/v1/chat/completions", json=body)
    status, got, done = _result(response)
    assert not done, "a failed stream never ends with [DONE]"
    assert got == code
    # Each fault in its one column: a streaming caller gets the event only when
    # the worker's first event passed; a non-streaming caller always an HTTP error.
    expected = 200 if stream and column == "event" else STATUS[code]
    assert status == expected
    receipt = fast_stack.receipt(response.headers["x-request-id"])
    assert receipt["outcome"] == outcome
    assert receipt["error_code"] == code
    # Usage is never lost: reported if the terminal chunk arrived, else estimated.
    assert receipt["usage"]["source"] in ("reported", "estimated")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_nul_in_text_is_replaced_by_default(fast_stack: Stack, stream: bool) -> None:
    # Real models emit U+0000 via byte-fallback tokens (spec §14): not a violation.
    body = chat_body("go [[sim fault=nul_text chunks=4]]", stream=stream)
    with fast_stack.client(timeout=10) as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    if stream:
        data = sse_data(response.text)
        assert data[-1] == "[DONE]"
        text = "".join(
            json.loads(d)["choices"][0]["delta"]["content"] or "" for d in data[:-1] if d
        )
    else:
        text = response.json()["choices"][0]["message"]["content"]
    assert "\x00" not in text and "\ufffd" in text
    receipt = fast_stack.receipt(response.headers["x-request-id"])
    assert receipt["outcome"] == "complete"
    assert receipt["nul_replaced"] == text.count("\ufffd") == 1


def test_nul_in_text_refused_under_reject(tmp_path: Path) -> None:
    with running_stack(tmp_path, upstream={**FAST, "text_nul": "reject"}) as stack:
        body = chat_body("go [[sim fault=nul_text chunks=4]]", stream=True)
        with stack.client(timeout=10) as client:
            response = client.post("/v1/chat/completions", json=body)
        status, code, done = _result(response)
        assert (status, code, done) == (200, "upstream_protocol_error", False)
        receipt = stack.receipt(response.headers["x-request-id"])
        assert receipt["outcome"] == "protocol_error" and receipt["nul_replaced"] == 0


def test_no_request_id_echo_is_fine(fast_stack: Stack) -> None:
    with fast_stack.client() as client:
        response = client.post(
            "/v1/chat/completions", json=chat_body("[[sim fault=no_request_id]]")
        )
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("directive", "status", "code"),
    [("status=500", 502, "upstream_error"), ("status=422", 400, "upstream_rejected")],
)
def test_worker_http_errors(fast_stack: Stack, directive: str, status: int, code: str) -> None:
    with fast_stack.client() as client:
        response = client.post("/v1/chat/completions", json=chat_body(f"[[sim {directive}]]"))
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert "simulated" not in response.text, "worker error text is not passed through"
    assert fast_stack.receipt(response.headers["x-request-id"])["outcome"] == "upstream_error"


def test_canceled_finish(fast_stack: Stack) -> None:
    body = chat_body("[[sim finish=canceled chunks=3]]", stream=True)
    with fast_stack.client() as client:
        response = client.post("/v1/chat/completions", json=body)
    _, code, done = _result(response)
    assert (code, done) == ("upstream_error", False)
    assert fast_stack.receipt(response.headers["x-request-id"])["outcome"] == "canceled"


def test_sdk_sees_error_event_and_no_done(fast_stack: Stack) -> None:
    client = fast_stack.sdk(timeout=600)
    stream = client.chat.completions.create(
        model="gemma-4-mm",
        messages=[{"role": "user", "content": "[[sim fault=error_json chunks=6]]"}],
        stream=True,
    )
    with pytest.raises(openai.APIError) as info:
        for _ in stream:
            pass
    assert "inference worker" in str(info.value.message)


def test_keepalives_forwarded_and_unicode_split(fast_stack: Stack) -> None:
    body = chat_body(
        "[[sim chunks=4 unicode=1 split=1 first_delay_ms=250 keepalive_ms=100]]", stream=True
    )
    with fast_stack.client() as client:
        response = client.post("/v1/chat/completions", json=body)
    assert ":\n\n" in response.text, "keep-alives reach the caller"
    data = sse_data(response.text)
    assert data[-1] == "[DONE]"
    text = "".join(json.loads(d)["choices"][0]["delta"]["content"] or "" for d in data[:-1])
    # Every multi-byte character survived being split across one-byte writes.
    assert text == "".join(f"sim-{w}-{i} " for i, w in enumerate(UNICODE_WORDS[:4]))


def test_non_streaming_equals_stream_content(fast_stack: Stack) -> None:
    with fast_stack.client() as client:
        streamed = client.post(
            "/v1/chat/completions", json=chat_body("[[sim chunks=7 unicode=1]]", stream=True)
        )
        whole = client.post("/v1/chat/completions", json=chat_body("[[sim chunks=7 unicode=1]]"))
    chunks = [json.loads(d) for d in sse_data(streamed.text)[:-1]]
    text = "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks)
    body = whole.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == text
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["model"] == "gemma-4-mm"
    assert body["usage"]["completion_tokens"] == 7
    # The worker was asked for a stream both times (spec §9).
    inference = [r for r in fast_stack.sim.requests() if r.path == "/v1/chat/completions"]
    assert all(r.json is not None and r.json["stream"] is True for r in inference[-2:])


def test_tool_calls_assembled(fast_stack: Stack) -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    with fast_stack.client() as client:
        response = client.post(
            "/v1/chat/completions", json=chat_body("[[sim tool_call=1 chunks=2]]", tools=tools)
        )
    body = response.json()
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    [call] = body["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "lookup"
    assert json.loads(call["function"]["arguments"]) == {"q": 1}


def test_completions_usage_is_estimated(fast_stack: Stack) -> None:
    with fast_stack.client() as client:
        response = client.post(
            "/v1/completions",
            json={"model": "gemma-4-mm", "prompt": "hi [[sim chunks=5]]", "stream": True},
        )
    assert sse_data(response.text)[-1] == "[DONE]"
    receipt = fast_stack.receipt(response.headers["x-request-id"])
    assert receipt["outcome"] == "complete"
    assert receipt["usage"]["source"] == "estimated"
    assert receipt["usage"]["completion_tokens"] >= 5


def test_receipt_fields_for_a_good_stream(fast_stack: Stack) -> None:
    import hashlib

    with fast_stack.client() as client:
        response = client.post(
            "/v1/chat/completions", json=chat_body("[[sim chunks=3]]", stream=True, max_tokens=50)
        )
    rid = response.headers["x-request-id"]
    receipt = fast_stack.receipt(rid)
    [seen] = [r for r in fast_stack.sim.requests() if r.headers.get("x-request-id") == rid]
    assert receipt["request_sha256"] == hashlib.sha256(seen.body).hexdigest()
    assert receipt["request_bytes"] == len(seen.body)
    assert receipt["usage"]["source"] == "reported"
    assert set(receipt["usage"]["reported"]) >= {"avg_tok_per_sec", "total_time_sec"}
    assert receipt["max_tokens"] == 50 and receipt["stream"] is True
    assert receipt["finish_reason"] == "stop" and receipt["cancellation"] == []
    assert receipt["ttft_ms"] is not None and receipt["duration_ms"] >= receipt["ttft_ms"]
    assert len(receipt["stream_sha256"]) == 64
    raw = json.dumps(receipt)
    assert "sim-token" not in raw and "[[sim" not in raw, "no prompt or output text"


def _raw_request(stack: Stack, body: dict[str, Any]) -> socket.socket:
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", stack.gw.server.port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"authorization: Bearer {stack.rs256()}\r\n".encode()
        + b"x-request-id: disconnect-"
        + str(time.monotonic_ns()).encode()
        + b"\r\n"
        + f"content-length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


@pytest.mark.parametrize(
    ("directive", "read_first"),
    [("chunks=200 delay_ms=20", True), ("first_delay_ms=3000 chunks=2", False)],
    ids=["mid_stream", "before_first_token"],
)
def test_disconnect_closes_the_worker_connection(
    tmp_path: Path, directive: str, read_first: bool
) -> None:
    with running_stack(tmp_path) as stack:
        sock = _raw_request(stack, chat_body(f"[[sim {directive}]]", stream=True))
        if read_first:
            sock.recv(4096)
        assert stack.sim.wait_for(lambda: stack.sim.active_streams == 1, 5)
        closed_at = time.monotonic()
        sock.close()
        assert stack.sim.wait_for(
            lambda: any(r.disconnected_at is not None for r in stack.sim.requests()), 2
        )
        [request] = [r for r in stack.sim.requests() if r.path == "/v1/chat/completions"]
        assert request.disconnected_at is not None
        # A figure, not a timed assertion: the deadline above is what must hold.
        lag_ms = 1000 * (request.disconnected_at - closed_at)
        print(f"the worker saw the disconnect {lag_ms:.1f} ms after the caller left")
        rid = request.headers["x-request-id"]
        receipt = stack.receipt(rid)
        assert receipt["outcome"] == "canceled"
        assert receipt["cancellation"] == [
            "caller_disconnected",
            "upstream_closed",
            "worker_confirmed",
        ]
        assert receipt["usage"]["source"] == "estimated"
        assert stack.metric("gateway_permits_in_use") == 0


def test_non_streaming_disconnect_frees_worker(tmp_path: Path) -> None:
    with running_stack(tmp_path) as stack:
        sock = _raw_request(stack, chat_body("[[sim chunks=200 delay_ms=20]]"))
        assert stack.sim.wait_for(lambda: stack.sim.active_streams == 1, 5)
        sock.close()
        assert stack.sim.wait_for(
            lambda: any(r.disconnected_at is not None for r in stack.sim.requests()), 2
        )
        # The last POST: the readiness poll's GETs interleave with it.
        rid = worker_posts(stack.sim)[-1].headers["x-request-id"]
        assert stack.receipt(rid)["outcome"] == "canceled"


def test_total_timeout(tmp_path: Path) -> None:
    upstream = {"total_timeout_s": 0.5, "idle_timeout_s": 5, "first_event_timeout_s": 5}
    with running_stack(tmp_path, upstream=upstream) as stack:
        with stack.client() as client:
            response = client.post(
                "/v1/chat/completions", json=chat_body("[[sim chunks=50 delay_ms=50]]", stream=True)
            )
        status, code, done = _result(response)
        assert (status, code, done) == (200, "upstream_timeout", False)
        assert stack.receipt(response.headers["x-request-id"])["outcome"] == "incomplete"


def test_connection_refused(tmp_path: Path) -> None:
    # The worker dies between two readiness polls: the last poll said ready.
    upstream = {"readiness_poll_s": 600}
    with running_stack(tmp_path, upstream=upstream) as stack:
        stack.sim.stop()
        assert stack.runtime.accepting()
        with stack.client() as client:
            response = client.post("/v1/chat/completions", json=chat_body())
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "upstream_unavailable"
        assert stack.receipt(response.headers["x-request-id"])["outcome"] == "upstream_error"
