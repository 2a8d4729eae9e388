"""Polling with a deadline: how tests wait for something to happen (never a bare sleep)."""

from __future__ import annotations

import asyncio
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


async def eventually_async(predicate: Callable[[], bool], what: str, timeout_s: float = 10) -> None:
    """Await until ``predicate()`` holds (the loop keeps running); fail past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.01)
