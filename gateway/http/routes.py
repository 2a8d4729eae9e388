"""The small endpoints: model listing, probes, metrics (evidence: ``evidence_api.py``).

All raw ASGI like the inference endpoints, sharing ``asgi.py`` helpers, so
that every reply carries the same error shape and request id.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from gateway.config.releases import RELEASE_PREFIX
from gateway.core.errors import GatewayError
from gateway.http.asgi import (
    info_of,
    runtime_of,
    scraper_for,
    send_error,
    send_json,
    tenant_for,
)
from gateway.observe.exposition import exposition_of
from gateway.types import Receive, Scope, Send


async def models(scope: Scope, receive: Receive, send: Send) -> None:
    """``GET /v1/models`` and ``GET /v1/models/{alias}`` (spec §5, §14): the
    tenant's aliases; another tenant's alias is like an unknown one."""
    rt = runtime_of(scope)
    info = info_of(scope)
    info.endpoint = "models"
    try:
        tenant = await tenant_for(scope, rt, "models")
        alias = scope.get("path_params", {}).get("alias")
        if alias is not None and alias not in tenant.policy.models:
            raise GatewayError("model_not_found", param="model")
    except GatewayError as exc:
        await send_error(send, exc, info)
        return
    entries = {}
    for name, route in sorted(tenant.policy.models.items()):
        if route.startswith(RELEASE_PREFIX):
            # A release's alias shows its stable route's state (spec §18).
            route = rt.table.readiness_route(route)
        state = rt.readiness.state(route)
        entries[name] = {
            "id": name,
            "object": "model",
            # The worker's creation time; the gateway's start until the worker is seen.
            "created": state.created or rt.started_unix,
            "owned_by": "local",
            "status": state.status or "unavailable",
        }
    if alias is not None:
        await send_json(send, 200, entries[alias])
        return
    await send_json(send, 200, {"object": "list", "data": list(entries.values())})


async def livez(scope: Scope, receive: Receive, send: Send) -> None:
    info_of(scope).endpoint = "health"
    await send_json(send, 200, {"status": "ok"})


async def readyz(scope: Scope, receive: Receive, send: Send) -> None:
    rt = runtime_of(scope)
    info_of(scope).endpoint = "health"
    reason = rt.not_ready_reason()
    ready = rt.accepting() and reason is None
    routes = {route: state.to_json() for route, state in rt.readiness.routes.items()}
    body: dict[str, Any] = {
        "status": "ready" if ready else "not_ready",
        "routes": routes,
        "draining": rt.draining,
    }
    if reason is not None:
        body["reason"] = reason
    # Shared by every replica: unready would take all of them out at once (spec §17);
    # a full volume refuses what needs state, not what needs none (spec §24).
    degraded = [
        reason
        for reason, now in (
            ("state_unavailable", rt.state.calls.degraded),
            ("state_volume_full", rt.state.volume.full),
        )
        if now
    ]
    if degraded:
        body["degraded"] = degraded
    await send_json(send, 200 if ready else 503, body)


async def metrics(scope: Scope, receive: Receive, send: Send) -> None:
    """The exposition on the callers' port, for a credential with scope
    ``metrics`` only (spec §24; ``metrics.listen`` serves it apart, unauthenticated),
    rendered off the event loop at a bounded rate (``gateway/observe/exposition.py``,
    spec §21)."""
    rt = runtime_of(scope)
    info = info_of(scope)
    info.endpoint = "metrics"
    try:
        await scraper_for(scope, rt)
    except GatewayError as exc:
        await send_error(send, exc, info)
        return
    payload = await exposition_of(rt.metrics.registry).render()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", CONTENT_TYPE_LATEST.encode()),
                (b"content-length", b"%d" % len(payload)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
