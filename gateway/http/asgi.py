"""Small raw-ASGI helpers shared by the handlers: scope accessors, the
tenant of a small endpoint, error replies.

Handlers that stream or watch for disconnects are raw ASGI (Starlette's
request/response wrappers would hide ``http.disconnect``); they share these.
"""

from __future__ import annotations

import os
import re
from types import MappingProxyType

from gateway.auth.authenticator import authorize
from gateway.auth.failures import failure_reason
from gateway.config.policy import Tenant
from gateway.core.errors import GatewayError
from gateway.core.replies import send_json
from gateway.http.runtime import Runtime
from gateway.observe.access import RequestInfo
from gateway.types import Scope, Send

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")

#: scope["extensions"] key of the listener's "drop this connection now" callable
ABORT_EXTENSION = "gateway.abort"
#: scope["extensions"] key of the listener's ``watch(callback) -> stop`` for
#: the caller going away (gateway/http/protocol.py)
DISCONNECT_EXTENSION = "gateway.disconnect"

#: the scope each small endpoint needs (spec §4 "Scopes"); inference
#: descriptors carry their own (gateway/apis)
_SCOPES = {
    "models": "inference",
    "evidence": "evidence",
    "responses": "inference",
    "files": "inference",
    "approvals": "inference",
}
#: an approval belongs to an agentic stream: a tenant that may call either
#: endpoint such a stream runs on may decide its own (spec §22)
_ALLOWED_BY = MappingProxyType({"approvals": ("chat.completions", "messages")})


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
    """The request's credential as ``Authorization`` values: an ``x-api-key``
    (Anthropic SDKs, spec §19) is the same credential as a bearer one."""
    values = [v.decode("latin-1") for v in header(scope, b"authorization")]
    keys = header(scope, b"x-api-key")
    if not keys:
        return values
    if len(keys) != 1 or not keys[0].strip():
        raise GatewayError("missing_credentials")
    key = keys[0].decode("latin-1").strip()
    if values and (len(values) != 1 or values[0].split(maxsplit=1)[-1].strip() != key):
        # Two different credentials: neither is trusted.
        raise GatewayError("invalid_token")
    return [f"Bearer {key}"]


async def tenant_for(scope: Scope, rt: Runtime, endpoint: str) -> Tenant:
    """Authenticate and authorize a small endpoint's caller (models, evidence,
    responses, files, approvals)."""
    policies = rt.policies
    principal = await rt.auth.authenticate(authorization_values(scope), policies)
    tenant = policies.tenants[principal.tenant]
    info_of(scope).tenant = tenant.name
    scope_needed = _SCOPES[endpoint]
    choices = _ALLOWED_BY.get(endpoint, (endpoint,))
    allowed = next((e for e in choices if tenant.allows_endpoint(e)), choices[0])
    authorize(principal, tenant, allowed, scope_needed)
    return tenant


async def scraper_for(scope: Scope, rt: Runtime) -> None:
    """Authenticate a scrape of ``/metrics`` on the callers' port (spec §24): a
    credential with scope ``metrics`` (every tenant's totals are in it)."""
    policies = rt.policies
    principal = await rt.auth.authenticate(authorization_values(scope), policies)
    tenant = policies.tenants[principal.tenant]
    info_of(scope).tenant = tenant.name
    authorize(principal, tenant, None, "metrics")


async def send_error(
    send: Send, exc: GatewayError, info: RequestInfo, shape: str = "openai"
) -> None:
    """The error as one JSON reply, in the path's shape (spec §6, §19)."""
    info.error_code = exc.code
    info.auth_failure = failure_reason(exc)
    body = exc.anthropic_body() if shape == "anthropic" else exc.body()
    await send_json(send, exc.status, body, exc.response_headers())


__all__ = [
    "ABORT_EXTENSION",
    "DISCONNECT_EXTENSION",
    "authorization_values",
    "header",
    "info_of",
    "request_id_from",
    "runtime_of",
    "scraper_for",
    "send_error",
    "send_json",
    "tenant_for",
]
