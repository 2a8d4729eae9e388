"""Every state call timed, bounded and counted in one place (spec §17).

A call slower than ``state.timeout_ms`` or refused by the store is
``state_unavailable`` for the request that needed it; nothing else stops.
:attr:`StateCalls.degraded` says whether the last call failed, which
``/readyz`` lists (the store is shared: failing readiness would take every
replica out at once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gateway.books.evidence.records import StorageFull
from gateway.core.errors import GatewayError

T = TypeVar("T")
log = logging.getLogger("gateway.state")


class StateCalls:
    def __init__(
        self,
        timeout_s: float | None,
        observe: Callable[[str, float], None] = lambda op, seconds: None,
        on_error: Callable[[], None] = lambda: None,
    ) -> None:
        self._timeout_s = timeout_s
        self._observe = observe
        self._on_error = on_error
        self.degraded = False

    async def run(self, op: str, work: Awaitable[T]) -> T:
        began = time.perf_counter()
        try:
            async with asyncio.timeout(self._timeout_s):
                result = await work
        except TimeoutError:
            self._failed(op, "timeout")
            raise GatewayError("state_unavailable") from None
        except GatewayError as exc:
            # A full volume is the volume's to report (VolumeWatch), not the store being down.
            if exc.code == "state_unavailable" and not isinstance(exc, StorageFull):
                # The driver's class names why (its text may carry the DSN's host or user).
                cause = exc.__cause__
                self._failed(op, type(cause).__name__ if cause is not None else "refused")
            raise
        finally:
            self._observe(op, time.perf_counter() - began)
        if self.degraded:
            log.info("state store: calls succeed again")
            self.degraded = False
        return result

    def _failed(self, op: str, why: str) -> None:
        self._on_error()
        if not self.degraded:
            # Once per episode: a store down for minutes must not flood the log.
            log.error("state store: %s failed (%s); requests that need state get 503", op, why)
        self.degraded = True
