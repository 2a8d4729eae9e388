"""Requests that need the state store, refused while it is known to be down (spec §24).

A request needs the store when it names or stages evidence (its records and
leases), continues a conversation (``previous_response_id``: the chain is
read from the store) or is a Responses request whose answer is kept (``store``
not ``false``: kept before its id reaches the caller). While the last state
call failed (``StateCalls.degraded``, what ``/readyz`` lists as degraded),
such a request gets 503 ``state_unavailable`` before the worker is called,
streamed or not: a Responses stream must not run on the worker only to end,
after ``response.completed``, with an error event because its keep failed.
Requests that need no state keep serving. The backend's probe
(``StateCalls.watch``) ends the refusals as soon as the store answers.
"""

from __future__ import annotations

from gateway.apis.base import Plan
from gateway.books.state.calls import StateCalls
from gateway.core.errors import GatewayError

#: the endpoint whose answers are kept (``gateway/pipeline/worker.py`` keep_response)
_KEEPING_ENDPOINT = "responses"


def needs_state(plan: Plan) -> bool:
    """Whether serving ``plan`` reads or writes the state store (module docstring)."""
    if plan.media or plan.previous_response_id is not None:
        return True
    return plan.endpoint == _KEEPING_ENDPOINT and plan.body.get("store") is not False


def require_state(calls: StateCalls, plan: Plan) -> None:
    """Refuse a request that needs the store while it is known to be down."""
    if calls.degraded and needs_state(plan):
        raise GatewayError("state_unavailable")
