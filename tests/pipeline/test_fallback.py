"""A release's fallback (``pipeline/fallback.py``, spec §18), with a real route table,
two upstreams' admission pools and fake worker clients: sent once to the other
arm for a failure before the head, never after it or on a timeout; one
answer, one receipt naming the arm that answered, every permit back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest

from gateway.admission import AdmissionGroup
from gateway.apis.chat.api import ChatApi
from gateway.books.receipts import ReleaseMark
from gateway.config import GatewayConfig
from gateway.core.errors import GatewayError
from gateway.pipeline.call import Call
from gateway.pipeline.services import Services
from gateway.pipeline.settle import settle
from gateway.ratelimit.memory import MemoryLimitsStore
from gateway.upstream.base import Accept, Rejection, WorkerStream
from gateway.upstream.releases import Releases
from gateway.upstream.table import RouteTable, capacities
from tests.pipeline.support import (
    ALIAS,
    Caller,
    FakeTransport,
    FakeUpstream,
    chat_plan,
    make_call,
    make_services,
    make_tenant,
    read_body,
    receipts_of,
    routed_of,
    run_steps,
    sse_fixture,
)

API = ChatApi()
VALID = sse_fixture("chat_valid.sse")
OLD, NEW = "/srv/models/old", "/srv/models/new"


class _Client(FakeTransport):
    """A worker's transport: reads the body, then fails with ``error`` or answers."""

    def __init__(self, error: GatewayError | None = None, answer: FakeUpstream | None = None):
        self.error = error
        self.answer = answer
        self.bodies: list[dict[str, Any]] = []

    async def open_stream(
        self,
        path: str,
        body: bytes | AsyncIterator[bytes],
        request_id: str,
        *,
        size: int | None = None,
        accept: Accept = "sse",
        traceparent: bytes | None = None,
        rejection: Rejection = "classified",
    ) -> WorkerStream:
        self.bodies.append(orjson.loads(await read_body(body)))
        if self.error is not None:
            raise self.error
        assert self.answer is not None
        return self.answer


class _Ready:
    def ready(self, route: str) -> bool:
        return True


def _config(**release: Any) -> GatewayConfig:
    fields: dict[str, Any] = {
        "name": "chat",
        "stable": OLD,
        "canary": NEW,
        "canary_percent": 100,
        "fallback": True,
    }
    fields.update(release)
    upstream = {"routes": [], "capacity": 2}
    return GatewayConfig.model_validate(
        {
            "upstreams": [
                {**upstream, "name": "old", "base_url": "http://127.0.0.1:1234", "routes": [OLD]},
                {**upstream, "name": "new", "base_url": "http://127.0.0.1:1235", "routes": [NEW]},
            ],
            "releases": [fields],
        }
    )


class _Rig:
    def __init__(self, table: RouteTable, services: Services) -> None:
        self.table, self.services = table, services
        self.old, self.new = table.workers["old"], table.workers["new"]

    def clients(self, old: _Client, new: _Client) -> None:
        self.old.client = old
        self.new.client = new

    def call(self, *, stream: bool = True) -> tuple[Call, Caller]:
        caller = Caller()
        call = make_call(self.services, tenant=make_tenant(models={ALIAS: "release:chat"}))
        call.send = caller.send
        call.plan = chat_plan(stream=stream)
        return call, caller

    def in_use(self) -> tuple[int, int]:
        return self.old.admission.in_use, self.new.admission.in_use

    def counted(self, arm: str, outcome: str) -> float | None:
        return self.services.metrics.registry.get_sample_value(
            "gateway_release_requests_total", {"release": "chat", "arm": arm, "outcome": outcome}
        )


@asynccontextmanager
async def _rig(config: GatewayConfig) -> AsyncIterator[_Rig]:
    table = RouteTable.build(config, AdmissionGroup(capacities(config), 8))
    clients = [w.client for w in table.workers.values()]
    services = make_services(
        table=table, readiness=_Ready(), config=config, limits=MemoryLimitsStore()
    )
    table.releases = Releases(config.releases, services.metrics)
    try:
        yield _Rig(table, services)
    finally:
        for client in clients:
            await client.aclose()


@pytest.fixture
async def rig() -> AsyncIterator[_Rig]:
    async with _rig(_config()) as built:
        yield built


_run = run_steps


async def _refused(call: Call) -> GatewayError:
    """The error the caller hears, recorded as the edge records it."""
    with pytest.raises(GatewayError) as caught:
        await _run(call)
    call.fail(caught.value)
    return caught.value


@pytest.mark.parametrize(
    "error",
    [
        GatewayError("upstream_error"),
        GatewayError("upstream_unavailable"),
        GatewayError("upstream_unavailable", outcome="upstream_error"),
    ],
    ids=["5xx", "reset", "refused"],
)
@pytest.mark.parametrize("stream", [True, False])
async def test_a_canary_failing_before_its_head_is_answered_by_stable(
    rig: _Rig, error: GatewayError, stream: bool
) -> None:
    old, new = _Client(answer=FakeUpstream([VALID])), _Client(error)
    rig.clients(old, new)
    call, caller = rig.call(stream=stream)
    await _run(call)
    assert len(caller.starts) == 1 and caller.starts[0]["status"] == 200
    assert [b["model"] for b in new.bodies] == [NEW] and [b["model"] for b in old.bodies] == [OLD]
    assert old.bodies[0]["messages"] == new.bodies[0]["messages"], "the same request"
    receipt = call.receipt
    assert receipt.release == ReleaseMark("chat", "stable", fallback_from="canary")
    assert (receipt.upstream, receipt.route) == ("old", OLD)
    assert rig.in_use() == (permit.weight if (permit := routed_of(call).permit) else 0, 0)
    assert (rig.old.live, rig.new.live) == (1, 0)
    settle(call, API)
    assert receipt.outcome == "complete"
    assert rig.in_use() == (0, 0) and (rig.old.live, rig.new.live) == (0, 0)
    assert rig.counted("canary", error.outcome) == 1
    assert rig.counted("stable", "complete") == 1
    assert len(receipts_of(rig.services).written) == 1


async def test_a_failure_after_the_head_is_not_retried(rig: _Rig) -> None:
    broken = FakeUpstream([VALID[:40]], end=False)
    broken.fail(GatewayError("upstream_unavailable"))
    old, new = _Client(answer=FakeUpstream([VALID])), _Client(answer=broken)
    rig.clients(old, new)
    call, _ = rig.call()
    assert (await _refused(call)).code == "upstream_unavailable"
    assert old.bodies == []
    assert call.receipt.release == ReleaseMark("chat", "canary")
    settle(call, API)
    assert rig.in_use() == (0, 0)


@pytest.mark.parametrize(
    "error",
    [GatewayError("upstream_timeout"), GatewayError("upstream_rejected")],
    ids=["timeout", "4xx"],
)
async def test_timeouts_and_refusals_are_not_retried(rig: _Rig, error: GatewayError) -> None:
    old, new = _Client(answer=FakeUpstream([VALID])), _Client(error)
    rig.clients(old, new)
    call, _ = rig.call()
    assert await _refused(call) is error and old.bodies == []
    settle(call, API)
    assert rig.in_use() == (0, 0)


async def test_without_fallback_the_first_failure_is_the_answer() -> None:
    async with _rig(_config(fallback=False)) as rig:
        old, new = _Client(answer=FakeUpstream([VALID])), _Client(GatewayError("upstream_error"))
        rig.clients(old, new)
        call, _ = rig.call()
        assert (await _refused(call)).code == "upstream_error"
        assert old.bodies == [] and call.receipt.release == ReleaseMark("chat", "canary")
        settle(call, API)
        assert rig.in_use() == (0, 0) and rig.counted("canary", "upstream_error") == 1


async def test_a_fallback_the_other_arm_cannot_take_gives_the_first_failure() -> None:
    async with _rig(_config()) as rig:
        # Stable cannot take this body.
        rig.old.config = rig.old.config.model_copy(update={"max_request_bytes": 64})
        old, new = _Client(answer=FakeUpstream([VALID])), _Client(GatewayError("upstream_error"))
        rig.clients(old, new)
        call, _ = rig.call()
        assert (await _refused(call)).code == "upstream_error" and old.bodies == []
        assert call.receipt.release == ReleaseMark("chat", "canary")
        settle(call, API)
        assert rig.in_use() == (0, 0) and (rig.old.live, rig.new.live) == (0, 0)
        assert call.receipt.request_sha256 is not None, "the body the canary was sent"
        # Counted once, as the canary's failure (not once more for the attempt).
        assert rig.counted("canary", "upstream_error") == 1
