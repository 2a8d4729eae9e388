"""A gateway whose shared limits store is over ``maxmemory`` (spec §15).

Redis full (``noeviction``) is a store failure for every tenant: each one is
refused 503 ``limits_unavailable`` under ``on_error: closed`` whatever its
limits (a concurrency limit once let a tenant through, because that script's
first write is not deny-oom), ``/readyz`` stays 503 however the requests and
probes interleave, and once memory is given back everything serves again with
nothing left half-written in Redis.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from gateway.ratelimit import tenant_keys
from tests.support.poll import eventually
from tests.support.redis import RedisServer
from tests.support.redis_full import fill, over_maxmemory, release
from tests.support.stack import Stack, chat_body, running_stack

#: acme has a concurrency limit (the script's first write is ZREMRANGEBYSCORE);
#: globex only a request rate (first write HSET, deny-oom)
ACME = {"limits": {"requests_per_minute": 600, "max_concurrent_requests": 2}}
GLOBEX = {"limits": {"requests_per_minute": 600}}


def _readyz(stack: Stack) -> tuple[int, str | None]:
    with httpx.Client(base_url=stack.url) as client:
        response = client.get("/readyz")
    return response.status_code, response.json().get("reason")


def _chat(stack: Stack, tenant: str) -> httpx.Response:
    with stack.client(token=stack.dev_token(tenant)) as client:
        return client.post("/v1/chat/completions", json=chat_body(max_tokens=5))


def test_a_full_store_refuses_every_tenant_and_readyz_stays_down(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    store = {"backend": "redis", "url": own_redis.url, "timeout_ms": 500, "unready_after_s": 0.5}
    with running_stack(tmp_path, acme=ACME, globex=GLOBEX, limits_store=store) as stack:
        for tenant in ("acme", "globex"):
            assert _chat(stack, tenant).status_code == 200
        assert eventually(lambda: _slots_free(own_redis))
        fill(own_redis)
        assert eventually(lambda: _readyz(stack) == (503, "limits_unavailable"))
        worker_before = _worker_posts(stack)
        # Several rounds, both tenants, polls in between: one answer throughout.
        polls = []
        for _ in range(4):
            for tenant in ("acme", "globex", "acme"):
                response = _chat(stack, tenant)
                assert response.status_code == 503, (tenant, response.text)
                assert response.json()["error"]["code"] == "limits_unavailable"
                polls.append(_readyz(stack))
        assert set(polls) == {(503, "limits_unavailable")}
        assert stack.metric("gateway_limits_store_healthy") == 0
        assert stack.metric("gateway_limits_store_errors_total", op="reserve") == 12
        assert _worker_posts(stack) == worker_before  # nothing reached the worker
        receipt = stack.receipt(response.headers["x-request-id"])
        assert receipt["error_code"] == "limits_unavailable"
        assert over_maxmemory(own_redis)
        release(own_redis)
        # Ready again by itself (the probe), then both tenants are served.
        assert eventually(lambda: _readyz(stack) == (200, None))
        for tenant in ("acme", "globex", "acme", "globex"):
            assert _chat(stack, tenant).status_code == 200
        assert stack.metric("gateway_limits_store_healthy") == 1
        # Nothing half-written: acme's slots all freed, no tombstone of a refused call.
        assert eventually(lambda: _slots_free(own_redis))
        with own_redis.client() as client:
            for tenant in ("acme", "globex"):
                assert client.zcard(tenant_keys("mrgw:", tenant).void) == 0


def _slots_free(server: RedisServer) -> bool:
    with server.client() as client:
        return bool(client.zcard(tenant_keys("mrgw:", "acme").slots) == 0)


def _worker_posts(stack: Stack) -> int:
    return len([r for r in stack.sim.requests() if r.path == "/v1/chat/completions"])
