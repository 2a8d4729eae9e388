"""A hostile worker (issue 8): redirects, non-SSE bodies, wrong content types,
enormous heads, never-ending lines and gzip each become a clean upstream error
with bounded gateway memory, and never hurt the next request.

Every fault, streamed or not, → error code and receipt is in
``test_streaming.py::test_every_fault``; this file adds the memory bounds and
the pool's hygiene.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from gateway.config import UpstreamConfig
from gateway.core.errors import GatewayError
from gateway.testing.harness import SIM_ROUTE
from gateway.testing.simulator import Simulator
from gateway.upstream.client import Upstream
from tests.support.poll import eventually
from tests.support.stack import Stack, chat_body, running_stack, worker_posts


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
        body = b"".join([raw async for raw in stream])
        assert body.endswith(b"data: [DONE]\n\n")
    finally:
        await upstream.aclose()


@pytest.fixture
def small_lines(tmp_path: Path, _dev_secret: None) -> Iterator[Stack]:
    with running_stack(tmp_path, upstream={"max_line_bytes": 65_536}) as stack:
        yield stack


def _traced_peak(action: Callable[[], None]) -> int:
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_endless_line_is_cut_at_the_line_bound(small_lines: Stack, stream: bool) -> None:
    """The simulator would send 512 MiB in one line; the gateway reads about the bound."""
    responses: list[httpx.Response] = []

    def run() -> None:
        with small_lines.client(timeout=10) as client:
            body = chat_body("[[sim fault=endless_line]]", stream=stream)
            responses.append(client.post("/v1/chat/completions", json=body))

    peak = _traced_peak(run)
    (response,) = responses
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_protocol_error"
    # The worker stopped writing: the gateway hung up (requests() are snapshots) ...
    assert eventually(lambda: worker_posts(small_lines.sim)[0].finished_at is not None)
    # ... having got out only what the kernel buffers held, not its 512 MiB.
    assert 65_536 < worker_posts(small_lines.sim)[0].bytes_sent < 64 << 20
    assert peak < 16 << 20, f"peak traced memory {peak / 1e6:.1f} MB"
    assert eventually(lambda: small_lines.runtime.table.admissions.in_use == 0)  # its finally


@pytest.mark.parametrize("fault", ["huge_headers", "json_body", "wrong_content_type", "gzip"])
def test_bad_heads_are_refused_and_the_pool_stays_usable(small_lines: Stack, fault: str) -> None:
    # Refused on the head (status, content type, coding, size) before any body byte
    # is parsed; the connection is dropped, not handed back to the pool.
    with small_lines.client(timeout=10) as client:
        body = chat_body(f"[[sim fault={fault} chunks=4]]", stream=True)
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "upstream_protocol_error"
        # The next request (likely on the same pool) is fine.
        assert client.post("/v1/chat/completions", json=chat_body()).status_code == 200
