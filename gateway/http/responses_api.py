"""``GET`` and ``DELETE /v1/responses/{id}`` (spec §14): only for the caller's own ids;
``POST /v1/responses/{id}/cancel``: 400, as background responses are not served.

A Responses id is the tenant's once the gateway relayed it (the catalog's
``responses`` table, kept ``responses.ttl_s``; ``gateway/books/responses.py``).
Anything else -- another tenant's id, an expired one, one the gateway never
saw, a malformed one -- answers 404 ``response_not_found`` without reaching
the worker, so another tenant's id looks exactly like an unknown one.

``GET`` answers from the response object the gateway kept: it streams every
request from the worker (spec §9) and the worker keeps no streamed response
for ``GET``. Without a kept copy (``store: false``, a stream that never
finished) it is forwarded. ``DELETE`` is forwarded (the worker drops the
conversation history ``previous_response_id`` reads) and forgets the id here;
an id the worker no longer knows is still deleted here. The worker's answers
are checked (id, object type) and the alias is put back in ``model``; a
fetched response object gets the fields the worker leaves out, as streamed
ones do (``response_events.fill_response``).

``POST …/cancel`` (the SDK's ``responses.cancel``) cancels a background run,
and ``background: true`` is refused at create (spec §14), so there is never
anything to cancel: after authentication (as ``GET``) it answers 400
``invalid_request`` with ``param: "background"``, for any id, without a
lookup or a worker call (the worker's cancel route stays unreachable).
"""

from __future__ import annotations

from typing import Any

from gateway.apis.response_fill import fill_response
from gateway.apis.responses import RESPONSE_ID
from gateway.core.errors import GatewayError
from gateway.http.asgi import info_of, runtime_of, send_error, send_json, tenant_for
from gateway.types import Receive, Scope, Send


async def response_item(scope: Scope, receive: Receive, send: Send) -> None:
    rt = runtime_of(scope)
    info = info_of(scope)
    info.endpoint = "responses"
    response_id: str = scope["path_params"]["response_id"]
    method: str = scope["method"]
    try:
        tenant = await tenant_for(scope, rt, "responses")
        found = None
        if RESPONSE_ID.fullmatch(response_id):
            found = await rt.responses.entry(tenant.name, response_id)
        if found is None:
            raise GatewayError("response_not_found")
        alias, kept, upstream_id = found
        # The worker knows it by its own id; the caller sees the gateway's (spec §21).
        worker_id = upstream_id or response_id
        if method == "GET" and kept is not None:
            await _send_raw(send, kept)
            return
        resolved = rt.table.resolve(tenant.policy.models, alias, rt.readiness)
        if resolved is None:
            raise GatewayError("response_not_found")  # its alias is gone from the policy
        rt.check_serving()  # what follows reaches the worker
        if not resolved.ready:
            raise GatewayError("upstream_not_ready")
        worker = resolved.worker
        status, body = await worker.client.request_json(
            method,
            f"/v1/responses/{worker_id}",
            info.request_id,
            worker.config.readiness_timeout_s * 5,
        )
        if method == "DELETE":
            if status not in (200, 404):
                raise GatewayError("upstream_error")
            await rt.responses.forget(tenant.name, response_id)
            answer = {"id": response_id, "object": "response.deleted", "deleted": True}
            if status == 200:
                answer = _checked(method, worker_id, body, alias)
                answer["id"] = response_id
        elif status == 404:
            raise GatewayError("response_not_found")
        elif status != 200:
            raise GatewayError("upstream_error")
        else:
            answer = _checked(method, worker_id, body, alias)
            answer["id"] = response_id
            if tenant.policy.usage_details != "full":
                fill_response(answer, full_usage=False)
    except GatewayError as exc:
        await send_error(send, exc, info)
        return
    await send_json(send, 200, answer)


CANCEL_MESSAGE = (
    "Background responses are not served, so there is none to cancel: a response is "
    "answered within its request (closing the connection stops it)."
)


async def response_cancel(scope: Scope, receive: Receive, send: Send) -> None:
    rt = runtime_of(scope)
    info = info_of(scope)
    info.endpoint = "responses"
    try:
        await tenant_for(scope, rt, "responses")
        raise GatewayError("invalid_request", CANCEL_MESSAGE, param="background")
    except GatewayError as exc:
        await send_error(send, exc, info)


async def _send_raw(send: Send, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _checked(method: str, response_id: str, body: Any, alias: str) -> dict[str, Any]:
    if not isinstance(body, dict) or body.get("id") != response_id:
        raise GatewayError("upstream_protocol_error")
    expected = "response.deleted" if method == "DELETE" else "response"
    if body.get("object") != expected:
        raise GatewayError("upstream_protocol_error")
    if method == "GET":
        body["model"] = alias
        fill_response(body)
    return body
