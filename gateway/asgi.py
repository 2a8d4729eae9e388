"""Small raw-ASGI helpers shared by the handlers: per-request info, JSON replies.

Handlers that stream or watch for disconnects are raw ASGI (Starlette's
request/response wrappers would hide ``http.disconnect``); they share these.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from gateway.auth.failures import failure_reason
from gateway.errors import GatewayError
from gateway.metrics import UNKNOWN_TENANT
from gateway.tracing import NO_SPAN, Span

if TYPE_CHECKING:
    from gateway.runtime import Runtime

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")

#: scope["extensions"] key of the listener's "drop this connection now" callable
ABORT_EXTENSION = "gateway.abort"


@dataclass(slots=True)
class RequestInfo:
    """Per-request facts the middleware logs and counts once the response ends."""

    request_id: str
    started: float
    endpoint: str = "other"
    tenant: str = UNKNOWN_TENANT
    status: int = 0
    outcome: str | None = None
    error_code: str | None = None
    #: the request's trace span (NO_SPAN when tracing is off or for probes)
    span: Span = NO_SPAN
    #: the span's final name when the handler knows a better one than its route
    span_name: str | None = None
    #: why authentication failed (gateway.auth.failures.REASONS), for operators only
    auth_failure: str | None = None


def header(scope: Scope, name: bytes) -> list[bytes]:
    """Every value of a (lower-case) request header, in order."""
    return [v for k, v in scope["headers"] if k == name]


def request_id_from(scope: Scope) -> str:
    values = header(scope, b"x-request-id")
    if len(values) == 1:
        candidate: str = values[0].decode("latin-1")
        if _REQUEST_ID.fullmatch(candidate):
            return candidate
    return "req_" + os.urandom(16).hex()


def info_of(scope: Scope) -> RequestInfo:
    info = scope["state"]["gateway"]
    assert isinstance(info, RequestInfo)
    return info


def runtime_of(scope: Scope) -> Runtime:
    runtime: Runtime = scope["app"].state.runtime
    return runtime


def authorization_values(scope: Scope) -> list[str]:
    return [v.decode("latin-1") for v in header(scope, b"authorization")]


async def send_json(
    send: Send,
    status: int,
    body: Any,
    headers: Mapping[str, str] | None = None,
) -> None:
    payload = orjson.dumps(body)
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    raw_headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": payload})


async def send_error(send: Send, exc: GatewayError, info: RequestInfo) -> None:
    info.error_code = exc.code
    info.auth_failure = failure_reason(exc)
    await send_json(send, exc.status, exc.body(), exc.response_headers())
