"""Hostile peers: a worker that misbehaves must not hurt other requests.

(Started under issue 8; the hostile-client cases are still to be written.)
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from gateway.config import UpstreamConfig
from gateway.errors import GatewayError
from gateway.harness import SIM_ROUTE
from gateway.simulator import Simulator
from gateway.upstream import Upstream


@pytest.fixture
def sim() -> Iterator[Simulator]:
    simulator = Simulator(model_id=SIM_ROUTE)
    simulator.start()
    try:
        yield simulator
    finally:
        simulator.stop()


def _body(directive: str) -> bytes:
    return orjson.dumps(
        {
            "model": SIM_ROUTE,
            "messages": [{"role": "user", "content": f"[[sim {directive}]]"}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 16,
        }
    )


async def test_refused_worker_head_does_not_poison_the_pool(sim: Simulator) -> None:
    """A redirect is never followed, and the next request on the pool still works."""
    upstream = Upstream(UpstreamConfig(base_url=sim.base_url, route=SIM_ROUTE), pool_size=4)
    try:
        with pytest.raises(GatewayError) as refused:
            await upstream.open_stream("/v1/chat/completions", _body("fault=redirect"), "r-1")
        assert refused.value.code == "upstream_protocol_error"
        assert not [r for r in sim.requests() if r.path == "/sim/redirected"]
        # Immediately (no loop turn in between, as under concurrency): a good request.
        stream = await upstream.open_stream("/v1/chat/completions", _body("chunks=2"), "r-2")
        body = b"".join([raw async for raw in stream.raw()])
        assert body.endswith(b"data: [DONE]\n\n")
    finally:
        await upstream.aclose()
