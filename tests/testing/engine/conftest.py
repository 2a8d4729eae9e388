"""One tiny-model adapter for the whole session (a subprocess, stopped by PID at the end).

Its keep-alive interval is 1 ms, so keep-alive comments fall between the chunks
of every stream and each framing test checks them too.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.engine import EngineAdapter, running_adapter


@pytest.fixture(scope="session")
def tiny() -> Iterator[EngineAdapter]:
    with running_adapter("tiny", keepalive_ms=1) as adapter:
        yield adapter
