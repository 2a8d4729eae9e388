"""A request's admission permit on one worker (spec §7, §16): its weight
from the tenant's cost table and its media (an image generation or a speech
request: its own cost, spec §23), its fair share, its queue bound."""

from __future__ import annotations

from collections.abc import Awaitable

from gateway.admission import Permit, request_weight
from gateway.apis.base import Endpoint, Plan
from gateway.config.policy import Tenant
from gateway.upstream.table import Worker


def weight(tenant: Tenant, plan: Plan, endpoint: Endpoint) -> int:
    """Permit units of one worker call of ``plan``."""
    cost = tenant.policy.cost
    if endpoint.cost == "image_generation":
        return cost.image_generation
    if endpoint.cost == "speech":
        return cost.speech
    return request_weight(cost, [m.kind for m in plan.media])


def permit_now(tenant: Tenant, worker: Worker, plan: Plan, endpoint: Endpoint) -> Permit | None:
    """The permit without a wait when nothing waits for the worker and it fits
    (an unloaded worker's every request); None: await :func:`permit_for`."""
    admission = tenant.policy.admission
    return worker.admission.try_acquire(
        tenant.name,
        weight(tenant, plan, endpoint),
        share=admission.share,
        max_permits=admission.max_permits,
        timeout_s=admission.queue_timeout_s,
    )


def permit_for(tenant: Tenant, worker: Worker, plan: Plan, endpoint: Endpoint) -> Awaitable[Permit]:
    admission = tenant.policy.admission
    return worker.admission.acquire(
        tenant.name,
        weight(tenant, plan, endpoint),
        share=admission.share,
        max_permits=admission.max_permits,
        timeout_s=admission.queue_timeout_s,
    )
