"""Builders shared by the state-backend tests: catalogs on a clock the test moves."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

import pytest

from gateway.books.evidence.records import EvidenceRecord
from gateway.books.protocols import EvidenceCatalog
from gateway.books.state.calls import StateCalls
from gateway.books.state.sqlite.catalog import Catalog
from gateway.books.state.sqlite.evidence import SqliteCatalog

if TYPE_CHECKING:
    from gateway.books.state.postgres.evidence import PgCatalog
    from gateway.books.state.postgres.pool import PgPool

SHA_A = "a" * 64
SHA_B = "b" * 64
SHA_C = "c" * 64
#: generous: these tests are about results, the outage tests choose their own bound
TIMEOUT_S = 10.0


def pg_catalog(
    dsn: str,
    clock: Callable[[], float],
    replica: str = "replica-a",
    timeout_s: float = TIMEOUT_S,
    calls: StateCalls | None = None,
) -> PgCatalog:
    """A PostgreSQL catalog on a pool of its own (one replica's)."""
    # Imported here, as the factory does: the SQLite half needs no driver.
    from gateway.books.state.postgres.evidence import PgCatalog
    from gateway.books.state.postgres.pool import PgPool

    return PgCatalog(
        PgPool(dsn, timeout_s),
        StateCalls(timeout_s) if calls is None else calls,
        replica,
        clock=clock,
    )


def sqlite_catalog(path: Path, clock: Callable[[], float]) -> SqliteCatalog:
    return SqliteCatalog(Catalog(path, clock=clock))


async def add(
    catalog: EvidenceCatalog,
    tenant: str = "acme",
    sha: str = SHA_A,
    *,
    size: int = 82,
    locator: str | None = None,
    quota: tuple[int, int] | None = None,
    not_before: int = 0,
) -> EvidenceRecord:
    return await catalog.add(
        tenant=tenant,
        sha256=sha,
        media_type="image/png",
        ext="png",
        size=size,
        locator_sha256=locator,
        quota=quota,
        not_before=not_before,
    )


S = TypeVar("S")


@dataclass
class ContractBackend(Generic[S]):
    """One backend of a store contract test: SQLite (``where`` is the state
    file) or PostgreSQL (the DSN of the test's database). Each :meth:`open`
    is another replica's store on the same file or database; every one is
    closed after the test (:func:`contract_backend`)."""

    name: str
    where: str
    #: the SQLite store on a file, and how it is closed
    sqlite: Callable[[Path], tuple[S, Callable[[], Awaitable[None]]]]
    #: the PostgreSQL store on a pool of its own
    postgres: Callable[[PgPool, StateCalls], S]
    opened: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def open(self) -> S:
        if self.name == "sqlite":
            store, close = self.sqlite(Path(self.where))
            self.opened.append(close)
            return store
        # Imported here, as the factory does: the SQLite half needs no driver.
        from gateway.books.state.postgres.pool import PgPool

        pool = PgPool(self.where, TIMEOUT_S)
        self.opened.append(pool.close)
        return self.postgres(pool, StateCalls(TIMEOUT_S))


@asynccontextmanager
async def contract_backend(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    sqlite: Callable[[Path], tuple[S, Callable[[], Awaitable[None]]]],
    postgres: Callable[[PgPool, StateCalls], S],
) -> AsyncIterator[ContractBackend[S]]:
    """The backend ``request.param`` names (``"sqlite"`` or ``"postgres"``),
    its stores closed on the way out."""
    if request.param == "sqlite":
        where = str(tmp_path / "catalog.sqlite3")
    else:
        where = request.getfixturevalue("postgres_dsn")
    made = ContractBackend(request.param, where, sqlite, postgres)
    try:
        yield made
    finally:
        for close in made.opened:
            await close()
