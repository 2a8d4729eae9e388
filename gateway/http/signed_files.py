"""``GET /v1/files/{id}/content?sig=…&exp=…``: a signed image link, without credentials.

What a ``response_format: url`` image answer links to (spec §23): the link's
signature (HMAC over the file id and ``exp``, ``gateway/core/signed_urls.py``)
is the credential, until ``exp``. A link that is malformed, forged, expired
or names a file no longer kept is 401 ``invalid_token`` with one message
for all of them (a caller learns nothing about which); a request with no
``sig`` is 401 ``missing_credentials``.

Interim: the agents' file API (spec §22: ``GET /v1/files/{id}[/content]`` and
``DELETE`` with credentials) takes this path over; this handler is then its
signed-link branch. Only the first ``sig`` and ``exp`` of the query are read.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from gateway.core.errors import GatewayError
from gateway.core.replies import Pieces, send_pieces
from gateway.http.asgi import info_of, runtime_of, send_error
from gateway.types import Receive, Scope, Send

_BAD_LINK = "The link is not valid or has expired."


async def signed_file_content(scope: Scope, receive: Receive, send: Send) -> None:
    rt = runtime_of(scope)
    info = info_of(scope)
    info.endpoint = "files"
    file_id: str = scope["path_params"]["file_id"]
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"), max_num_fields=8)
    sig, exp = query.get("sig", [""])[0], query.get("exp", [""])[0]
    try:
        if not sig:
            raise GatewayError("missing_credentials")
        if not rt.links.opens(file_id, sig, exp):
            raise GatewayError("invalid_token", _BAD_LINK)
        found = await rt.image_files.get(file_id)
        if found is None:
            raise GatewayError("invalid_token", _BAD_LINK)
    except GatewayError as exc:
        await send_error(send, exc, info)
        return
    record, data = found
    info.tenant = record.tenant
    headers = {
        # A link is a bearer credential: keep it out of shared caches and referrers.
        "cache-control": "private, no-store",
        "referrer-policy": "no-referrer",
        "x-content-type-options": "nosniff",
    }
    await send_pieces(send, 200, Pieces(record.mime_type.encode("latin-1"), (data,)), headers)
