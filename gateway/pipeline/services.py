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
from typing import Literal, Protocol

from gateway.books.evidence.leases import Inline
from gateway.books.evidence.records import EvidenceRecord
from gateway.books.evidence.store import EvidenceStore
from gateway.books.protocols import KeptResponse
from gateway.books.receipts import Receipt
from gateway.books.state.calls import StateCalls
from gateway.config import StagingConfig
from gateway.core.signed_urls import LinkSigner
from gateway.observe.metrics import GatewayMetrics
from gateway.pipeline.cancel import Exchange
from gateway.pipeline.hostlookup import HostLookup
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
    """Where a request's receipt goes (``ReceiptWriter``): its write-ahead
    ``open`` line at admission (spec §24), the receipt at the end."""

    def open(self, receipt: Receipt) -> None: ...

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

    def reserve_now(
        self,
        tenant: str,
        limits: TenantLimits,
        tokens: int,
        *,
        concurrent: bool = True,
        wait_s: float = 0.0,
    ) -> Hold | None: ...

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


class KeptFile(Protocol):
    """A file the gateway keeps for a tenant (spec §22 "Files")."""

    @property
    def id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def bytes(self) -> int: ...

    @property
    def sha256(self) -> str: ...

    @property
    def mime_type(self) -> str: ...


class TenantFiles(Protocol):
    """The tenant file store as an agentic run uses it: bytes in, a record out
    (the type sniffed from the bytes)."""

    async def put(self, tenant: str, data: bytes, name: str) -> KeptFile: ...


class CallerApprovals(Protocol):
    """Approvals asked of the caller (spec §22): bound to the tenant and the
    request, decided through any replica."""

    async def open(self, tenant: str, request_id: str, approval_id: str) -> None: ...

    async def wait(self, approval_id: str, timeout_s: float) -> Literal["approve", "deny"] | None:
        """The caller's decision, or None when none came within ``timeout_s``."""
        ...

    async def close(self, approval_id: str) -> None: ...


class ImageFiles(Protocol):
    """Where ``url`` images are kept (spec §23): the tenant file store of §22 with
    one more freedom, the bytes in pieces (a 16 MiB image is written as it is
    decoded, never held whole beside its base64). ``books/interim_files.py``
    until the §22 store takes pieces too."""

    async def put(self, tenant: str, data: bytes | Iterable[bytes], name: str) -> KeptFile: ...


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
    #: in-flight requests, so that a drain can wait for them and end the rest
    inflight: set[Exchange] = field(default_factory=set)
    #: the state store's health: what needs it is refused while it is known down (§24)
    state: StateCalls = field(default_factory=lambda: StateCalls(None))
    #: where an agentic run keeps the files the worker made (spec §22)
    files: TenantFiles | None = None
    #: approvals asked of callers (spec §22)
    approvals: CallerApprovals | None = None
    #: a web fetch's addresses (``agents.hosts``, then DNS, bounded)
    hosts: HostLookup = field(default_factory=lambda: HostLookup({}))
    #: the key of the worker's session ids (gateway ``agents.session_key_env``)
    session_key: bytes = b""
    #: where ``url`` images are kept, and their signed links (spec §23)
    image_files: ImageFiles | None = None
    links: LinkSigner | None = None
