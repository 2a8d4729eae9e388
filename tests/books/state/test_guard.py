"""Which requests need the state store, refused while it is known down (spec §24);
and the probe that ends the refusals once it answers."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.apis.base import MediaRef, Plan
from gateway.books.state.calls import StateCalls
from gateway.books.state.guard import needs_state, require_state
from gateway.core.errors import GatewayError
from tests.support.poll import eventually_async


def _plan(endpoint: str = "chat.completions", **body: object) -> Plan:
    return Plan(
        endpoint=endpoint,
        alias="a",
        body={"model": "a", **body},
        stream=True,
        include_usage=True,
        max_tokens=5,
        prompt_bytes=5,
        nonce="0" * 16,
    )


def _with(plan: Plan, **fields: object) -> Plan:
    for name, value in fields.items():
        setattr(plan, name, value)
    return plan


EVIDENCE = MediaRef(0, 0, "image", "evidence", evidence_id="ev_" + "a" * 26)
INLINE = MediaRef(0, 0, "image", "data", data_url="data:image/png;base64,AA==")


@pytest.mark.parametrize(
    ("plan", "needs"),
    [
        (_plan(), False),
        (_plan("embeddings"), False),
        (_with(_plan(), media=[EVIDENCE]), True),
        (_with(_plan(), media=[INLINE]), True),  # staged as a record of its own
        (_plan("responses"), True),  # kept: store defaults to true
        (_plan("responses", store=True), True),
        (_plan("responses", store=None), True),  # an explicit null is the field's absence
        (_plan("responses", store=False), False),
        (_with(_plan("responses", store=False), previous_response_id="resp_1"), True),
        (_with(_plan("messages"), media=[EVIDENCE]), True),
    ],
)
def test_what_needs_the_state_store(plan: Plan, needs: bool) -> None:
    assert needs_state(plan) is needs


def test_only_a_store_known_down_refuses_and_only_what_needs_it() -> None:
    calls = StateCalls(None)
    kept = _plan("responses")
    require_state(calls, kept)  # healthy: nothing refused
    calls.degraded = True
    require_state(calls, _plan())  # needs no state: served
    with pytest.raises(GatewayError) as info:
        require_state(calls, kept)
    assert (info.value.code, info.value.status) == ("state_unavailable", 503)


async def test_a_degraded_store_is_probed_until_it_answers_then_no_more() -> None:
    """No request may be what tells the replica the store is back (they are
    refused): the backend's probe runs while degraded, and only then."""
    probes: list[float] = []
    down = True

    async def probe() -> None:
        probes.append(time.monotonic())
        if down:
            raise GatewayError("state_unavailable")

    calls = StateCalls(1.0)
    calls.watch(probe, interval_s=0.02)

    async def fails() -> None:
        raise GatewayError("state_unavailable")

    async def works() -> str:
        return "ok"

    assert await calls.run("get", works()) == "ok"
    assert probes == []  # healthy: no probe at all
    with pytest.raises(GatewayError):
        await calls.run("get", fails())
    assert calls.degraded
    await eventually_async(lambda: len(probes) >= 3, "probes while down")
    assert calls.degraded  # every probe failed so far
    down = False
    await eventually_async(lambda: not calls.degraded, "the probe saw it answer")
    seen = len(probes)
    await asyncio.sleep(0.1)  # five intervals: a stopped prober probes no more
    assert len(probes) == seen
    assert "state-probe" not in [t.get_name() for t in asyncio.all_tasks()]
    await calls.aclose()


async def test_closing_stops_the_probe() -> None:
    async def probe() -> None:
        raise GatewayError("state_unavailable")

    async def fails() -> None:
        raise GatewayError("state_unavailable")

    calls = StateCalls(1.0)
    calls.watch(probe, interval_s=0.01)
    with pytest.raises(GatewayError):
        await calls.run("get", fails())
    assert "state-probe" in [t.get_name() for t in asyncio.all_tasks()]
    await calls.aclose()
    assert "state-probe" not in [t.get_name() for t in asyncio.all_tasks()]
