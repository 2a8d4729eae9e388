"""The evidence API: ``/v1/evidence`` (list, upload) and ``/v1/evidence/{id}`` (get, delete).

The HTTP face of :class:`~gateway.books.evidence.service.EvidenceService` (which
owns the rules). What an upload may cost is bounded before its body is read
(spec §13): the tenant's ``requests_per_minute`` counts it, at most
``staging.max_concurrent_uploads`` are read at once (the next gets 429
``queue_full``), a declared ``Content-Length`` is checked against the size
limit and the quota, and the body goes to a temp file in pieces of at most
:data:`_PIECE` bytes, never into memory whole. Uploads are refused while
receipts cannot be written; reads and deletes are served, so a tenant can
always free space.
"""

from __future__ import annotations

from urllib.parse import parse_qs

import anyio.to_thread

from gateway.books.evidence.service import locator_digest
from gateway.config.policy import Tenant
from gateway.core.errors import GatewayError
from gateway.http.asgi import header, info_of, runtime_of, send_error, send_json, tenant_for
from gateway.http.bodyguard import ClientDisconnected, body_pieces, declared_length
from gateway.http.runtime import Runtime
from gateway.ratelimit import TenantLimits
from gateway.types import Receive, Scope, Send

#: bytes handed to the temp file per thread hop
_PIECE = 1 << 20
_MAX_PAGE = 100
_DEFAULT_PAGE = 20


async def evidence_collection(scope: Scope, receive: Receive, send: Send) -> None:
    rt = runtime_of(scope)
    info = info_of(scope)
    info.endpoint = "evidence"
    try:
        tenant = await tenant_for(scope, rt, "evidence")
        if scope["method"] == "GET":
            await _list(scope, send, rt, tenant)
        else:
            await _upload(scope, receive, send, rt, tenant)
    except ClientDisconnected:
        return
    except GatewayError as exc:
        await send_error(send, exc, info)


async def evidence_item(scope: Scope, receive: Receive, send: Send) -> None:
    rt = runtime_of(scope)
    info = info_of(scope)
    info.endpoint = "evidence"
    evidence_id: str = scope["path_params"]["evidence_id"]
    try:
        tenant = await tenant_for(scope, rt, "evidence")
        if scope["method"] == "DELETE":
            await rt.evidence.delete(tenant, evidence_id)
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        record = await rt.evidence.get(tenant, evidence_id)
    except GatewayError as exc:
        await send_error(send, exc, info)
        return
    await send_json(send, 200, record.to_api())


async def _list(scope: Scope, send: Send, rt: Runtime, tenant: Tenant) -> None:
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    limit = _DEFAULT_PAGE
    if "limit" in query:
        raw = query["limit"]
        if len(raw) != 1 or not raw[0].isdigit() or not 1 <= int(raw[0]) <= _MAX_PAGE:
            raise GatewayError(
                "invalid_request", f"limit must be an integer from 1 to {_MAX_PAGE}.", param="limit"
            )
        limit = int(raw[0])
    after = query.get("after", [None])
    if len(after) != 1:
        raise GatewayError("invalid_request", "after is repeated.", param="after")
    records, more = await rt.evidence.page(tenant, limit, after[0])
    body = {"object": "list", "data": [r.to_api() for r in records], "has_more": more}
    await send_json(send, 200, body)


async def _upload(scope: Scope, receive: Receive, send: Send, rt: Runtime, tenant: Tenant) -> None:
    rt.check_books()
    content_type = _single(scope, b"content-type")
    # The locator digest is of its UTF-8 text (spec §12), as `evidence add` computes it.
    locator = _single(scope, b"x-evidence-locator", "utf-8")
    locator_digest(locator)  # refused before the body is read
    limits = tenant.limits
    hold = await rt.ratelimit.reserve(
        tenant.name,
        TenantLimits(limits.requests_per_minute, None, None, None),
        0,
        concurrent=False,
    )
    rt.ratelimit.settle(hold, 0)  # nothing to settle: the upload itself stays counted
    await _check_quota(rt, tenant, declared_length(scope))
    if rt.uploads.locked():
        raise GatewayError(
            "queue_full", "Too many uploads are being read.", headers={"Retry-After": "1"}
        )
    async with rt.uploads:
        upload = await anyio.to_thread.run_sync(rt.evidence.begin_upload)
        try:
            pending: list[bytes] = []
            size = 0
            timeout = rt.config.listen.body_timeout_s
            async for piece in body_pieces(scope, receive, limits.max_media_bytes, timeout):
                pending.append(piece)
                size += len(piece)
                if size >= _PIECE:
                    await anyio.to_thread.run_sync(upload.write, b"".join(pending))
                    pending, size = [], 0
            if pending:
                await anyio.to_thread.run_sync(upload.write, b"".join(pending))
            record, existed = await rt.evidence.commit_upload(tenant, upload, content_type, locator)
        finally:
            upload.discard()
    await send_json(send, 200 if existed else 201, record.to_api(), hold.headers())


async def _check_quota(rt: Runtime, tenant: Tenant, declared: int | None) -> None:
    """Refuse before reading what cannot fit whatever the body turns out to be: a
    tenant already past its quota (a lowered policy), or a body larger than the
    whole byte quota. The rest is decided on insert, after the identical-upload
    check (the same bytes again cost nothing)."""
    policy = tenant.policy.evidence
    count, used = await rt.evidence.usage(tenant)
    if count > policy.max_records or used > policy.max_bytes or (declared or 0) > policy.max_bytes:
        raise GatewayError("evidence_quota_exceeded")


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
