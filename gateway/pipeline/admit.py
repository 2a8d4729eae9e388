"""A request's admission permit on one worker (spec §7, §16): its weight
from the tenant's cost table and its media, its fair share, its queue bound."""

from __future__ import annotations

from collections.abc import Awaitable

from gateway.admission import Permit, request_weight
from gateway.apis.base import Plan
from gateway.config.policy import Tenant
from gateway.upstream.table import Worker


def permit_for(tenant: Tenant, worker: Worker, plan: Plan) -> Awaitable[Permit]:
    admission = tenant.policy.admission
    return worker.admission.acquire(
        tenant.name,
        request_weight(tenant.policy.cost, [m.kind for m in plan.media]),
        share=admission.share,
        max_permits=admission.max_permits,
        timeout_s=admission.queue_timeout_s,
    )
