"""The state seam (spec §17): what the gateway keeps for callers, behind protocols.

Two backends implement every book: SQLite (the embedded default, one
replica; its blocking calls run in threads hidden inside) and PostgreSQL
(shared by every replica). The pipeline and the HTTP handlers see only these
protocols, so the next backend plugs in without an ``if backend == …``.

Every method may raise ``GatewayError("state_unavailable")`` (the store is
unreachable, slower than ``state.timeout_ms``, or refused the write) and
nothing else of the backend's own: each implementation translates its
driver's errors at the seam.

Blobs (the evidence files themselves) stay digest-named files on
``staging.dir`` (``gateway/books/evidence/store.py``), a volume every replica
mounts; object storage would be another implementation of that store.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    # Type-only: the evidence package's service imports these protocols.
    from gateway.books.evidence.records import EvidenceRecord
    from gateway.books.receipt_chain import Anchor


@dataclass(frozen=True, slots=True)
class KeptResponse:
    """One relayed Responses answer the gateway keeps for its tenant (spec §17)."""

    tenant: str
    #: the gateway's id (``resp_…``, spec §21): what callers name
    id: str
    #: the policy alias it was asked for (a follow-up must name the same route)
    alias: str
    #: unix seconds; the tenant's oldest kept responses are forgotten first
    created: float
    #: unix seconds: past it the row is invisible and deleted by the sweep
    expires: int
    #: the gateway id this response followed (``previous_response_id``), if any
    previous_id: str | None
    #: JSON array: this request's own input items, as the caller sent them (ids filled)
    input_items: bytes
    #: JSON array: the response's output items
    output_items: bytes
    #: the terminal response object for ``GET`` (None: not kept for GET)
    body: bytes | None
    #: the worker's own id of it (receipts only; the worker keeps nothing: store false)
    upstream_id: str | None = None

    @property
    def size(self) -> int:
        """Bytes it holds, as ``responses.max_bytes`` counts them."""
        return len(self.input_items) + len(self.output_items) + len(self.body or b"")

    def row(self) -> tuple[object, ...]:
        """Its values in :data:`KEPT_COLUMNS` order, then its size: one insert's
        parameters, whichever backend keeps it."""
        return (
            self.tenant,
            self.id,
            self.alias,
            self.created,
            self.expires,
            self.previous_id,
            self.input_items,
            self.output_items,
            self.body,
            self.upstream_id,
            self.size,
        )


#: the kept-response columns both backends' tables have, in :meth:`KeptResponse.row` order
KEPT_COLUMNS = (
    "tenant, id, alias, created, expires, previous_id, input_items, output_items, body, upstream_id"
)


class ResponseStore(Protocol):
    """Kept responses and their conversations, shared or local."""

    async def keep(self, rows: Sequence[KeptResponse], max_bytes: Mapping[str, int]) -> None:
        """Write ``rows`` in one transaction (a row of the same tenant and id
        replaces the old one), then forget each tenant's oldest kept responses
        until what it keeps is within ``max_bytes[tenant]``."""
        ...

    async def get(self, tenant: str, response_id: str, now: float) -> KeptResponse | None:
        """The tenant's live kept response; None when unknown, foreign or expired."""
        ...

    async def chain(
        self, tenant: str, response_id: str, now: float, max_links: int
    ) -> list[KeptResponse]:
        """The conversation ending at ``response_id``, oldest first, at most
        ``max_links`` of it; [] when ``response_id`` is not the tenant's live id.
        When the oldest returned has a ``previous_id``, an earlier link is gone
        (forgotten, expired or past ``max_links``)."""
        ...

    async def forget(self, tenant: str, response_id: str) -> bool:
        """Forget one kept response; whether it was there."""
        ...

    async def expire(self, now: float) -> int:
        """Delete every row past its expiry, bodies and all; how many."""
        ...

    async def close(self) -> None: ...


class EvidenceCatalog(Protocol):
    """Evidence records, quotas and leases (spec §5, §13, §17)."""

    async def add(
        self,
        *,
        tenant: str,
        sha256: str,
        media_type: str,
        ext: str,
        size: int,
        locator_sha256: str | None,
        quota: tuple[int, int] | None = None,
        not_before: int = 0,
    ) -> EvidenceRecord:
        """Insert a record; with ``quota`` = (max records, max bytes) refuse
        ``evidence_quota_exceeded`` in the same transaction if it would pass."""
        ...

    async def find_same(
        self,
        tenant: str,
        sha256: str,
        locator_sha256: str | None,
        not_before: int = 0,
        exclude: frozenset[str] = frozenset(),
    ) -> EvidenceRecord | None: ...

    async def usage(self, tenant: str, not_before: int = 0) -> tuple[int, int]: ...

    async def page(
        self, tenant: str, limit: int, after: str | None = None, not_before: int = 0
    ) -> tuple[list[EvidenceRecord], bool]: ...

    async def expire(self, tenant: str, not_before: int) -> list[EvidenceRecord]: ...

    async def get(
        self, tenant: str, evidence_id: str, not_before: int = 0
    ) -> EvidenceRecord | None: ...

    async def delete(self, tenant: str, evidence_id: str) -> EvidenceRecord | None: ...

    async def take_leases(
        self, request_id: str, records: Sequence[EvidenceRecord], not_before: int, ttl_s: float
    ) -> None:
        """Lease every record for ``request_id`` until ``ttl_s`` from now, or
        none (``evidence_not_found`` if any is gone)."""
        ...

    async def release_leases(self, request_id: str) -> list[tuple[str, str]]:
        """Drop a request's leases; the distinct (sha256, ext) they held."""
        ...

    async def lease_records(
        self,
        request_id: str,
        tenant: str,
        evidence_ids: Sequence[str],
        not_before: int,
        ttl_s: float,
    ) -> dict[str, EvidenceRecord]:
        """Look up and lease the tenant's live records in one call (a request's
        whole lookup: one round trip); ``evidence_not_found`` and nothing leased
        if any is gone."""
        ...

    async def drop_leases(self, request_id: str) -> list[tuple[str, str]]:
        """Drop a request's leases in one call; the (sha256, ext) of those that
        nothing names any more (the files to remove, checked again under the
        store's lock)."""
        ...

    async def is_referenced(self, sha256: str) -> bool:
        """Whether a record or an unexpired lease names the digest."""
        ...

    async def referenced(self, sha256s: Sequence[str]) -> set[str]:
        """Which of ``sha256s`` a record or an unexpired lease names: one call
        for a sweep's batch of stored files."""
        ...

    async def active_leases(self) -> int: ...

    async def sweep_leases(self) -> list[tuple[str, str]]:
        """Drop expired leases (a crashed replica's); the (sha256, ext) they held."""
        ...

    async def recover_leases(self) -> int:
        """At this replica's start: drop the leases a crashed run may have left
        (one replica: all of them; shared: the expired ones); how many."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ReleaseOverride:
    """An operator's or a gate's word on a release, standing until ``clear``
    (spec §18): ``override`` sets the percent, ``rolled_back`` makes it 0."""

    name: str
    state: str  # "override" | "rolled_back"
    percent: float
    #: unix seconds of the decision
    updated: float


@dataclass(frozen=True, slots=True)
class ArmCounts:
    """One arm's gate window as one replica last published it."""

    requests: int
    failures: int
    ttft_p95_ms: float | None


#: the states a decision may have (the config's own percent is no decision)
DECISIONS = frozenset({"override", "rolled_back"})
#: a replica that published nothing for this long has stopped: its rows go
FORGET_AFTER_S = 86_400.0
#: release -> replica -> arm -> counts
Figures = dict[str, dict[str, dict[str, ArmCounts]]]


def check_decision(state: str, percent: float) -> None:
    """A decision the stores accept; anything else is the caller's bug, not the store's."""
    if state not in DECISIONS:
        raise ValueError(f"a release decision is one of {sorted(DECISIONS)}, not {state!r}")
    if not (math.isfinite(percent) and 0 <= percent <= 100):
        raise ValueError("a release decision's percent is within 0-100")


def figure_rows(
    replica: str, figures: Mapping[str, Mapping[str, ArmCounts]], now: float
) -> list[tuple[str, str, str, int, int, float | None, float]]:
    """One replica's published figures as rows (name, replica, arm, counts…, updated)."""
    return [
        (name, replica, arm, c.requests, c.failures, c.ttft_p95_ms, now)
        for name, arms in figures.items()
        for arm, c in arms.items()
    ]


class ReleaseStore(Protocol):
    """Release decisions every replica follows, and the arms' figures each
    replica publishes for ``release status`` (spec §18)."""

    async def overrides(self) -> dict[str, ReleaseOverride]:
        """Every standing decision, by release name."""
        ...

    async def decide(self, name: str, state: str, percent: float, now: float) -> None:
        """Set (replace) the release's standing decision."""
        ...

    async def clear(self, name: str) -> bool:
        """Back to the config; whether a decision stood."""
        ...

    async def publish(
        self, replica: str, figures: Mapping[str, Mapping[str, ArmCounts]], now: float
    ) -> None:
        """This replica's window figures, by release then arm (replacing its last)."""
        ...

    async def figures(self, since: float) -> dict[str, dict[str, dict[str, ArmCounts]]]:
        """Release -> replica -> arm -> counts, of the replicas that published since ``since``."""
        ...


#: an anchor of a replica silent this long is forgotten (replica ids change with
#: restarts; its receipts are verified against it for that long after it stopped)
ANCHOR_FORGET_AFTER_S = 30 * 86_400.0


class AnchorStore(Protocol):
    """Each replica's receipt-chain head, recorded every ``audit.anchor_interval_s``
    (spec §24): what ``receipts verify --anchors`` holds the audit files against."""

    async def anchor(self, replica: str, seq: int, sha256: str, now: float) -> None:
        """Record the replica's head on disk (replacing its last), and forget the
        anchors of replicas silent for :data:`ANCHOR_FORGET_AFTER_S`."""
        ...

    async def anchors(self) -> dict[str, Anchor]:
        """Every replica's last anchor, by replica."""
        ...
