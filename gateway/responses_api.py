"""``GET`` and ``DELETE /v1/responses/{id}`` (spec §14): only for the caller's own ids.

A Responses id is the tenant's once the gateway relayed it (the catalog's
``responses`` table, kept ``responses.ttl_s``). Anything else -- another
tenant's id, an expired one, one the gateway never saw, a malformed one --
answers 404 ``response_not_found`` without reaching the worker, so another
tenant's id looks exactly like an unknown one. The worker's answer is
checked (its id, its object type) and the alias is put back in ``model``; a
deleted id is forgotten here too.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread

from gateway.apis.responses import RESPONSE_ID
from gateway.asgi import Receive, Scope, Send, info_of, runtime_of, send_error, send_json
from gateway.errors import GatewayError
from gateway.routes import tenant_for


async def response_item(scope: Scope, receive: Receive, send: Send) -> None:
    rt = runtime_of(scope)
    info = info_of(scope)
    info.endpoint = "responses"
    response_id: str = scope["path_params"]["response_id"]
    method: str = scope["method"]
    try:
        tenant = await tenant_for(scope, rt, "responses")
        rt.check_serving()
        catalog = rt.evidence.catalog
        alias = None
        if RESPONSE_ID.fullmatch(response_id):
            alias = await anyio.to_thread.run_sync(catalog.response_alias, tenant.name, response_id)
        if alias is None:
            raise GatewayError("response_not_found")
        status, body = await rt.upstream.request_json(
            method,
            f"/v1/responses/{response_id}",
            info.request_id,
            rt.config.upstream.readiness_timeout_s * 5,
        )
        if status == 404:
            raise GatewayError("response_not_found")
        if status != 200:
            raise GatewayError("upstream_error")
        answer = _checked(method, response_id, body, alias)
        if method == "DELETE":
            await anyio.to_thread.run_sync(catalog.forget_response, tenant.name, response_id)
    except GatewayError as exc:
        await send_error(send, exc, info)
        return
    await send_json(send, 200, answer)


def _checked(method: str, response_id: str, body: Any, alias: str) -> dict[str, Any]:
    if not isinstance(body, dict) or body.get("id") != response_id:
        raise GatewayError("upstream_protocol_error")
    expected = "response.deleted" if method == "DELETE" else "response"
    if body.get("object") != expected:
        raise GatewayError("upstream_protocol_error")
    if method == "GET":
        body["model"] = alias
    return body
