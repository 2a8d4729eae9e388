"""A release's fallback (spec §18): one more attempt on the other arm.

When the alias names a release with ``fallback``, a connection refused or
reset before the worker's response head, or a 5xx head, is sent once to the
other arm. Nothing else is retried: not a timeout, not a failure after the
head (the relay may have sent something). The caller sees one answer.

Order matters: the failed attempt lets go of its worker (live count, body,
span) first; then the other arm's body is laid out and the first arm's
permit given back *before* the other's is waited for (a tenant's
``max_permits`` counts across upstreams, and the first worker has no part
of the request any more); only once that permit is held does the request
become the other arm's -- the receipt names the arm that answered, and the
failed attempt is counted for its own arm (a canary's fallback is a canary
failure in the gate). If the other arm's permit cannot be had, the caller
hears the first failure.
"""

from __future__ import annotations

from typing import Any

from gateway.apis.base import Api, Plan
from gateway.books.receipts import ReleaseMark
from gateway.core.body import Layout, check_size
from gateway.core.errors import GatewayError
from gateway.observe.tracing import NS, step
from gateway.pipeline.admit import permit_for
from gateway.pipeline.call import Call, Routed
from gateway.pipeline.media import body_layout
from gateway.pipeline.timings import ms, now
from gateway.upstream.table import Resolved

#: failures before the worker's head that a release's fallback retries once
_FALLBACK_CODES = frozenset({"upstream_unavailable", "upstream_error"})


class Fallback:
    def __init__(
        self, call: Call, routed: Routed, api: Api, plan: Plan, forward: dict[str, Any]
    ) -> None:
        self.call, self.routed, self.api, self.plan = call, routed, api, plan
        #: the first arm's forwarded body (a conversation already expanded into it)
        self.forward = forward

    async def take(self, exc: GatewayError) -> Layout | None:
        """The other arm's body, its permit held and the request moved there;
        None when ``exc`` may not be sent there."""
        other = self._other_arm(exc)
        if other is None:
            return None
        self._abandon(exc)
        try:
            body = await self._reroute(other)
        except GatewayError:
            return None  # no fallback after all: the caller hears the first failure
        self._switch(other, exc)
        return body

    def _other_arm(self, exc: GatewayError) -> Resolved | None:
        """The other arm, when this failure may be sent there: refused, reset or
        5xx before the worker's head (the relay sent nothing yet), the other arm ready."""
        call = self.call
        other = self.routed.resolved.other
        if other is None or exc.code not in _FALLBACK_CODES:
            return None
        timings, relay = call.timings, call.relay
        if timings.sent_at is None or timings.head_at is not None:
            return None
        if relay is not None and relay.state.headers_sent:
            return None
        return other if call.services.readiness.ready(other.route) else None

    def _abandon(self, exc: GatewayError) -> None:
        """Let go of the failed attempt: its worker's live count, its body, its span."""
        attempt = self.call.attempt
        if attempt is None:
            return
        if attempt.live:
            self.routed.worker.live -= 1
            attempt.live = False
        attempt.producer.close()  # kept: a fallback that does not happen leaves its digest
        if attempt.span is not None:
            attempt.span.end(error=exc.code, failed=True)
            attempt.span = None

    async def _reroute(self, other: Resolved) -> Layout:
        """The body naming the other arm's route, and a permit of its upstream."""
        call, routed, plan = self.call, self.routed, self.plan
        fresh = self.api.forward(plan, other.route)
        # Wherever the descriptor writes the route, the other's; the rest as sent.
        moved = {
            **self.forward,
            **{key: value for key, value in fresh.items() if value == other.route},
        }
        body = body_layout(moved, plan, routed.records, call.services.staging)
        check_size(body.size, other.worker.config.max_request_bytes)
        permit = routed.permit
        if permit is not None:
            routed.permit = None
            permit.release()
        queued_at = now()
        with step(call.info.span, "gateway.admission", {NS + "upstream": other.worker.name}):
            routed.permit = await permit_for(call.tenant, other.worker, plan, self.api.endpoint)
        waited = now() - queued_at
        call.timings.admission = (call.timings.admission or 0.0) + waited
        call.receipt.queue_ms = ms(call.timings.admission)
        return body

    def _switch(self, other: Resolved, exc: GatewayError) -> None:
        """From now on the request is the other arm's."""
        call, routed = self.call, self.routed
        first = routed.resolved
        assert first.release is not None and first.arm is not None
        call.services.table.releases.settled(
            first.release, first.arm, exc.outcome, exc.code, None, reached_worker=True
        )
        routed.resolved = other
        assert other.release is not None and other.arm is not None
        worker = other.worker
        call.receipt.answered_by(
            other.route,
            worker.name,
            worker.serve_identity,
            ReleaseMark(other.release, other.arm, fallback_from=first.arm),
        )
        attempt, timings = call.attempt, call.timings
        if attempt is not None and attempt.producer.media_s:
            timings.add_media(attempt.producer.media_s)  # the next attempt brings its own
        call.attempt = None
        timings.sent_at = None
