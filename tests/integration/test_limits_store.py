"""Shared limits through real gateways on one Redis (spec §15)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.poll import eventually
from tests.support.redis import RedisServer
from tests.support.stack import Stack, chat_body, running_stack


def test_two_gateways_share_one_tenants_limits(tmp_path: Path, redis_url: str) -> None:
    store = {"backend": "redis", "url": redis_url, "timeout_ms": 1000}
    acme = {"limits": {"requests_per_minute": 3, "max_concurrent_requests": 2}}
    with (
        running_stack(tmp_path / "a", acme=acme, limits_store=store) as a,
        running_stack(tmp_path / "b", acme=acme, limits_store=store) as b,
    ):
        statuses = []
        for stack in (a, b, a, b, a):
            with stack.client() as client:
                response = client.post("/v1/chat/completions", json=chat_body(max_tokens=5))
                statuses.append(response.status_code)
        assert statuses == [200, 200, 200, 429, 429]
        with b.client() as client:
            refused = client.post("/v1/chat/completions", json=chat_body(max_tokens=5))
        assert refused.json()["error"]["code"] == "rate_limited"
        assert refused.headers["x-ratelimit-limit-requests"] == "3"
        # another tenant is not touched by acme's budget
        with a.client(token=a.dev_token("globex")) as client:
            assert client.post("/v1/chat/completions", json=chat_body()).status_code == 200
        assert a.metric("gateway_limits_store_seconds_count", op="reserve") == 4


def _readyz(stack: Stack) -> tuple[int, dict[str, object]]:
    """Status and body without the per-route states (all ready here)."""
    with httpx.Client(base_url=stack.url) as client:
        response = client.get("/readyz")
    body = response.json()
    assert all(route["ready"] for route in body.pop("routes").values())
    return response.status_code, body


def test_an_unreachable_store_is_503_without_touching_the_worker(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    store = {"backend": "redis", "url": own_redis.url, "timeout_ms": 200, "unready_after_s": 0.5}
    with running_stack(tmp_path, limits_store=store) as stack:
        assert _readyz(stack) == (200, {"status": "ready", "draining": False})
        assert stack.metric("gateway_limits_store_healthy") == 1
        own_redis.stop()
        # The probe notices without any request (off the request path).
        assert eventually(lambda: _readyz(stack)[0] == 503)
        assert _readyz(stack)[1] == {
            "status": "not_ready",
            "draining": False,
            "reason": "limits_unavailable",
        }
        assert stack.metric("gateway_limits_store_healthy") == 0
        assert stack.metric("gateway_limits_store_errors_total", op="probe") >= 1
        with stack.client() as client:
            response = client.post("/v1/chat/completions", json=chat_body(max_tokens=5))
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "limits_unavailable"
        assert [r for r in stack.sim.requests() if r.path == "/v1/chat/completions"] == []
        assert stack.metric("gateway_limits_store_errors_total", op="reserve") == 1
        receipt = stack.receipt(response.headers["x-request-id"])
        assert receipt["error_code"] == "limits_unavailable"
        own_redis.start()
        # Ready again by itself, before any request: the probe saw Redis answer.
        assert eventually(lambda: _readyz(stack)[0] == 200)
        assert stack.metric("gateway_limits_store_healthy") == 1
        with stack.client() as client:
            assert client.post("/v1/chat/completions", json=chat_body()).status_code == 200


def test_under_open_an_unreachable_store_stays_ready_and_serves(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    store = {"backend": "redis", "url": own_redis.url, "timeout_ms": 200, "on_error": "open"}
    with running_stack(tmp_path, limits_store=store) as stack:
        own_redis.stop()
        assert eventually(lambda: stack.metric("gateway_limits_store_healthy") == 0)
        assert _readyz(stack) == (200, {"status": "ready", "draining": False})
        with stack.client() as client:
            response = client.post("/v1/chat/completions", json=chat_body(max_tokens=5))
        assert response.status_code == 200
        assert "x-ratelimit-limit-requests" not in response.headers  # unchecked: no figures
        assert stack.metric("gateway_limits_store_errors_total", op="reserve") == 1
        own_redis.start()
        assert eventually(lambda: stack.metric("gateway_limits_store_healthy") == 1)
        with stack.client() as client:
            checked = client.post("/v1/chat/completions", json=chat_body(max_tokens=5))
        assert checked.headers["x-ratelimit-limit-requests"] == "6000"


def test_one_slow_answer_is_that_requests_503_never_the_replicas_readiness(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """Spec §24: with ``on_error: closed``, a store slower than ``timeout_ms`` for
    a moment refuses the request it delays, while ``/readyz`` stays 200 (it
    flipped to 503 on every replica at once, pulling the fleet out together)."""
    store = {"backend": "redis", "url": own_redis.url, "timeout_ms": 50}
    with running_stack(tmp_path, limits_store=store) as stack:
        with own_redis.client() as client:
            client.execute_command("CLIENT", "PAUSE", 600, "ALL")
        with stack.client() as client:
            response = client.post("/v1/chat/completions", json=chat_body(max_tokens=5))
        polls = [_readyz(stack) for _ in range(5)]
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "limits_unavailable"
        assert polls == [(200, {"status": "ready", "draining": False})] * 5
        assert stack.metric("gateway_limits_store_healthy") == 0  # the metric still says so
        assert eventually(lambda: stack.metric("gateway_limits_store_healthy") == 1)
        with stack.client() as client:
            assert client.post("/v1/chat/completions", json=chat_body()).status_code == 200
