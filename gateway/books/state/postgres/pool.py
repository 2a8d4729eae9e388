"""The PostgreSQL connection pool every replica shares its state through (spec §17).

- asyncpg, chosen over psycopg 3 by ``bench/bench_state_driver.py`` (the
  per-request path: a record lookup and two leases): see ``bench/README.md``.
- The pool connects lazily (``min_size=0``): a replica starts and serves
  requests that need no state while the store is down, and the schema is
  migrated on the first connection that succeeds (``migrate``).
- A call cut short (``state.timeout_ms``, a cancelled request) leaves its
  connection mid-protocol, so it is terminated rather than returned: a
  stopped server must not make the next caller wait on a reset. A
  connection the server dropped (a restart, at any point of a transaction,
  COMMIT included) is one asyncpg already gave back to the pool when it saw
  the socket close: terminating it again is nothing to do, never an error
  (it was a 500 once, issue 36).
- Every driver error becomes ``state_unavailable`` here, its class name kept
  as the cause for the operator log; the DSN is never in a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import asyncpg

from gateway.books.state.calls import StateCalls
from gateway.books.state.postgres.schema import migrate
from gateway.core.errors import GatewayError

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    #: a pooled connection (generic in the stubs only)
    Conn = PoolConnectionProxy[asyncpg.Record]

log = logging.getLogger("gateway.state")

#: errors of the store itself (any other exception is a bug and propagates as one)
_STORE_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, ConnectionError)


def dsn_from(env: Mapping[str, str], name: str) -> str:
    dsn = env.get(name, "")
    if not dsn.startswith(("postgresql://", "postgres://")):
        # Names the variable, never its value (it holds a password).
        raise GatewayError(
            "state_unavailable", f"state.dsn_env names {name}, which holds no postgresql:// DSN."
        )
    return dsn


def _discard(conn: Conn) -> None:
    """Terminate a connection left mid-protocol. One whose socket closed under
    it is already back in the pool, detached from ``conn``: asyncpg refuses
    every call on it (``InterfaceError``), and there is nothing to terminate."""
    with contextlib.suppress(asyncpg.InterfaceError):
        conn.terminate()


class PgPool:
    def __init__(self, dsn: str, timeout_s: float, max_size: int = 16) -> None:
        self._dsn = dsn
        self._timeout_s = timeout_s
        self._max_size = max_size
        self._pool: asyncpg.Pool[asyncpg.Record] | None = None
        self._migrated = False
        self._opening = asyncio.Lock()

    async def _ready_pool(self) -> asyncpg.Pool[asyncpg.Record]:
        if self._pool is not None and self._migrated:
            return self._pool
        async with self._opening:
            if self._pool is None:
                self._pool = asyncpg.create_pool(
                    self._dsn,
                    min_size=0,
                    max_size=self._max_size,
                    timeout=self._timeout_s,
                    # Prepared statements per connection: the hot path's few
                    # statements are parsed once per connection, not per call.
                    statement_cache_size=256,
                    max_inactive_connection_lifetime=60,
                )
                await self._pool
            if not self._migrated:
                async with self._pool.acquire() as conn:
                    await migrate(conn)
                self._migrated = True
        return self._pool

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        """A pooled connection; store errors become ``state_unavailable``."""
        try:
            pool = await self._ready_pool()
            conn = await pool.acquire()
        except _STORE_ERRORS as exc:
            raise GatewayError("state_unavailable") from exc
        try:
            yield conn
        except (asyncio.CancelledError, TimeoutError):
            _discard(conn)
            raise
        except _STORE_ERRORS as exc:
            _discard(conn)
            raise GatewayError("state_unavailable") from exc
        finally:
            with contextlib.suppress(*_STORE_ERRORS):
                await pool.release(conn, timeout=self._timeout_s)

    async def fetch(
        self, calls: StateCalls, op: str, query: str, *args: Any
    ) -> list[asyncpg.Record]:
        """One statement's rows, as one timed and bounded state call."""

        async def work() -> list[asyncpg.Record]:
            async with self.connection() as conn:
                return list(await conn.fetch(query, *args))

        return await calls.run(op, work())

    async def execute(self, calls: StateCalls, op: str, query: str, *args: Any) -> str:
        """One statement's status (``DELETE 3``), as one timed and bounded state call."""

        async def work() -> str:
            async with self.connection() as conn:
                return str(await conn.execute(query, *args))

        return await calls.run(op, work())

    async def ping(self) -> None:
        """The cheapest round trip (the degraded store's probe, ``StateCalls.watch``)."""
        async with self.connection() as conn:
            await conn.fetchval("SELECT 1")

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Conn]:
        async with self.connection() as conn, conn.transaction():
            yield conn

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                await asyncio.wait_for(pool.close(), self._timeout_s)
            except (TimeoutError, *_STORE_ERRORS):
                pool.terminate()
