"""Whose Responses ids are whose (spec §14): the catalog table with an in-memory front.

An id becomes the tenant's before the caller can use it -- noted in memory
(:meth:`ResponseBook.note`, on the event loop, no I/O) right before the
stream's ``[DONE]`` or the non-streaming answer goes out. A flusher task
writes what was noted to the catalog in batches, one transaction per batch
(one fsync for many streams: a write per stream cost a Responses stream a
tenth of its CPU), at most :data:`LINGER_S` after the first note. Lookups
look in memory first, then in the catalog; both honour ``responses.ttl_s``.
A write that fails (a full staging volume) keeps the batch in memory and is
retried with backoff; the kept bodies waiting are bounded by
:data:`MAX_PENDING_BODY_BYTES` (past it, new ids are kept without a body:
``GET`` answers ``response_not_found`` for them while a previous_response_id
still works).

The terminal response object is kept with the id (unless the caller sent
``store: false``, or it is over :data:`MAX_KEPT_BYTES`): the gateway always
streams from the worker (spec §9), and the worker keeps no streamed response
for ``GET``, so ``GET /v1/responses/{id}`` is answered from this copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

import anyio.to_thread

from gateway.apis.responses import RESPONSE_ID
from gateway.books.evidence.catalog import Catalog, ResponseRow
from gateway.core.errors import GatewayError

log = logging.getLogger("gateway.responses")

#: the largest response object kept for GET
MAX_KEPT_BYTES = 1 << 20
#: kept bodies waiting for the catalog, at most (a failing volume must not grow memory)
MAX_PENDING_BODY_BYTES = 64 << 20
#: ids waiting for the catalog, at most; past it a new id is not noted (logged,
#: and the caller's later previous_response_id or GET finds nothing)
MAX_PENDING_IDS = 100_000
#: how long the flusher waits after a note for others to share its write
LINGER_S = 0.02
#: retry delays while the catalog write fails: doubling from the first, capped at the last
_BACKOFF_S = (0.1, 5.0)
#: (alias, kept response object, the worker's id of it)
Entry = tuple[str, bytes | None, str | None]
_Key = tuple[str, str]


class ResponseBook:
    def __init__(
        self, catalog: Catalog, ttl_s: int, clock: Callable[[], float] = time.time
    ) -> None:
        self._catalog = catalog
        self._ttl_s = ttl_s
        self._clock = clock
        # Lookups read the front from request tasks while a batch is built; the
        # catalog write itself runs in a thread, so the front has its own lock.
        self._lock = threading.Lock()
        #: (tenant, id) -> (alias, kept body, expiry) noted but not yet in the catalog
        self._pending: dict[_Key, tuple[str, bytes | None, float, str | None]] = {}
        self._pending_bytes = 0
        #: past MAX_PENDING_IDS (logged once per episode)
        self._full = False
        #: serializes catalog writes of the flusher with forgets (no forgotten id rewritten)
        self._writing = asyncio.Lock()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._flusher(), name="response-book")

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def note(
        self,
        tenant: str,
        response_id: str,
        alias: str,
        body: bytes | None,
        upstream_id: str | None = None,
    ) -> None:
        if not RESPONSE_ID.fullmatch(response_id):
            # An id no caller could name (the worker's, unchecked otherwise).
            return
        with self._lock:
            if len(self._pending) >= MAX_PENDING_IDS and (tenant, response_id) not in self._pending:
                self._prune()
                if len(self._pending) >= MAX_PENDING_IDS:
                    if not self._full:
                        log.error(
                            "responses: %d ids wait for the catalog; new ids are not kept",
                            len(self._pending),
                        )
                    self._full = True
                    return
            self._full = False
            if body is not None and (
                len(body) > MAX_KEPT_BYTES
                or self._pending_bytes + len(body) > MAX_PENDING_BODY_BYTES
            ):
                body = None
            self._drop((tenant, response_id))
            expires = self._clock() + self._ttl_s
            self._pending[(tenant, response_id)] = (alias, body, expires, upstream_id)
            if body is not None:
                self._pending_bytes += len(body)
        self._wakeup.set()

    def _prune(self) -> None:
        """Forget pending ids past their expiry (under the lock)."""
        now = self._clock()
        for key in [k for k, v in self._pending.items() if v[2] <= now]:
            self._drop(key)

    def _drop(self, key: _Key) -> None:
        """Forget a pending id, if noted, and its body's bytes (under the lock)."""
        noted = self._pending.pop(key, None)
        if noted is not None and noted[1] is not None:
            self._pending_bytes -= len(noted[1])

    async def flush(self) -> int:
        """Write everything noted so far; the number of ids written."""
        async with self._writing:
            with self._lock:
                batch = dict(self._pending)
            if not batch:
                return 0
            rows = [
                ResponseRow(tenant, rid, alias, int(expires), body, upstream)
                for (tenant, rid), (alias, body, expires, upstream) in batch.items()
            ]
            await anyio.to_thread.run_sync(self._catalog.record_responses, rows)
            with self._lock:
                for key, noted in batch.items():
                    # A note of the same id meanwhile stays for the next batch.
                    if self._pending.get(key) is noted:
                        self._drop(key)
            return len(rows)

    async def _flusher(self) -> None:
        delay, failing = _BACKOFF_S[0], False
        while True:
            await self._wakeup.wait()
            await asyncio.sleep(LINGER_S)
            self._wakeup.clear()
            try:
                await self.flush()
            except Exception as exc:  # the flusher must outlive any failure
                if not failing:
                    reason = exc.code if isinstance(exc, GatewayError) else type(exc).__name__
                    log.error("responses: catalog write failed (%s), retrying", reason)
                failing = True
                self._wakeup.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_S[1])
                continue
            if failing:
                log.info("responses: catalog writes recovered")
            delay, failing = _BACKOFF_S[0], False

    async def aclose(self, timeout_s: float) -> int:
        """Stop the flusher and write what is left within ``timeout_s``; the
        number of ids left unwritten."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            async with asyncio.timeout(timeout_s):
                await self.flush()
        return self.pending

    async def entry(self, tenant: str, response_id: str) -> Entry | None:
        """(alias, kept response object, the worker's id) of the tenant's live id;
        None if not its own."""
        with self._lock:
            noted = self._pending.get((tenant, response_id))
        if noted is not None:
            return (noted[0], noted[1], noted[3]) if noted[2] > self._clock() else None
        return await anyio.to_thread.run_sync(self._catalog.response_entry, tenant, response_id)

    async def forget(self, tenant: str, response_id: str) -> None:
        async with self._writing:
            # The catalog first: a delete that fails leaves the id as it was.
            await anyio.to_thread.run_sync(self._catalog.forget_response, tenant, response_id)
            with self._lock:
                self._drop((tenant, response_id))
