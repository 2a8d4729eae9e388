"""One place that turns ``state:`` into books (spec §17), as
``gateway/ratelimit/factory.py`` does for ``limits_store:``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gateway.books.evidence.service import RESERVE_SUFFIX, EvidenceService
from gateway.books.evidence.store import EvidenceStore
from gateway.books.protocols import AnchorStore, EvidenceCatalog, ReleaseStore, ResponseStore
from gateway.books.state.calls import StateCalls
from gateway.books.state.sqlite.anchors import SqliteAnchorStore
from gateway.books.state.sqlite.catalog import Catalog
from gateway.books.state.sqlite.evidence import SqliteCatalog
from gateway.books.state.sqlite.releases import SqliteReleaseStore
from gateway.books.state.sqlite.responses import SqliteResponseStore
from gateway.books.volume import VolumeWatch
from gateway.config import GatewayConfig
from gateway.core.dimensions import PixelBounds

#: an evidence lease outlives the longest request by this much (spec §17)
LEASE_MARGIN_S = 10.0


def evidence_lease_s(config: GatewayConfig) -> float:
    """How long an evidence lease holds its file when its replica never releases it."""
    return max(u.total_timeout_s for u in config.workers) + LEASE_MARGIN_S


@dataclass(eq=False)
class State:
    catalog: EvidenceCatalog
    responses: ResponseStore
    #: release decisions and the arms' figures (spec §18)
    releases: ReleaseStore
    calls: StateCalls
    #: other replicas share it (their leases, temps and responses are theirs)
    shared: bool
    #: whether the state volume (evidence files; SQLite's file) was last found full
    volume: VolumeWatch
    #: closes what the books above hold that their protocols do not close
    #: (``ReleaseStore`` has no ``close``: a runtime's fake needs none)
    closers: tuple[Callable[[], Awaitable[None]], ...] = field(default=())
    #: each replica's receipt-chain head (spec §24)
    anchors: AnchorStore = field(kw_only=True)

    async def close(self) -> None:
        await self.calls.aclose()
        for close in self.closers:
            await close()
        await self.responses.close()
        await self.catalog.close()


def open_state(
    config: GatewayConfig,
    env: Mapping[str, str],
    observe: Callable[[str, float], None] = lambda op, seconds: None,
    on_error: Callable[[], None] = lambda: None,
) -> State:
    """The configured backend; PostgreSQL connects on first use (a replica
    starts, and serves what needs no state, while the store is down)."""
    state = config.state
    if state.backend == "postgres":
        # Imported here: a SQLite-only install never loads the driver.
        from gateway.books.state.postgres.anchors import PgAnchorStore
        from gateway.books.state.postgres.evidence import PgCatalog
        from gateway.books.state.postgres.pool import PgPool, dsn_from
        from gateway.books.state.postgres.releases import PgReleaseStore
        from gateway.books.state.postgres.responses import PgResponseStore

        calls = StateCalls(state.timeout_s, observe, on_error)
        pool = PgPool(dsn_from(env, state.dsn_env), state.timeout_s)
        calls.watch(pool.ping)
        return State(
            PgCatalog(pool, calls, state.replica),
            PgResponseStore(pool, calls),
            PgReleaseStore(pool, calls),
            calls,
            True,
            VolumeWatch(),  # the evidence files' (the records are PostgreSQL's)
            anchors=PgAnchorStore(pool, calls),
        )
    calls = StateCalls(None, observe, on_error)
    path = Path(config.staging.catalog)
    volume = VolumeWatch()
    catalog = SqliteCatalog(Catalog(path, volume=volume), calls)
    calls.watch(catalog.ping)
    responses = SqliteResponseStore(path, volume=volume)
    releases = SqliteReleaseStore(path)
    anchors = SqliteAnchorStore(path)
    return State(
        catalog,
        responses,
        releases,
        calls,
        False,
        volume,
        closers=(releases.close, anchors.close),
        anchors=anchors,
    )


def evidence_service(
    config: GatewayConfig,
    state: State,
    on_leases_change: Callable[[int], None] | None = None,
) -> EvidenceService:
    """The evidence service over the configured backend and ``staging.dir``."""
    catalog = Path(config.staging.catalog)
    return EvidenceService(
        EvidenceStore(Path(config.staging.dir), state.volume),
        state.catalog,
        on_leases_change,
        # SQLite journals even a delete: its reserve makes room on a full volume.
        reserve=None if state.shared else catalog.with_name(catalog.name + RESERVE_SUFFIX),
        lease_ttl_s=evidence_lease_s(config),
        shared=state.shared,
        pixels=PixelBounds(config.staging.max_image_pixels, config.staging.max_image_side),
    )
