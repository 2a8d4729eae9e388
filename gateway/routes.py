"""The small endpoints: model listing, evidence API, probes, metrics.

All raw ASGI like the inference endpoints, sharing ``asgi.py`` helpers, so
that every reply carries the same error shape and request id.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.asgi import (
    Receive,
    Scope,
    Send,
    authorization_values,
    header,
    info_of,
    runtime_of,
    send_error,
    send_json,
)
from gateway.auth import authorize
from gateway.errors import GatewayError
from gateway.limits import ClientDisconnected, read_body
from gateway.policy import Tenant
from gateway.runtime import Runtime

#: the scope each small endpoint needs (spec §4 "Scopes"); inference
#: descriptors carry their own (gateway/apis)
_SCOPES = {"models": "inference", "evidence": "evidence"}


async def _tenant_for(scope: Scope, rt: Runtime, endpoint: str) -> Tenant:
    policies = rt.policies
    principal = await rt.auth.authenticate(authorization_values(scope), policies)
    tenant = policies.tenants[principal.tenant]
    info_of(scope).tenant = tenant.name
    authorize(principal, tenant, endpoint, _SCOPES[endpoint])
    return tenant


async def models(scope: Scope, receive: Receive, send: Send) -> None:
    rt = runtime_of(scope)
    info = info_of(scope)
    info.endpoint = "models"
    try:
        tenant = await _tenant_for(scope, rt, "models")
    except GatewayError as exc:
        await send_error(send, exc, info)
        return
    status = rt.readiness.status or "unavailable"
    created = int(info.started)
    data = [
        {"id": alias, "object": "model", "created": created, "owned_by": "local", "status": status}
        for alias in sorted(tenant.policy.models)
    ]
    await send_json(send, 200, {"object": "list", "data": data})


async def evidence_upload(scope: Scope, receive: Receive, send: Send) -> None:
    rt = runtime_of(scope)
    info = info_of(scope)
    info.endpoint = "evidence"
    try:
        tenant = await _tenant_for(scope, rt, "evidence")
        # An upload is refused while receipts fail (spec §13); reads and deletes
        # are served, so a tenant can still free a full volume.
        rt.check_books()
        data = await read_body(
            scope, receive, tenant.limits.max_media_bytes, rt.config.listen.body_timeout_s
        )
        content_type = _single(scope, b"content-type")
        # The locator digest is of its UTF-8 text (spec §12), as `evidence add` computes it.
        locator = _single(scope, b"x-evidence-locator", "utf-8")
        record = await anyio.to_thread.run_sync(
            rt.evidence.upload, tenant, data, content_type, locator
        )
    except ClientDisconnected:
        return
    except GatewayError as exc:
        await send_error(send, exc, info)
        return
    await send_json(send, 201, record.to_api())


async def evidence_item(scope: Scope, receive: Receive, send: Send) -> None:
    rt = runtime_of(scope)
    info = info_of(scope)
    info.endpoint = "evidence"
    evidence_id: str = scope["path_params"]["evidence_id"]
    try:
        tenant = await _tenant_for(scope, rt, "evidence")
        if scope["method"] == "DELETE":
            await anyio.to_thread.run_sync(rt.evidence.delete, tenant, evidence_id)
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        record = await anyio.to_thread.run_sync(rt.evidence.get, tenant, evidence_id)
    except GatewayError as exc:
        await send_error(send, exc, info)
        return
    await send_json(send, 200, record.to_api())


def _single(scope: Scope, name: bytes, encoding: str = "latin-1") -> str | None:
    values = header(scope, name)
    if len(values) > 1:
        raise GatewayError("invalid_request", "A header is repeated.")
    if not values:
        return None
    try:
        return values[0].decode(encoding)
    except UnicodeDecodeError as exc:
        raise GatewayError("invalid_request", f"A header is not valid {encoding}.") from exc


async def livez(scope: Scope, receive: Receive, send: Send) -> None:
    info_of(scope).endpoint = "health"
    await send_json(send, 200, {"status": "ok"})


async def readyz(scope: Scope, receive: Receive, send: Send) -> None:
    rt = runtime_of(scope)
    info_of(scope).endpoint = "health"
    reason = rt.not_ready_reason()
    ready = rt.accepting() and reason is None
    body: dict[str, Any] = {"status": "ready" if ready else "not_ready", "draining": rt.draining}
    if reason is not None:
        body["reason"] = reason
    await send_json(send, 200 if ready else 503, body)


async def metrics(scope: Scope, receive: Receive, send: Send) -> None:
    rt = runtime_of(scope)
    info_of(scope).endpoint = "metrics"
    payload = generate_latest(rt.metrics.registry)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", CONTENT_TYPE_LATEST.encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload})
