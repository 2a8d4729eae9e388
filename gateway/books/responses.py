"""The kept Responses answers and their conversations (spec §14, §17), over any
:class:`~gateway.books.protocols.ResponseStore`.

Theory of operation:

- A relayed answer is kept (:meth:`ResponseBook.keep`) before the caller can
  use its id: before the stream's ``[DONE]``, before the non-streaming
  answer. ``keep`` returns only once the row is committed, so a follow-up
  through any replica finds it (spec §17: "the answer is sent after the
  commit").
- Group commit: the first keep of a quiet moment starts a commit task, which
  waits :data:`LINGER_S` for others and then writes every row noted so far
  in one ``store.keep`` (one transaction, one fsync, for many streams). Rows
  noted while a commit runs go into the next one, at once. Every waiter is
  released when its batch committed, or gets ``state_unavailable`` when it
  failed.
- Every call is bounded by ``state.timeout_ms`` (``timeout_s``): past it the
  caller gets ``state_unavailable``. A keep that timed out may still commit
  afterwards; its caller was told to try again, and a second copy is only a
  second kept response.
- Expiry: a row past ``responses.ttl_s`` is invisible to every lookup (the
  store compares ``expires``) and is deleted, body and all, by the sweep
  :meth:`start` runs every ``sweep_s``.
- The body kept for ``GET`` is at most :data:`MAX_KEPT_BYTES`; a larger one is
  kept without it (``GET`` answers 404 ``response_not_found``) while its
  items still carry the conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from gateway.books.protocols import KeptResponse, ResponseStore
from gateway.core.errors import GatewayError

T = TypeVar("T")
log = logging.getLogger("gateway.responses")

#: the largest response object kept for GET
MAX_KEPT_BYTES = 1 << 20
#: how long a commit waits after the first keep for others to share its write
LINGER_S = 0.002


def _retrieved(future: asyncio.Future[None]) -> None:
    # Every waiter may have given up (timed out, disconnected): the failure is
    # still read, so asyncio does not report it as never retrieved.
    if not future.cancelled():
        future.exception()


class ResponseBook:
    def __init__(
        self,
        store: ResponseStore,
        *,
        ttl_s: int,
        timeout_s: float,
        sweep_s: float = 60.0,
        linger_s: float = LINGER_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._sweep_s = sweep_s
        self._linger_s = linger_s
        self._clock = clock
        #: the batch being gathered: (tenant, id) -> row, a later keep of one id wins
        self._rows: dict[tuple[str, str], KeptResponse] = {}
        self._bounds: dict[str, int] = {}
        self._batch: asyncio.Future[None] | None = None
        self._committer: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False
        #: commits written (batches, not rows)
        self.commits = 0
        #: the last commit or sweep failed (logged once per episode)
        self._failing = False

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep(), name="response-expiry")

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
    ) -> KeptResponse:
        """A row to keep, stamped now and expiring ``responses.ttl_s`` from now."""
        now = self._clock()
        if body is not None and len(body) > MAX_KEPT_BYTES:
            body = None
        return KeptResponse(
            tenant=tenant,
            id=response_id,
            alias=alias,
            created=now,
            expires=int(now) + self._ttl_s,
            previous_id=previous_id,
            input_items=input_items,
            output_items=output_items,
            body=body,
            upstream_id=upstream_id,
        )

    async def keep(self, row: KeptResponse, max_bytes: int) -> None:
        """Keep ``row`` within its tenant's ``max_bytes``; returns once committed."""
        if self._closed:
            raise GatewayError("state_unavailable")
        if self._batch is None:
            self._batch = asyncio.get_running_loop().create_future()
            self._batch.add_done_callback(_retrieved)
        batch = self._batch
        self._rows[(row.tenant, row.id)] = row
        self._bounds[row.tenant] = max_bytes
        if self._committer is None:
            self._committer = asyncio.create_task(self._commit(), name="response-commit")
        try:
            async with asyncio.timeout(self._timeout_s):
                # Shielded: one waiter giving up must not cancel everyone's batch.
                await asyncio.shield(batch)
        except TimeoutError:
            raise GatewayError("state_unavailable") from None

    async def _commit(self) -> None:
        try:
            await asyncio.sleep(self._linger_s)
            while self._batch is not None:
                rows, bounds, batch = list(self._rows.values()), self._bounds, self._batch
                self._rows, self._bounds, self._batch = {}, {}, None
                try:
                    async with asyncio.timeout(self._timeout_s):
                        await self.store.keep(rows, bounds)
                except asyncio.CancelledError:
                    batch.set_exception(GatewayError("state_unavailable"))
                    raise
                except Exception as exc:
                    self._failed(f"keeping {len(rows)} responses", exc)
                    batch.set_exception(GatewayError("state_unavailable"))
                else:
                    self._recovered()
                    self.commits += 1
                    batch.set_result(None)
        finally:
            self._committer = None

    async def get(self, tenant: str, response_id: str) -> KeptResponse | None:
        """The tenant's live kept response; None when unknown, foreign or expired."""
        return await self._bounded(self.store.get(tenant, response_id, self._clock()))

    async def chain(self, tenant: str, response_id: str, max_links: int) -> list[KeptResponse]:
        """The conversation ending at ``response_id``, oldest first (the store's rules)."""
        return await self._bounded(self.store.chain(tenant, response_id, self._clock(), max_links))

    async def forget(self, tenant: str, response_id: str) -> bool:
        return await self._bounded(self.store.forget(tenant, response_id))

    async def expire(self) -> int:
        """Delete every kept response past its expiry; how many."""
        return await self._bounded(self.store.expire(self._clock()))

    async def _bounded(self, work: Coroutine[Any, Any, T]) -> T:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await work
        except TimeoutError:
            raise GatewayError("state_unavailable") from None

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_s)
            try:
                forgotten = await self.expire()
            except GatewayError as exc:
                self._failed("the expiry sweep", exc)
                continue
            if forgotten:
                log.info("responses: %d expired responses deleted", forgotten)

    def _failed(self, what: str, exc: Exception) -> None:
        if not self._failing:
            # The class only: a driver's text may hold a path or a DSN.
            reason = exc.code if isinstance(exc, GatewayError) else type(exc).__name__
            log.error("responses: %s failed (%s)", what, reason)
        self._failing = True

    def _recovered(self) -> None:
        if self._failing:
            log.info("responses: the store accepts writes again")
        self._failing = False

    async def aclose(self, timeout_s: float) -> int:
        """Stop the sweep and let a running commit end within ``timeout_s``; the
        number of rows left unwritten. The store is its owner's to close."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        committer = self._committer
        if committer is not None:
            _, pending = await asyncio.wait([committer], timeout=timeout_s)
            for task in pending:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        unwritten = len(self._rows)
        if self._batch is not None:
            self._batch.set_exception(GatewayError("state_unavailable"))
            self._rows, self._bounds, self._batch = {}, {}, None
        return unwritten
