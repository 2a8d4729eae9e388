"""What one request's steps use of the long-lived objects, and nothing more.

The composition root (``gateway/http/runtime.py``) builds one
:class:`Services` at startup from the objects it owns; every step reaches
the route table, the limits, the books and the metrics through it, never
through the runtime (which also holds reload, drain and shutdown). Each
book is named by the small protocol the pipeline needs of it, so a unit test
passes fakes of its own without a cast.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gateway.books.evidence.leases import Inline
from gateway.books.evidence.records import EvidenceRecord
from gateway.books.evidence.store import EvidenceStore
from gateway.books.protocols import KeptResponse
from gateway.books.receipts import Receipt
from gateway.config import StagingConfig
from gateway.core.signed_urls import LinkSigner
from gateway.observe.metrics import GatewayMetrics
from gateway.pipeline.cancel import Exchange
from gateway.ratelimit.base import Hold
from gateway.ratelimit.core import TenantLimits
from gateway.upstream.table import RouteReadiness, RouteTable


class RequestEvidence(Protocol):
    """The evidence one request holds (``RequestMedia``): leased before the
    permit, inline data staged after it, given back in the ``finally``."""

    async def lease(self, evidence_ids: Sequence[str]) -> list[EvidenceRecord]: ...

    async def stage(self, parts: Sequence[Inline], records: dict[int, EvidenceRecord]) -> None: ...

    async def settle(self) -> None: ...

    async def close(self) -> None: ...


class ReceiptSink(Protocol):
    """Where a finished request's receipt goes (``ReceiptWriter``)."""

    def write(self, receipt: Receipt) -> None: ...


class Limits(Protocol):
    """The tenant limits as one request uses them (a ``LimitsStore``)."""

    async def reserve(
        self,
        tenant: str,
        limits: TenantLimits,
        tokens: int,
        *,
        concurrent: bool = True,
        wait_s: float = 0.0,
    ) -> Hold: ...

    def settle(self, hold: Hold, used_tokens: int) -> None: ...


class Conversations(Protocol):
    """The kept Responses answers as one request uses them (``ResponseBook``)."""

    def row(
        self,
        *,
        tenant: str,
        response_id: str,
        alias: str,
        previous_id: str | None,
        input_items: bytes,
        output_items: bytes,
        body: bytes | None,
        upstream_id: str | None,
    ) -> KeptResponse: ...

    async def keep(self, row: KeptResponse, max_bytes: int) -> None: ...

    async def chain(self, tenant: str, response_id: str, max_links: int) -> list[KeptResponse]: ...


class StoredFile(Protocol):
    @property
    def id(self) -> str: ...


class TenantFiles(Protocol):
    """Where outputs a caller gets as links are kept, per tenant (spec §22 files,
    §23 ``url`` images): ``books/interim_files.py`` until the agents' file
    store, which serves the same ids, takes its place."""

    async def put(
        self, tenant: str, data: bytes | Iterable[bytes], name: str, media_type: str
    ) -> StoredFile:
        """Keep ``data`` (its bytes, or their pieces in order: written as they come)."""
        ...


@dataclass(eq=False)
class Services:
    #: route -> worker (transport, admission, identity) and the releases
    table: RouteTable
    readiness: RouteReadiness
    limits: Limits
    responses: Conversations
    receipts: ReceiptSink
    metrics: GatewayMetrics
    staging: StagingConfig
    #: the staged evidence files the forwarded body's media are read from
    blobs: EvidenceStore
    #: the tenant files ``url`` images are kept as, and their signed links (§23)
    files: TenantFiles
    links: LinkSigner
    #: in-flight requests, so that a drain can wait for them and end the rest
    inflight: set[Exchange] = field(default_factory=set)
