"""A fleet on shared state (spec §17): replicas, each with its own worker
(a simulator), on one PostgreSQL, one Redis and one staging directory, behind
a random-per-connection balancer. Test equipment only."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.testing.harness import default_policy, write_config
from gateway.testing.simulator import Simulator
from tests.support.balancer import Balancer, balanced
from tests.support.balancer import client as balanced_client
from tests.support.process import Served, serving, sim_running
from tests.support.redis import RedisServer
from tests.support.stack import issuers

DSN_ENV = "GATEWAY_STATE_DSN"
#: what the tenants may do: images and text, evidence and Responses
LIMITS = {"max_output_tokens": 512, "requests_per_minute": 60000}


def tenant(name: str, **sections: Any) -> dict[str, Any]:
    """A tenant that may upload evidence, name it, and use the Responses API."""
    return default_policy(
        name,
        endpoints=["chat.completions", "responses", "evidence", "models"],
        limits={**LIMITS, **sections.pop("limits", {})},
        **sections,
    )


def fleet_configs(
    root: Path,
    sims: list[Simulator],
    redis: RedisServer,
    tenants: dict[str, dict[str, Any]],
    **sections: Any,
) -> list[Path]:
    """One config per simulator; one staging directory for all of them."""
    shared = root / "shared-evidence"
    state = {"backend": "postgres", "dsn_env": DSN_ENV, "timeout_ms": 1000}
    state.update(sections.pop("state", {}))
    return [
        write_config(
            root / f"replica{i}",
            upstream_port=sim.port,
            policies=tenants,
            issuers=issuers(),
            staging={
                "dir": str(shared),
                "catalog": str(root / f"replica{i}/var/catalog.sqlite3"),
                "max_concurrent_uploads": 16,
            },
            limits_store={"backend": "redis", "url": redis.url, "timeout_ms": 1000},
            state={**state, "replica_id": f"replica-{i}"},
            **sections,
        )
        for i, sim in enumerate(sims)
    ]


@dataclass
class Fleet:
    sims: list[Simulator]
    replicas: list[Served]
    balancer: Balancer
    staging: Path

    def client(self, tenant: str = "acme") -> httpx.AsyncClient:
        return balanced_client(self.balancer, self.replicas[0].dev_token(tenant))

    def direct(self, index: int, tenant: str = "acme") -> httpx.AsyncClient:
        replica = self.replicas[index]
        return httpx.AsyncClient(
            base_url=replica.url,
            headers={"authorization": f"Bearer {replica.dev_token(tenant)}"},
            timeout=httpx.Timeout(30, connect=5),
        )


@contextlib.contextmanager
def simulators(count: int) -> Iterator[list[Simulator]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(sim_running()) for _ in range(count)]


@contextlib.asynccontextmanager
async def fleet(
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
    dsn: str,
    redis: RedisServer,
    tenants: dict[str, dict[str, Any]],
    count: int = 2,
    **sections: Any,
) -> AsyncIterator[Fleet]:
    monkeypatch.setenv(DSN_ENV, dsn)
    with simulators(count) as sims:
        configs = fleet_configs(root, sims, redis, tenants, **sections)
        with serving(configs) as replicas:
            for replica in replicas:
                await until(functools.partial(_ready, replica), "replica ready", 30)
            ports = [int(r.url.rsplit(":", 1)[1]) for r in replicas]
            async with balanced(ports) as balancer:
                yield Fleet(sims, replicas, balancer, root / "shared-evidence")


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 10) -> float:
    """Poll an async ``check`` until it holds; the seconds it took (fails past ``timeout_s``)."""
    began = time.monotonic()
    while not await check():
        if time.monotonic() - began > timeout_s:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - began


async def _ready(replica: Served) -> bool:
    async with httpx.AsyncClient(base_url=replica.url, timeout=2) as client:
        try:
            return (await client.get("/readyz")).status_code == 200
        except httpx.HTTPError:
            return False
