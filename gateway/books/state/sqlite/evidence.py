"""The SQLite backend of the evidence catalog (one replica): the blocking
:class:`~gateway.books.state.sqlite.catalog.Catalog` behind the async protocol,
each call in a worker thread.

SQLite calls are not bounded by ``state.timeout_ms``: a thread cannot be
stopped, and a write abandoned mid-way could still commit after its caller
was told it failed ("changes nothing" would not hold). ``busy_timeout``
bounds the waits that can happen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TypeVar

import anyio.to_thread

from gateway.books.evidence.records import EvidenceRecord
from gateway.books.state.calls import StateCalls
from gateway.books.state.sqlite.catalog import Catalog

T = TypeVar("T")


class SqliteCatalog:
    """:class:`~gateway.books.protocols.EvidenceCatalog` on one SQLite file."""

    def __init__(self, catalog: Catalog, calls: StateCalls | None = None) -> None:
        self.sync = catalog
        self._calls = calls if calls is not None else StateCalls(None)

    async def _run(self, op: str, work: Callable[[], T]) -> T:
        return await self._calls.run(op, anyio.to_thread.run_sync(work))

    async def ping(self) -> None:
        """A trivial read (the degraded store's probe, ``StateCalls.watch``)."""
        await anyio.to_thread.run_sync(self.sync.usage, "", 0)

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
        return await self._run(
            "add",
            partial(
                self.sync.add,
                tenant=tenant,
                sha256=sha256,
                media_type=media_type,
                ext=ext,
                size=size,
                locator_sha256=locator_sha256,
                quota=quota,
                not_before=not_before,
            ),
        )

    async def find_same(
        self,
        tenant: str,
        sha256: str,
        locator_sha256: str | None,
        not_before: int = 0,
        exclude: frozenset[str] = frozenset(),
    ) -> EvidenceRecord | None:
        return await self._run(
            "find_same",
            partial(self.sync.find_same, tenant, sha256, locator_sha256, not_before, exclude),
        )

    async def usage(self, tenant: str, not_before: int = 0) -> tuple[int, int]:
        return await self._run("usage", partial(self.sync.usage, tenant, not_before))

    async def page(
        self, tenant: str, limit: int, after: str | None = None, not_before: int = 0
    ) -> tuple[list[EvidenceRecord], bool]:
        return await self._run("page", partial(self.sync.page, tenant, limit, after, not_before))

    async def expire(self, tenant: str, not_before: int) -> list[EvidenceRecord]:
        return await self._run("expire", partial(self.sync.expire, tenant, not_before))

    async def get(
        self, tenant: str, evidence_id: str, not_before: int = 0
    ) -> EvidenceRecord | None:
        return await self._run("get", partial(self.sync.get, tenant, evidence_id, not_before))

    async def delete(self, tenant: str, evidence_id: str) -> EvidenceRecord | None:
        return await self._run("delete", partial(self.sync.delete, tenant, evidence_id))

    async def take_leases(
        self, request_id: str, records: Sequence[EvidenceRecord], not_before: int, ttl_s: float
    ) -> None:
        await self._run(
            "take_leases",
            partial(self.sync.take_leases, request_id, records, not_before, ttl_s),
        )

    async def release_leases(self, request_id: str) -> list[tuple[str, str]]:
        return await self._run("release_leases", partial(self.sync.release_leases, request_id))

    async def lease_records(
        self,
        request_id: str,
        tenant: str,
        evidence_ids: Sequence[str],
        not_before: int,
        ttl_s: float,
    ) -> dict[str, EvidenceRecord]:
        return await self._run(
            "lease_records",
            partial(self.sync.lease_records, request_id, tenant, evidence_ids, not_before, ttl_s),
        )

    async def drop_leases(self, request_id: str) -> list[tuple[str, str]]:
        return await self._run("drop_leases", partial(self.sync.drop_leases, request_id))

    async def is_referenced(self, sha256: str) -> bool:
        return await self._run("is_referenced", partial(self.sync.is_referenced, sha256))

    async def referenced(self, sha256s: Sequence[str]) -> set[str]:
        return await self._run("referenced", partial(self.sync.referenced, sha256s))

    async def active_leases(self) -> int:
        return await self._run("active_leases", self.sync.active_leases)

    async def sweep_leases(self) -> list[tuple[str, str]]:
        return await self._run("sweep_leases", self.sync.sweep_leases)

    async def recover_leases(self) -> int:
        """Drop every lease: one replica per SQLite file, so at its start every
        lease is a crashed run's."""
        return await self._run("recover_leases", self.sync.clear_stale_leases)

    async def close(self) -> None:
        self.sync.close()
