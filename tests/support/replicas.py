"""Several real ``serve`` replicas on one real Redis in front of one simulator.

What the replica tests share: configs (one folder per replica, each with its
own staging, catalog and receipts, as pods have), per-replica async clients,
the simulator's record of one test's requests (found by a marker in the
prompt), the overlap of their intervals at the simulator, and polling Redis
for a tenant's state. Every wait is bounded; nothing sleeps for readiness.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from gateway.apis.usage import estimate_prompt_tokens
from gateway.ratelimit import tenant_keys
from gateway.testing.harness import default_policy, read_receipts, write_config
from gateway.testing.simulator import SimRequest, Simulator
from tests.support.poll import eventually_async
from tests.support.process import Served
from tests.support.redis import RedisServer
from tests.support.stack import issuers

ALIAS = "gemma-4-mm"
PREFIX = "mrgw:"
#: a stream that stays before its first event until its caller goes away
HANG = "[[sim first_delay_ms=120000 keepalive_ms=0]]"


#: local admission never the bottleneck: these tests are about the shared limits
CAPACITY = 64
#: the tenants' admission.queue_timeout_s: a hold's lease covers it (spec §15 + the wait)
QUEUE_TIMEOUT_S = 5
#: slot leases short enough to watch one end (spec §15); with the fleet's
#: timeout_ms of 1000 a renewal still lands within the lease
LEASE_RENEW_S = 1
LEASE_TTL_S = 3
FAST_LEASES = {"lease_renew_s": LEASE_RENEW_S, "lease_ttl_s": LEASE_TTL_S}
#: how long a replica test polls for a state (processes and Redis round trips: generous)
REPLICA_WAIT_S = 15


def tenant_policy(name: str, **limits: int) -> dict[str, Any]:
    """A policy whose shared limits are exactly ``limits`` (the rest unlimited)."""
    return default_policy(
        name,
        limits={"max_output_tokens": 1024, **limits},
        admission={"share": 1, "max_permits": CAPACITY, "queue_timeout_s": QUEUE_TIMEOUT_S},
    )


def fleet_configs(
    root: Path,
    count: int,
    *,
    sim: Simulator,
    redis: RedisServer,
    tenants: dict[str, dict[str, Any]],
    store: dict[str, Any] | None = None,
    upstream: dict[str, Any] | None = None,
) -> list[Path]:
    """``count`` configs on one Redis and one simulator, one folder each."""
    section = {"backend": "redis", "url": redis.url, "timeout_ms": 1000, **(store or {})}
    return [
        write_config(
            root / f"replica{i}",
            upstream_port=sim.port,
            policies=tenants,
            issuers=issuers(),
            limits_store=section,
            upstream=dict(upstream or {}),
            admission={"capacity": CAPACITY, "max_queue": 4 * CAPACITY},
        )
        for i in range(count)
    ]


@contextlib.asynccontextmanager
async def clients(replicas: list[Served], tenant: str) -> AsyncIterator[list[httpx.AsyncClient]]:
    """One client per replica, with a token of ``tenant``."""
    async with contextlib.AsyncExitStack() as stack:
        made = []
        for replica in replicas:
            client = httpx.AsyncClient(
                base_url=replica.url,
                headers={"authorization": f"Bearer {replica.dev_token(tenant)}"},
                timeout=httpx.Timeout(30, connect=5),
                limits=httpx.Limits(max_connections=200, max_keepalive_connections=200),
            )
            made.append(await stack.enter_async_context(client))
        yield made


def chat_body(text: str, *, max_tokens: int = 5, stream: bool = False) -> dict[str, Any]:
    return {
        "model": ALIAS,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def reservation(text: str, max_tokens: int) -> int:
    """The tokens one request reserves (spec §7: max_tokens + prompt bytes / 4)."""
    return max_tokens + estimate_prompt_tokens(len(text.encode("utf-8")))


async def chat(
    client: httpx.AsyncClient, text: str, *, max_tokens: int = 5, stream: bool = False
) -> httpx.Response:
    return await client.post(
        "/v1/chat/completions", json=chat_body(text, max_tokens=max_tokens, stream=stream)
    )


def code(response: httpx.Response) -> str:
    """ "ok" for a 200, else the error code."""
    if response.status_code == 200:
        return "ok"
    return str(response.json()["error"]["code"])


def _decided(task: asyncio.Task[httpx.Response], sim: Simulator, marker: str) -> bool:
    """Refused (answered), or admitted (at the worker)."""
    return task.done() or bool(marked(sim, marker))


async def hold_streams(
    client: httpx.AsyncClient, sim: Simulator, tag: str, count: int, timeout_s: float
) -> tuple[list[asyncio.Task[httpx.Response]], int]:
    """Open hanging streams one at a time, a caller retrying each refusal
    (``concurrency_limited``), until ``count`` of them are at the worker; the
    streams (the caller must cancel them) and the refusals met on the way."""
    held: list[asyncio.Task[httpx.Response]] = []
    refused = attempt = 0
    deadline = time.monotonic() + timeout_s
    while len(held) < count:
        if time.monotonic() > deadline:
            for task in held:
                task.cancel()
            raise AssertionError(f"{len(held)} of {count} streams admitted in {timeout_s} s")
        marker = f"<{tag}{attempt}>"
        attempt += 1
        task = asyncio.create_task(chat(client, f"{marker} {HANG}", stream=True))
        await eventually_async(
            functools.partial(_decided, task, sim, marker),
            f"{marker} admitted or refused",
            timeout_s=REPLICA_WAIT_S,
        )
        if not task.done():
            held.append(task)
            continue
        assert code(task.result()) == "concurrency_limited"
        refused += 1
        await asyncio.sleep(0.05)  # the caller's pause before it tries again
    return held, refused


def marked(sim: Simulator, marker: str) -> list[SimRequest]:
    """The inference requests the simulator received whose body carries ``marker``."""
    token = marker.encode()
    return [r for r in sim.requests() if r.method == "POST" and token in r.body]


def peak_overlap(requests: list[SimRequest]) -> int:
    """The most of ``requests`` the simulator was playing at one instant."""
    events: list[tuple[float, int]] = []
    for r in requests:
        end = r.finished_at if r.finished_at is not None else float("inf")
        events += [(r.received_at, 1), (end, -1)]
    # At equal times an end comes first: a request that ended as another began
    # did not overlap it.
    events.sort(key=lambda e: (e[0], e[1]))
    peak = level = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def settled(redis: RedisServer, tenant: str) -> bool:
    """True when no hold of ``tenant`` waits for its settlement in Redis."""
    with redis.client() as client:
        return int(client.zcard(tenant_keys(PREFIX, tenant).holds)) == 0


def slots_held(redis: RedisServer, tenant: str) -> int:
    with redis.client() as client:
        return int(client.zcard(tenant_keys(PREFIX, tenant).slots))


def slot_leases_left_ms(redis: RedisServer, tenant: str) -> list[int]:
    """How long each of ``tenant``'s concurrency slots has left, by Redis' clock."""
    with redis.client() as client:
        sec, usec = client.time()
        now_ms = int(sec) * 1000 + int(usec) // 1000
        expiries = client.zrange(tenant_keys(PREFIX, tenant).slots, 0, -1, withscores=True)
    return [int(score) - now_ms for _, score in expiries]


def day_used(redis: RedisServer, tenant: str) -> int:
    with redis.client() as client:
        raw = client.hget(tenant_keys(PREFIX, tenant).day, "u")
    return 0 if raw is None else int(raw)


def receipts(replicas: list[Served]) -> list[dict[str, Any]]:
    """Every receipt the replicas wrote so far."""
    return [r for replica in replicas for r in read_receipts(replica.receipts_path())]
