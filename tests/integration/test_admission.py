"""Admission permits and rate limits through the real gateway (issue 5)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import httpx

from gateway.testing.samples import SAMPLES
from tests.support.stack import Stack, chat_body, running_stack, sse_data


def _stream(stack: Stack, text: str, results: list[Any], token: str) -> None:
    with httpx.Client(base_url=stack.url, headers=stack.headers(token), timeout=20) as client:
        response = client.post("/v1/chat/completions", json=chat_body(text, stream=True))
        results.append((response.status_code, sse_data(response.text)[-1:], response.headers))


def test_capacity_bounds_worker_concurrency(tmp_path: Path) -> None:
    with running_stack(
        tmp_path,
        admission={"capacity": 2, "max_queue": 64},
        acme={"admission": {"share": 1, "max_permits": 2, "queue_timeout_s": 20}},
    ) as stack:
        token = stack.rs256()
        results: list[Any] = []
        threads = [
            threading.Thread(
                target=_stream, args=(stack, "[[sim chunks=10 delay_ms=20]]", results, token)
            )
            for _ in range(10)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert [r[0] for r in results] == [200] * 10
        assert all(r[1] == ["[DONE]"] for r in results)
        assert stack.sim.max_active_streams == 2
        # Permits are released in each request's finally, just after its last byte.
        assert stack.sim.wait_for(lambda: stack.metric("gateway_permits_in_use") == 0, 5)
        assert stack.metric("gateway_admission_queue_depth") == 0
        waited = stack.metric("gateway_admission_wait_seconds_count")
        assert waited == 10


def test_rate_limit_headers_and_429(tmp_path: Path) -> None:
    with running_stack(
        tmp_path, acme={"limits": {"requests_per_minute": 2, "tokens_per_minute": 100_000}}
    ) as stack:
        with stack.client() as client:
            ok = client.post("/v1/chat/completions", json=chat_body(max_tokens=10))
            client.post("/v1/chat/completions", json=chat_body(max_tokens=10))
            refused = client.post("/v1/chat/completions", json=chat_body(max_tokens=10))
        assert ok.status_code == 200
        assert ok.headers["x-ratelimit-limit-requests"] == "2"
        assert ok.headers["x-ratelimit-remaining-requests"] == "1"
        assert "x-ratelimit-reset-requests" in ok.headers
        assert ok.headers["x-ratelimit-limit-tokens"] == "100000"
        assert {"x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"} <= set(ok.headers)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limited"
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        inference = [r for r in stack.sim.requests() if r.path == "/v1/chat/completions"]
        assert len(inference) == 2
        receipt = stack.receipt(refused.headers["x-request-id"])
        assert (receipt["outcome"], receipt["error_code"]) == ("rejected", "rate_limited")


def test_token_budget_refunded_after_usage(tmp_path: Path) -> None:
    # 1000 tokens/min; each request reserves max_tokens 400 + prompt, uses ~10.
    with running_stack(tmp_path, acme={"limits": {"tokens_per_minute": 1000}}) as stack:
        with stack.client() as client:
            statuses = [
                client.post(
                    "/v1/chat/completions", json=chat_body("[[sim chunks=2]]", max_tokens=400)
                ).status_code
                for _ in range(5)
            ]
        assert statuses == [200] * 5, "unused reservation is refunded once usage is known"


def _hold_stream(stack: Stack, token: str) -> socket.socket:
    import json

    payload = json.dumps(chat_body("[[sim chunks=100 delay_ms=50]]", stream=True)).encode()
    sock = socket.create_connection(("127.0.0.1", stack.gw.server.port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"authorization: Bearer {token}\r\ncontent-length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def test_queue_full_and_admission_timeout(tmp_path: Path) -> None:
    with running_stack(
        tmp_path,
        admission={"capacity": 1, "max_queue": 1},
        acme={"admission": {"share": 1, "max_permits": 1, "queue_timeout_s": 0.3}},
    ) as stack:
        token = stack.rs256()
        holder = _hold_stream(stack, token)
        try:
            assert stack.sim.wait_for(lambda: stack.sim.active_streams == 1, 5)
            results: list[Any] = []
            waiter = threading.Thread(
                target=lambda: results.append(
                    httpx.post(
                        stack.url + "/v1/chat/completions",
                        json=chat_body(),
                        headers=stack.headers(token),
                        timeout=10,
                    )
                )
            )
            waiter.start()
            assert stack.sim.wait_for(lambda: stack.metric("gateway_admission_queue_depth") == 1, 5)
            with stack.client(token) as client:
                full = client.post("/v1/chat/completions", json=chat_body())
            waiter.join(10)
            [timed_out] = results
        finally:
            holder.close()
        assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
        assert int(full.headers["retry-after"]) >= 1
        assert timed_out.status_code == 429
        assert timed_out.json()["error"]["code"] == "admission_timeout"
        assert int(timed_out.headers["retry-after"]) >= 1
        assert stack.sim.wait_for(lambda: stack.metric("gateway_permits_in_use") == 0, 5)


def test_weight_exceeded(tmp_path: Path) -> None:
    with running_stack(
        tmp_path, acme={"admission": {"share": 1, "max_permits": 2, "queue_timeout_s": 5}}
    ) as stack:
        with stack.client() as client:
            ids = []
            for name, mime in (("tiny.png", "image/png"), ("tiny.mp4", "video/mp4")):
                uploaded = client.post(
                    "/v1/evidence", content=SAMPLES[name](), headers={"content-type": mime}
                )
                ids.append(uploaded.json()["id"])
            content = [
                {"type": "image_url", "image_url": {"url": f"evidence:{ids[0]}"}},
                {"type": "video_url", "video_url": {"url": f"evidence:{ids[1]}"}},
                {"type": "text", "text": "x"},
            ]
            body = {"model": "gemma-4-mm", "messages": [{"role": "user", "content": content}]}
            response = client.post("/v1/chat/completions", json=body)
        # weight = base 1 + image 1 + video 2 = 4 > max_permits 2
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "admission_weight_exceeded"
        # Leases are released in the request's finally, just after the reply.
        assert stack.sim.wait_for(lambda: stack.metric("gateway_evidence_leases_active") == 0, 5)


def test_permits_return_to_zero_after_mixed_run(tmp_path: Path) -> None:
    with running_stack(tmp_path, admission={"capacity": 3, "max_queue": 64}) as stack:
        token = stack.rs256()
        sockets = [_hold_stream(stack, token) for _ in range(2)]
        assert stack.sim.wait_for(lambda: stack.sim.active_streams == 2, 5)
        for sock in sockets:
            sock.close()
        with stack.client(token) as client:
            for fault in ("close_mid", "error_json", "bad_usage", "missing_done"):
                client.post(
                    "/v1/chat/completions", json=chat_body(f"[[sim fault={fault}]]", stream=True)
                )
        assert stack.sim.wait_for(lambda: stack.metric("gateway_permits_in_use") == 0, 5)
        assert stack.metric("gateway_admission_queue_depth") == 0
        assert stack.runtime.table.admissions.in_use == 0
