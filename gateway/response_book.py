"""Whose Responses ids are whose (spec §14): the catalog table with an in-memory front.

An id becomes the tenant's before the caller can use it -- noted in memory
(:meth:`ResponseBook.note`, on the event loop, no I/O) right before the
stream's ``[DONE]`` or the non-streaming answer goes out -- and is written to
the catalog after the request ends (:meth:`ResponseBook.persist`, in a
thread, off the request's path). Lookups look in memory first, then in the
catalog; both honour ``responses.ttl_s``.

The terminal response object is kept with the id (unless the caller sent
``store: false``, or it is over :data:`MAX_KEPT_BYTES`): the gateway always
streams from the worker (spec §9), and the worker keeps no streamed response
for ``GET``, so ``GET /v1/responses/{id}`` is answered from this copy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import anyio.to_thread

from gateway.evidence.catalog import Catalog

#: the largest response object kept for GET
MAX_KEPT_BYTES = 1 << 20
Entry = tuple[str, bytes | None]


class ResponseBook:
    def __init__(
        self, catalog: Catalog, ttl_s: int, clock: Callable[[], float] = time.time
    ) -> None:
        self._catalog = catalog
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        #: (tenant, id) -> (alias, kept body, expiry) noted but not yet in the catalog
        self._pending: dict[tuple[str, str], tuple[str, bytes | None, float]] = {}

    def note(self, tenant: str, response_id: str, alias: str, body: bytes | None) -> None:
        if body is not None and len(body) > MAX_KEPT_BYTES:
            body = None
        with self._lock:
            self._pending[(tenant, response_id)] = (alias, body, self._clock() + self._ttl_s)

    def persist(self, tenant: str, response_id: str) -> None:
        """Write a noted id to the catalog (blocking: call from a thread)."""
        with self._lock:
            noted = self._pending.get((tenant, response_id))
        if noted is None:
            return
        self._catalog.record_response(tenant, response_id, noted[0], self._ttl_s, noted[1])
        with self._lock:
            self._pending.pop((tenant, response_id), None)

    async def entry(self, tenant: str, response_id: str) -> Entry | None:
        """(alias, kept response object) of the tenant's live id; None if not its own."""
        with self._lock:
            noted = self._pending.get((tenant, response_id))
        if noted is not None:
            return (noted[0], noted[1]) if noted[2] > self._clock() else None
        return await anyio.to_thread.run_sync(self._catalog.response_entry, tenant, response_id)

    async def alias(self, tenant: str, response_id: str) -> str | None:
        found = await self.entry(tenant, response_id)
        return None if found is None else found[0]

    async def forget(self, tenant: str, response_id: str) -> None:
        with self._lock:
            self._pending.pop((tenant, response_id), None)
        await anyio.to_thread.run_sync(self._catalog.forget_response, tenant, response_id)
