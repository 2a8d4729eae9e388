"""``POST /v1/agent/approvals/{approval_id}``: a caller decides a tool call
the gateway asked it about (spec §22 "Asking the caller").

The gateway's own route, never the worker's (whose approval route takes any
id from anyone): the id is the gateway's ``apr_…``, bound to the tenant and
the request that opened it, and the decision is written to the state store
(:class:`~gateway.books.approvals.ApprovalBook`), so it works through any
replica; the replica holding the stream picks it up within a second (at
once when it is this one), and only that replica talks to its worker.

- Scope ``inference``; the tenant must allow an endpoint agentic streams run
  on (``chat.completions`` or ``messages``).
- Body: exactly ``{"decision": "approve" | "deny"}``.
  ``remember_for_session`` is 400 ``unsupported_field`` (the worker would
  apply it to every later call of the session, which the gateway decides
  call by call); any other field is ``unsupported_field`` naming it; a
  missing or other decision is 400 ``invalid_request`` (``param:
  decision``). An explicit ``null`` is the field's absence.
- 200 ``{"status": "resolved"}``; a second decision 409
  ``approval_resolved``; an id unknown, malformed, another tenant's, closed
  (its stream ended, decided or timed out) or expired: 404
  ``approval_not_found``, one answer for all.
"""

from __future__ import annotations

import re
from typing import Any, Final, cast

from gateway.books.protocols import DECISION_VALUES, Decision
from gateway.core.errors import GatewayError
from gateway.http.asgi import info_of, runtime_of, send_error, send_json, tenant_for
from gateway.http.bodyguard import ClientDisconnected, parse_json, read_body
from gateway.types import Receive, Scope, Send

#: ``apr_`` and 128 random bits in hex (``new_approval_id``)
APPROVAL_ID: Final = re.compile(r"apr_[0-9a-f]{32}")
#: a decision is a few bytes; anything much larger is not one
_MAX_BODY = 4096
_MAX_DEPTH = 4


def decision_of(body: Any) -> Decision:
    """The decision a body carries, or the 400 that names what is wrong with it."""
    if not isinstance(body, dict):
        raise GatewayError("invalid_request", "The body must be a JSON object.")
    fields = {k: v for k, v in body.items() if v is not None}
    if "remember_for_session" in fields:
        raise GatewayError(
            "unsupported_field",
            "remember_for_session is not supported: the gateway decides each call.",
            param="remember_for_session",
        )
    extra = sorted(k for k in fields if k != "decision")
    if extra:
        raise GatewayError("unsupported_field", param=extra[0])
    decision = fields.get("decision")
    if not isinstance(decision, str) or decision not in DECISION_VALUES:
        raise GatewayError(
            "invalid_request", 'decision must be "approve" or "deny".', param="decision"
        )
    return cast(Decision, decision)


async def approval_decide(scope: Scope, receive: Receive, send: Send) -> None:
    rt = runtime_of(scope)
    info = info_of(scope)
    info.endpoint = "approvals"
    approval_id: str = scope["path_params"]["approval_id"]
    try:
        tenant = await tenant_for(scope, rt, "approvals")
        if APPROVAL_ID.fullmatch(approval_id) is None:
            raise GatewayError("approval_not_found")
        raw = await read_body(scope, receive, _MAX_BODY, rt.config.listen.body_timeout_s)
        decision = decision_of(parse_json(raw, _MAX_DEPTH))
        outcome = await rt.approvals.decide(tenant.name, approval_id, decision)
        if outcome == "already_resolved":
            raise GatewayError("approval_resolved")
        if outcome == "not_found":
            raise GatewayError("approval_not_found")
    except ClientDisconnected:
        return
    except GatewayError as exc:
        await send_error(send, exc, info)
        return
    await send_json(send, 200, {"status": "resolved"})
