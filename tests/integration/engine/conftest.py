"""The engine lane through the real gateway: one tiny-model adapter and one gateway per session.

The adapter (a subprocess around the real mistral.rs engine, random weights)
keeps the server's 10 s keep-alive here; the keep-alive test runs its own
adapter at 1 ms. Other gateways (another ``text_nul``) may stand in front of
the same adapter.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.testing.harness import DEMO_SECRET_ENV
from tests.support.engine import EngineAdapter, running_adapter
from tests.support.engine_stack import EngineStack, running_engine_stack
from tests.support.jwt import HS_SECRET


@pytest.fixture(scope="session")
def dev_secret() -> Iterator[None]:
    patch = pytest.MonkeyPatch()
    patch.setenv(DEMO_SECRET_ENV, HS_SECRET)
    try:
        yield
    finally:
        patch.undo()


@pytest.fixture(scope="session")
def tiny_adapter() -> Iterator[EngineAdapter]:
    with running_adapter("tiny") as adapter:
        yield adapter


@pytest.fixture(scope="session")
def lane(
    tiny_adapter: EngineAdapter, dev_secret: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineStack]:
    with running_engine_stack(tmp_path_factory.mktemp("lane"), tiny_adapter) as stack:
        yield stack
