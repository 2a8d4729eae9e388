"""``GET``/``DELETE /v1/files/{id}`` and ``GET /v1/files/{id}/content`` (spec §22 "Files").

The HTTP face of :class:`~gateway.books.files.book.FileBook`: the files a
tenant's agent runs produced, for that tenant only (policy endpoint
``files``, scope ``inference``). Another tenant's id, an expired or deleted
one, a malformed one: 404 ``file_not_found``, the same answer as an id
never made.

- ``GET /v1/files/{id}``: the record, OpenAI-file-shaped (``object: file``,
  ``purpose: agent_output``) plus ``mime_type`` and ``sha256``.
- ``GET /v1/files/{id}/content``: the bytes, checked against the digest
  before the first is sent, streamed from the blob held open (a delete
  meanwhile does not cut them). A produced file is the worker's (the
  model's) output and may be anything, an HTML page or an SVG with script
  included, so it is never served as something a browser runs in the
  gateway's origin: ``Content-Type`` is the type sniffed from the bytes
  (HTML and SVG are ``text/plain``), ``Content-Disposition: attachment``,
  ``X-Content-Type-Options: nosniff``, ``Content-Security-Policy: sandbox``
  (no script, no same origin, even if opened), ``Cache-Control: private,
  no-store``.
- ``DELETE /v1/files/{id}``: forgets it through every replica;
  ``{"id", "object": "file", "deleted": true}``.

There is no listing route (``GET /v1/files`` is 404 ``not_found``): a file's
id reaches the caller that produced it, in that request's answer, and
within a tenant holding the id is what lets a caller read it; a listing
would show every caller of the tenant every other's outputs. The worker's
own ``/v1/files`` (which lists every caller's files) is never called.
"""

from __future__ import annotations

import logging
from urllib.parse import quote

from gateway.books.files.sniff import content_type
from gateway.core.errors import GatewayError
from gateway.http.asgi import (
    ABORT_EXTENSION,
    info_of,
    runtime_of,
    send_error,
    send_json,
    tenant_for,
)
from gateway.http.signed_files import has_link, signed_file_content
from gateway.types import Receive, Scope, Send

log = logging.getLogger("gateway.files")

#: what a file's content is served with besides its type, length and name
_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", b"sandbox"),
    (b"cache-control", b"private, no-store"),
)


def disposition(name: str) -> bytes:
    """``attachment`` with the name twice: a quoted ASCII fallback (anything
    else, quotes, backslashes and ``%`` as ``_``) and the exact UTF-8 name
    percent-encoded (RFC 6266, RFC 8187); nothing of it can end the header."""
    fallback = "".join(c if " " <= c <= "~" and c not in '"\\%' else "_" for c in name)
    encoded = quote(name, safe="")
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}".encode("ascii")


async def file_item(scope: Scope, receive: Receive, send: Send) -> None:
    rt = runtime_of(scope)
    info = info_of(scope)
    info.endpoint = "files"
    file_id: str = scope["path_params"]["file_id"]
    try:
        tenant = await tenant_for(scope, rt, "files")
        if scope["method"] == "DELETE":
            record = await rt.files.delete(tenant.name, file_id)
            answer = {"id": record.id, "object": "file", "deleted": True}
        else:
            answer = (await rt.files.get(tenant.name, file_id)).to_api()
    except GatewayError as exc:
        await send_error(send, exc, info)
        return
    await send_json(send, 200, answer)


async def file_content(scope: Scope, receive: Receive, send: Send) -> None:
    if has_link(scope):
        # A signed image link (spec §23): the link is the credential.
        await signed_file_content(scope, receive, send)
        return
    rt = runtime_of(scope)
    info = info_of(scope)
    info.endpoint = "files"
    file_id: str = scope["path_params"]["file_id"]
    try:
        tenant = await tenant_for(scope, rt, "files")
        record = await rt.files.get(tenant.name, file_id)
        content = await rt.files.open(record)
    except GatewayError as exc:
        await send_error(send, exc, info)
        return
    try:
        try:
            await content.verify()
        except GatewayError as exc:
            await send_error(send, exc, info)
            return
        headers = [
            (b"content-type", content_type(record.mime_type).encode("ascii")),
            (b"content-length", b"%d" % record.bytes),
            (b"content-disposition", disposition(record.name)),
            *_HEADERS,
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        try:
            async for piece in content.pieces():
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        except GatewayError as exc:
            # After the head no status can change: the connection is dropped,
            # so the caller sees a body shorter than its Content-Length.
            log.error("files: a file failed while being sent (%s)", exc.code)
            info.error_code = exc.code
            abort = scope.get("extensions", {}).get(ABORT_EXTENSION)
            if abort is not None:
                abort()
            return
        await send({"type": "http.response.body", "body": b""})
    finally:
        content.close()
