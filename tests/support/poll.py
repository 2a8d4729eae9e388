"""Polling with a deadline: how tests wait for something to happen (never a bare sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(predicate: Callable[[], bool], timeout_s: float = 5) -> bool:
    """True as soon as ``predicate()`` is; False if it still is not after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
