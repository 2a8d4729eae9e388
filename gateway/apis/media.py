"""Media parts, shared by every endpoint that takes them. Pure: no I/O.

Planning (:func:`plan_url`) turns one media URL into a placeholder and a
:class:`~gateway.apis.base.MediaRef`, or refuses it, before any lookup:
``evidence:<id>`` is staged evidence; ``data:`` is inline data (staged after
admission when the policy says ``inline_data: stage``); anything else is a
caller URL, refused (``caller_url_forbidden``) or dropped under
``caller_urls: drop`` -- never forwarded. A modality the tenant does not allow
is refused here too.

Checking (:func:`check_records`) runs on the catalog records the pipeline
looked up (no file read): each part's type against its record's modality,
the tenant's modalities again (a reload may have narrowed them), and the sum
of the bytes of every part (a repeated ID counts each time it is sent)
against ``max_media_bytes`` -- all before admission (spec §13).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from gateway.apis.base import MediaKind, MediaRef, Plan
from gateway.config.policy import Tenant
from gateway.core.body import placeholder
from gateway.core.errors import GatewayError

#: the refusals of a caller URL and of inline data (``media.inline_data: reject``)
URL_REFUSED = "Media must be referenced as evidence:<id>; caller URLs are not forwarded."
INLINE_REFUSED = (
    "Inline data is not accepted for this tenant: upload the bytes as evidence "
    "and reference them as evidence:<id>."
)
EVIDENCE_URL = re.compile(r"evidence:(ev_[A-Za-z0-9]{1,64})")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


class RecordView(Protocol):
    """The catalog fields media checks read (``evidence.catalog.EvidenceRecord``)."""

    @property
    def id(self) -> str: ...
    @property
    def media_type(self) -> str: ...
    @property
    def bytes(self) -> int: ...
    @property
    def modality(self) -> str: ...


def classify_url(url: str) -> Literal["evidence", "data", "caller"]:
    if EVIDENCE_URL.fullmatch(url):
        return "evidence"
    # Any whitespace or case trick around a data: URL is still inline data.
    if "".join(url.split()).lower().startswith("data:"):
        return "data"
    return "caller"


def plan_url(
    url: str, kind: MediaKind, flat_index: int, tenant: Tenant, plan: Plan, param: str
) -> str | None:
    """The placeholder that stands for ``url`` in the forwarded body, or None
    when the policy drops the part (its index is then in ``plan.dropped_parts``)."""
    source = classify_url(url)
    media = tenant.policy.media
    if source != "caller" and not tenant.allows_modality(kind):
        # Before any evidence lookup, decoding or staging.
        raise GatewayError(
            "modality_not_allowed", f"The {kind} modality is not allowed.", param=param
        )
    slot = len(plan.media)
    if source == "evidence":
        match = EVIDENCE_URL.fullmatch(url)
        assert match is not None
        plan.media.append(MediaRef(slot, flat_index, kind, "evidence", match.group(1)))
        return placeholder(plan.nonce, slot)
    if source == "data" and media.inline_data == "stage":
        size = inline_size(url, param)
        plan.media.append(MediaRef(slot, flat_index, kind, "data", data_url=url, inline_bytes=size))
        return placeholder(plan.nonce, slot)
    if media.caller_urls == "drop":
        plan.dropped_parts.append(flat_index)
        return None
    if source == "data":
        raise GatewayError("caller_url_forbidden", INLINE_REFUSED, param=param)
    raise GatewayError("caller_url_forbidden", URL_REFUSED, param=param)


def check_count(plan: Plan, tenant: Tenant, param: str) -> None:
    if len(plan.media) > tenant.limits.max_media_parts:
        raise GatewayError("media_limit_exceeded", "Too many media parts.", param=param)


def _split_data_url(url: str) -> tuple[str, str]:
    compact = "".join(url.split())
    head, sep, payload = compact.partition(",")
    lower = head.lower()
    if not sep or not lower.startswith("data:") or not lower.endswith(";base64"):
        raise GatewayError("invalid_request", "Inline data must be a base64 data: URL.")
    return head, payload


def inline_size(url: str, param: str) -> int:
    """Decoded size of a base64 ``data:`` URL, from its length (nothing decoded)."""
    try:
        _, payload = _split_data_url(url)
    except GatewayError as exc:
        raise GatewayError(exc.code, exc.message, param=param) from None
    if len(payload) % 4 or not _BASE64.fullmatch(payload):
        raise GatewayError("invalid_request", "Inline data is not valid base64.", param=param)
    return len(payload) // 4 * 3 - (len(payload) - len(payload.rstrip("=")))


def data_url_parts(url: str) -> tuple[str | None, str]:
    """(declared media type, base64 payload) of a planned inline ``data:`` URL."""
    head, payload = _split_data_url(url)
    return head[5:-7] or None, payload


@dataclass(frozen=True, slots=True)
class Checked:
    """One media part once its record is known: what the body needs for it."""

    ref: MediaRef
    record: RecordView | None  # None for inline data (staged after admission)


def check_records(
    plan: Plan, records: Mapping[str, RecordView], tenant: Tenant, param: str
) -> list[Checked]:
    """Refuse what the catalog records already show cannot be sent (module docstring)."""
    total = 0
    out: list[Checked] = []
    for ref in plan.media:
        if ref.source == "data":
            total += ref.inline_bytes
            out.append(Checked(ref, None))
            continue
        assert ref.evidence_id is not None
        record = records[ref.evidence_id]
        if not tenant.allows_modality(record.modality):
            raise GatewayError(
                "modality_not_allowed",
                f"The {record.modality} modality is not allowed.",
                param=param,
            )
        if record.modality != ref.kind:
            raise GatewayError(
                "modality_not_allowed",
                f"A {ref.kind} part refers to {record.modality} evidence.",
                param=param,
            )
        total += record.bytes
        out.append(Checked(ref, record))
    if total > tenant.limits.max_media_bytes:
        raise GatewayError(
            "media_limit_exceeded", "Media exceeds this tenant's byte limit.", param=param
        )
    return out


def evidence_ids(media: Sequence[MediaRef]) -> list[str]:
    """Distinct evidence IDs in first-seen order (one lookup and lease each)."""
    seen: dict[str, None] = {}
    for ref in media:
        if ref.evidence_id is not None:
            seen.setdefault(ref.evidence_id, None)
    return list(seen)
