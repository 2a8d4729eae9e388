"""One two-route simulator for the package's tests (reset before each test)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from gateway.testing.simulator import Simulator

ROUTE_A = "/srv/mosaic-models/" + "a" * 64
ROUTE_B = "/srv/mosaic-models/" + "b" * 64
SEED = 0x5EED


@pytest.fixture(scope="package")
def sim() -> Iterator[Simulator]:
    simulator = Simulator(model_ids=[ROUTE_A, ROUTE_B], id_seed=SEED)
    simulator.start()
    yield simulator
    simulator.stop()


@pytest.fixture
def client(sim: Simulator) -> Iterator[httpx.Client]:
    sim.reset()
    with httpx.Client(base_url=sim.base_url, timeout=5) as c:
        yield c
