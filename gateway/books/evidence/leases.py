"""The evidence one inference request holds: its leases and its staged inline data.

Theory of operation:

- Named evidence is leased before admission (catalog only, no file read);
  inline ``data:`` parts are staged after the permit and leased the same way,
  so an expiry sweep cannot take their files while the request runs.
- Each step runs as its own task, shielded from the request's cancellation:
  a disconnect or a drain must not leave a lease or a staged file that
  nobody gives back. :meth:`RequestMedia.settle` waits for every such task;
  :meth:`close` then gives the leases back and forgets the inline records.
- Callers choose ``x-request-id`` (and may repeat it): the lease key is the
  gateway's own, made only when the request has media (most have none).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from gateway.books.evidence.records import EvidenceRecord
from gateway.books.evidence.service import EvidenceService
from gateway.config.policy import Tenant
from gateway.core.errors import GatewayError

T = TypeVar("T")

#: one inline part to stage: its slot, declared type, base64 payload, part kind
Inline = tuple[int, str | None, str, str]


class RequestMedia:
    def __init__(self, evidence: EvidenceService, tenant: Tenant) -> None:
        self._evidence = evidence
        self._tenant = tenant
        self._key = ""
        self._leased = False
        #: evidence staged from this request's inline data: forgotten when it ends
        self.staged: list[str] = []
        self._tasks: list[asyncio.Task[Any]] = []

    @property
    def key(self) -> str:
        if not self._key:
            self._key = "lease_" + os.urandom(16).hex()
        return self._key

    async def lease(self, evidence_ids: Sequence[str]) -> list[EvidenceRecord]:
        """Lease every named record for this request, or none (404/400 as the service says)."""
        key, tenant, evidence = self.key, self._tenant, self._evidence

        async def lease() -> list[EvidenceRecord]:
            taken = await evidence.lease(key, tenant, evidence_ids)
            self._leased = True
            return taken

        return await self._shielded(lease())

    async def stage(self, parts: Sequence[Inline], records: dict[int, EvidenceRecord]) -> None:
        """Decode, check and stage the inline parts (after the permit) into
        ``records`` (slot -> record), filled as each is staged: a request
        cancelled meanwhile still names what it staged in its receipt."""
        key, tenant, evidence = self.key, self._tenant, self._evidence

        async def stage() -> None:
            for slot, mime, payload, kind in parts:
                record = await evidence.upload_inline(tenant, payload, mime, kind)
                self.staged.append(record.id)
                records[slot] = record
            await evidence.lease(key, tenant, self.staged)
            self._leased = True

        await self._shielded(stage())

    async def settle(self) -> None:
        """Wait for a task still taking leases or staging (even after a cancel)."""
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending)

    async def close(self) -> None:
        """Give the leases back and forget the inline records."""
        evidence = self._evidence
        if self._leased:
            await evidence.release(self._key)
        for evidence_id in self.staged:
            # Inline data was staged only for this request; its file goes with the record.
            with contextlib.suppress(GatewayError):
                await evidence.delete(self._tenant, evidence_id)

    async def _shielded(self, work: Coroutine[Any, Any, T]) -> T:
        task = asyncio.ensure_future(work)
        self._tasks.append(task)
        # Shielded: a cancel (disconnect, drain) must not leave the task's
        # leases and staged files unowned; settle() waits for it.
        return await asyncio.shield(task)
