"""One contract, two backends: every AnchorStore behaves alike (spec §24); and
the replica's anchoring of its receipt chain's head on disk.

Each store test runs on SQLite (one file in ``tmp_path``) and on PostgreSQL (a
fresh database of the test's own); two replicas are two stores on the same
file or database, as two gateway processes would open them."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gateway.books.anchors import ChainAnchors
from gateway.books.protocols import ANCHOR_FORGET_AFTER_S, AnchorStore
from gateway.books.receipt_chain import Anchor
from gateway.books.receipts import ReceiptWriter
from gateway.books.state.calls import StateCalls
from gateway.books.state.sqlite.anchors import SqliteAnchorStore
from gateway.core.errors import GatewayError
from tests.books.state.support import ContractBackend, contract_backend
from tests.support.receipts import make_receipt

NOW = 1_700_000_000.5


if TYPE_CHECKING:
    from gateway.books.state.postgres.pool import PgPool

Backend = ContractBackend[AnchorStore]


def _sqlite(path: Path) -> tuple[AnchorStore, Callable[[], Awaitable[None]]]:
    store = SqliteAnchorStore(path)
    return store, store.close


def _postgres(pool: PgPool, calls: StateCalls) -> AnchorStore:
    # Imported here, as the factory does: the SQLite half needs no driver.
    from gateway.books.state.postgres.anchors import PgAnchorStore

    return PgAnchorStore(pool, calls)


@pytest.fixture(params=["sqlite", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async with contract_backend(request, tmp_path, _sqlite, _postgres) as made:
        yield made


async def test_each_replica_has_its_last_anchor(backend: Backend) -> None:
    one, other = backend.open(), backend.open()
    assert await one.anchors() == {}
    await one.anchor("gw-0", 10, "a" * 64, NOW)
    await other.anchor("gw-1", 3, "b" * 64, NOW + 1)
    await one.anchor("gw-0", 12, "c" * 64, NOW + 2)  # replaces its own, not the other's
    assert await other.anchors() == {
        "gw-0": Anchor("gw-0", 12, "c" * 64, NOW + 2),
        "gw-1": Anchor("gw-1", 3, "b" * 64, NOW + 1),
    }


async def test_an_anchor_of_a_replica_silent_for_long_is_forgotten(backend: Backend) -> None:
    store = backend.open()
    await store.anchor("gone", 5, "a" * 64, NOW)
    await store.anchor("live", 1, "b" * 64, NOW + ANCHOR_FORGET_AFTER_S - 1)
    assert set(await store.anchors()) == {"gone", "live"}
    await store.anchor("live", 2, "c" * 64, NOW + ANCHOR_FORGET_AFTER_S + 1)
    assert set(await store.anchors()) == {"live"}


class _Store:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, int, str]] = []
        self.down = False

    async def anchor(self, replica: str, seq: int, sha256: str, now: float) -> None:
        if self.down:
            raise GatewayError("state_unavailable")
        self.recorded.append((replica, seq, sha256))

    async def anchors(self) -> dict[str, Anchor]:
        return {}


async def test_the_head_on_disk_is_anchored_when_it_moves_and_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "gateway.receipts")
    path = tmp_path / "receipts.jsonl"
    writer = ReceiptWriter(path, replica="gw-0")
    await writer.start()
    store, shown = _Store(), list[int]()
    anchors = ChainAnchors(writer, store, "gw-0", interval_s=10, show_seq=shown.append)
    assert await anchors.record() and store.recorded == []  # no line yet
    for n in range(3):
        writer.write(make_receipt(n))
    assert await writer.flush(5) == 0
    assert await anchors.record()
    last = path.read_bytes().splitlines()[-1]
    assert store.recorded == [("gw-0", 3, hashlib.sha256(last).hexdigest())]
    assert await anchors.record()
    assert len(store.recorded) == 1, "an unmoved head is not recorded again"
    writer.write(make_receipt(3))
    assert await writer.flush(5) == 0
    store.down = True
    assert not await anchors.record()
    assert not await anchors.record()
    store.down = False
    assert await anchors.record()
    assert [seq for _, seq, _ in store.recorded] == [3, 4]
    assert shown[-1] == 4
    said = [r.getMessage() for r in caplog.records]
    assert sum("anchor was not recorded" in m for m in said) == 1  # once per episode
    await writer.aclose(5)
