"""Readiness per route with route kinds (spec §16, §23): speech and image routes
are ready on the listing alone; chat and embeddings routes are probed."""

from __future__ import annotations

from typing import Any

from gateway.admission import AdmissionGroup
from gateway.config import GatewayConfig
from gateway.observe.metrics import GatewayMetrics
from gateway.upstream.readiness import Readiness
from gateway.upstream.table import RouteTable, Worker, capacities
from tests.pipeline.support import FakeTransport

ROUTES = {"/m/chat": "chat", "/m/embed": "embeddings", "/m/speech": "speech", "/m/image": "image"}


class _Listing(FakeTransport):
    async def get_models(self, timeout_s: float) -> Any:
        return {"data": [{"id": route, "status": "loaded"} for route in ROUTES]}


def _readiness(probe_passes: bool) -> tuple[Readiness, list[str], Worker]:
    config = GatewayConfig.model_validate(
        {
            "upstreams": [
                {
                    "name": "w",
                    "base_url": "http://127.0.0.1:9",
                    "routes": [{"route": r, "kind": k} for r, k in ROUTES.items()],
                    "probe": {"kind": "chat"},
                }
            ]
        }
    )
    table = RouteTable.build(config, AdmissionGroup(capacities(config), 8))
    worker = table.workers["w"]
    worker.client = _Listing()
    probed: list[str] = []

    async def probe(worker: Worker, route: str) -> bool:
        probed.append(route)
        return probe_passes

    return Readiness(table, GatewayMetrics(), probe), probed, worker


async def test_speech_and_image_routes_are_never_probed() -> None:
    readiness, probed, worker = _readiness(probe_passes=False)
    await readiness.poll_once(worker)
    assert sorted(probed) == ["/m/chat", "/m/embed"]
    assert {route: readiness.ready(route) for route in ROUTES} == {
        "/m/chat": False,
        "/m/embed": False,
        "/m/speech": True,
        "/m/image": True,
    }
    assert readiness.state("/m/chat").reason == "probe_failed"


async def test_probed_routes_are_ready_once_their_probe_passes() -> None:
    readiness, probed, worker = _readiness(probe_passes=True)
    await readiness.poll_once(worker)
    assert all(readiness.ready(route) for route in ROUTES)
    await readiness.poll_once(worker)
    assert sorted(probed) == ["/m/chat", "/m/embed"]  # once per transition to loaded
