"""A request's media before and after the permit (spec §13): records looked up
and leased before admission (no file read), inline data staged after it, and
the forwarded body laid out with a slot per part (its exact size known before
any media byte is read)."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.apis.base import Plan
from gateway.apis.media import check_records, data_url_parts, evidence_ids
from gateway.books.evidence.leases import Inline
from gateway.books.evidence.records import EvidenceRecord
from gateway.books.receipts import Receipt
from gateway.config import StagingConfig
from gateway.core.body import Layout, MediaSlot, layout
from gateway.pipeline.call import Call, Routed


async def lease_records(call: Call, routed: Routed, plan: Plan, param: str) -> None:
    """Look up and lease the plan's evidence (catalog only; no file is read);
    a refusal names ``param``, the descriptor's media field."""
    ids = evidence_ids(plan.media)
    records: dict[str, EvidenceRecord] = {}
    if ids:
        for record in await call.media.lease(ids):
            records[record.id] = record
    for item in check_records(plan, records, call.tenant, param):
        if item.record is not None:
            routed.records[item.ref.slot] = records[item.record.id]


async def stage_inline(call: Call, routed: Routed, plan: Plan) -> None:
    """Decode and stage the request's inline data (only after the permit)."""
    inline: list[Inline] = []
    for ref in plan.media:
        if ref.source == "data":
            assert ref.data_url is not None
            mime, payload = data_url_parts(ref.data_url)
            inline.append((ref.slot, mime, payload, ref.kind))
    await call.media.stage(inline, routed.records)


def body_layout(
    forward: dict[str, Any],
    plan: Plan,
    records: dict[int, EvidenceRecord],
    staging: StagingConfig,
) -> Layout:
    """The forwarded body with a slot per media part; inline data not staged
    yet stands in at its declared type and decoded size."""
    return layout(forward, plan.nonce, _fills(plan, records, staging), orjson.dumps)


def refill(
    body: Layout, plan: Plan, records: dict[int, EvidenceRecord], staging: StagingConfig
) -> Layout:
    """``body`` with its slots filled from ``records`` (inline data once staged)."""
    return body.refill(_fills(plan, records, staging))


def _fills(
    plan: Plan, records: dict[int, EvidenceRecord], staging: StagingConfig
) -> list[bytes | MediaSlot]:
    fills: list[bytes | MediaSlot] = []
    for ref in plan.media:
        record = records.get(ref.slot)
        if record is None:
            # Inline data not staged yet: its declared type stands in for the size check.
            assert ref.data_url is not None
            mime = data_url_parts(ref.data_url)[0] or "application/octet-stream"
            fills.append(MediaSlot(mime, ref.inline_bytes, "0" * 64, "bin"))
        elif staging.worker_media == "data_url":
            fills.append(MediaSlot(record.media_type, record.bytes, record.sha256, record.ext))
        else:
            url = f"{staging.worker_url_prefix}/{record.sha256}.{record.ext}"
            fills.append(orjson.dumps(url))
    return fills


def record_artifacts(
    receipt: Receipt, plan: Plan | None, records: dict[int, EvidenceRecord]
) -> None:
    """Artifacts in request order, a repeated ID once per part (spec §10)."""
    if plan is None:
        return
    named = [records[ref.slot] for ref in plan.media if ref.slot in records]
    receipt.artifacts = [
        {"evidence_id": r.id, "sha256": r.sha256, "media_type": r.media_type} for r in named
    ]
    receipt.locator_sha256 = [r.locator_sha256 for r in named]
