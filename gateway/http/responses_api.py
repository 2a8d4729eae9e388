"""``GET`` and ``DELETE /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``
(spec §14, §17): only for the caller's own kept responses, never forwarded;
``POST /v1/responses/{id}/cancel``: 400, as background responses are not served.

Every Responses request reaches the worker with ``store: false`` (spec §17),
so the worker keeps nothing to fetch or delete: these are answered from what
the gateway kept (``gateway/books/responses.py``). Anything else -- another
tenant's id, an expired one, one sent with ``store: false``, one the gateway
never saw, a malformed one -- answers 404 ``response_not_found``, so another
tenant's id looks exactly like an unknown one.

- ``GET`` answers the kept response object (the caller-facing one: the
  gateway's id, the alias, the usage the tenant sees). A response kept
  without it (larger than ``MAX_KEPT_BYTES``) is 404 while its conversation
  still works.
- ``DELETE`` forgets the kept response and answers 200; a follow-up naming it
  is 404 from then on.
- ``input_items`` lists the response's own request's input items (not the
  conversation before it), as the OpenAI SDK's ``responses.input_items.list``
  reads them (``conversation.input_items_page``: ``order``, ``limit``,
  ``after``; a bad value is 400 naming its query parameter).

``POST …/cancel`` (the SDK's ``responses.cancel``) cancels a background run,
and ``background: true`` is refused at create (spec §14), so there is never
anything to cancel: after authentication (as ``GET``) it answers 400
``invalid_request`` with ``param: "background"``, for any id, without a
lookup or a worker call (the worker's cancel route stays unreachable).
"""

from __future__ import annotations

from urllib.parse import parse_qsl

import orjson

from gateway.apis.responses.api import RESPONSE_ID
from gateway.apis.responses.conversation import input_items_page
from gateway.books.protocols import KeptResponse
from gateway.core.errors import GatewayError
from gateway.http.asgi import info_of, runtime_of, send_error, send_json, tenant_for
from gateway.http.runtime import Runtime
from gateway.types import Receive, Scope, Send


async def _own(scope: Scope, rt: Runtime, *, replayed: bool = False) -> tuple[str, KeptResponse]:
    """(the tenant, its kept response the path names); 404 unless its own.
    ``replayed``: the response object itself is asked for (``GET``), which
    cannot be streamed (checked before the lookup)."""
    tenant = await tenant_for(scope, rt, "responses")
    if replayed:
        _refuse_stream(scope)
    response_id: str = scope["path_params"]["response_id"]
    kept = None
    if RESPONSE_ID.fullmatch(response_id):
        kept = await rt.responses.get(tenant.name, response_id)
    if kept is None:
        raise GatewayError("response_not_found")
    return tenant.name, kept


async def response_item(scope: Scope, receive: Receive, send: Send) -> None:
    rt = runtime_of(scope)
    info = info_of(scope)
    info.endpoint = "responses"
    try:
        tenant, kept = await _own(scope, rt, replayed=scope["method"] == "GET")
        if scope["method"] == "DELETE":
            if not await rt.responses.forget(tenant, kept.id):
                raise GatewayError("response_not_found")  # forgotten meanwhile
            answer = {"id": kept.id, "object": "response.deleted", "deleted": True}
        elif kept.body is None:
            raise GatewayError("response_not_found")
        else:
            await _send_raw(send, kept.body)
            return
    except GatewayError as exc:
        await send_error(send, exc, info)
        return
    await send_json(send, 200, answer)


async def response_input_items(scope: Scope, receive: Receive, send: Send) -> None:
    rt = runtime_of(scope)
    info = info_of(scope)
    info.endpoint = "responses"
    try:
        _, kept = await _own(scope, rt)
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        items = orjson.loads(kept.input_items)
        answer = input_items_page(items if isinstance(items, list) else [], query)
    except GatewayError as exc:
        await send_error(send, exc, info)
        return
    await send_json(send, 200, answer)


STREAM_MESSAGE = (
    "A kept response is answered whole; streaming it again is not served "
    "(the gateway keeps the final response object, not its events)."
)


def _refuse_stream(scope: Scope) -> None:
    """``?stream=true`` (the SDK's ``responses.retrieve(id, stream=True)``) would
    replay the response's events, which are not kept (spec §24): 400 rather than
    a JSON body the SDK would read as an empty stream."""
    query = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
    if any(name == "stream" and value.lower() != "false" for name, value in query):
        raise GatewayError("unsupported_field", STREAM_MESSAGE, param="stream")


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
