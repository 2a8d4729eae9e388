"""Every state call timed, bounded and counted in one place (spec §17).

A call slower than ``state.timeout_ms`` or refused by the store is
``state_unavailable`` for the request that needed it; nothing else stops.
:attr:`StateCalls.degraded` says whether the last call failed, which
``/readyz`` lists (the store is shared: failing readiness would take every
replica out at once).

While degraded, the store is *known* down: requests that would need it are
refused before the worker is called (``gateway/books/state/guard.py``, spec
§24), so no request may be what tells the replica it is back. A probe (a
trivial read, given by the backend: :meth:`StateCalls.watch`) runs every
:data:`PROBE_S` from the first failure until a call succeeds, then stops: a
healthy store costs no probe at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gateway.books.evidence.records import StorageFull
from gateway.core.errors import GatewayError

T = TypeVar("T")
log = logging.getLogger("gateway.state")

#: how often a degraded store is probed until it answers
PROBE_S = 1.0


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
        self._probe: Callable[[], Awaitable[object]] | None = None
        self._probe_s = PROBE_S
        self._prober: asyncio.Task[None] | None = None
        self._closed = False

    def watch(self, probe: Callable[[], Awaitable[object]], interval_s: float = PROBE_S) -> None:
        """The backend's trivial read, run while degraded (module docstring)."""
        self._probe, self._probe_s = probe, interval_s

    async def aclose(self) -> None:
        self._closed = True
        prober, self._prober = self._prober, None
        if prober is not None:
            prober.cancel()
            await asyncio.gather(prober, return_exceptions=True)

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
        self._start_probing()

    def _start_probing(self) -> None:
        if self._probe is None or self._prober is not None or self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a call made outside a loop has nobody to probe for
            return
        self._prober = loop.create_task(self._probing(), name="state-probe")

    async def _probing(self) -> None:
        """Until a call (this probe's or any other) succeeds, or the store closes."""
        probe = self._probe
        assert probe is not None
        try:
            while self.degraded and not self._closed:
                await asyncio.sleep(self._probe_s)
                # Whatever it raises is a failed probe; the next one tries again.
                with contextlib.suppress(Exception):
                    await self.run("probe", probe())
        finally:
            self._prober = None
