"""The pure planning chain as one call, for tests of the descriptors.

``plan_request`` is a descriptor's ``plan``; ``render`` runs what the pipeline
runs after its catalog lookups and before sending -- ``check_records`` on the
records, the descriptor's ``forward``, ``body.layout`` with each media slot
filled by a given URL, and the worker's body limit -- and returns the bytes.
Inline-data parts stand for records staged after admission (their kind is
checked as ``EvidenceService.upload_inline`` does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.apis.base import Api, MediaRef, Plan, PlanContext
from gateway.apis.chat.api import FIELD_NAMES as CHAT_FIELDS
from gateway.apis.chat.api import ChatApi
from gateway.apis.chat.completions import FIELD_NAMES as COMPLETION_FIELDS
from gateway.apis.chat.completions import CompletionsApi
from gateway.apis.media import check_records, data_url_parts, inline_size
from gateway.apis.sampling import REFUSED_FIELDS as _REFUSED
from gateway.config.policy import Tenant
from gateway.core.body import check_size, layout
from gateway.core.errors import GatewayError

Endpoint = Literal["chat.completions", "completions"]
RequestPlan = Plan
REFUSED_FIELDS = frozenset(_REFUSED)
__all__ = [
    "CHAT_FIELDS",
    "COMPLETION_FIELDS",
    "REFUSED_FIELDS",
    "MediaRef",
    "RequestPlan",
    "ResolvedMedia",
    "data_url_parts",
    "inline_size",
    "plan_request",
    "render",
]
APIS: dict[str, Api] = {"chat.completions": ChatApi(), "completions": CompletionsApi()}
NONCE = "0123456789abcdef"


@dataclass(frozen=True, slots=True)
class ResolvedMedia:
    """What the worker sees for one media part, and the record behind it."""

    url: str
    modality: str
    media_type: str
    size: int
    evidence_id: str
    sha256: str
    locator_sha256: str | None

    @property
    def id(self) -> str:
        return self.evidence_id

    @property
    def bytes(self) -> int:
        return self.size


def plan_request(
    endpoint: Endpoint, body: Any, tenant: Tenant, aliases: Mapping[str, str] | None = None
) -> Plan:
    assert aliases is None or dict(aliases) == tenant.policy.models
    return APIS[endpoint].plan(body, PlanContext(tenant, NONCE))


def render(
    plan: Plan,
    resolved: Sequence[ResolvedMedia],
    *,
    route: str,
    tenant: Tenant,
    max_request_bytes: int,
    dumps: Callable[[Any], bytes],
) -> bytes:
    if len(resolved) != len(plan.media):
        raise ValueError("every pending media ref needs exactly one resolution")
    records = {}
    for ref, media in zip(plan.media, resolved, strict=True):
        if ref.source == "evidence":
            assert ref.evidence_id is not None
            records[ref.evidence_id] = media
        elif media.modality != ref.kind:
            raise GatewayError("modality_not_allowed", "A part refers to other data.")
    check_records(plan, records, tenant, "messages")
    if sum(m.size for m in resolved) > tenant.limits.max_media_bytes:
        raise GatewayError("media_limit_exceeded", "Media exceeds this tenant's byte limit.")
    forward = APIS[plan.endpoint].forward(plan, route)
    out = layout(forward, plan.nonce, [dumps(m.url) for m in resolved], dumps)
    check_size(out.size, max_request_bytes)
    body = b"".join(s for s in out.segments if isinstance(s, bytes))
    assert len(body) == out.size
    return body
