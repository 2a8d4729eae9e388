"""Background readiness poll of the worker's ``GET /v1/models`` (spec §11).

Ready only while the last poll found the configured route exactly once with
status ``loaded``; anything else (another status, missing or duplicated
route, a bad body, an error or a timeout) is not ready. Inference handlers
read :attr:`Readiness.ready` and never touch the worker while it is False.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gateway.metrics import GatewayMetrics
from gateway.upstream.client import Upstream, models_status, route_entry

log = logging.getLogger("gateway.readiness")


class Readiness:
    def __init__(self, upstream: Upstream, metrics: GatewayMetrics) -> None:
        self._upstream = upstream
        self._metrics = metrics
        self.ready = False
        self.status: str | None = None
        #: the worker's ``created`` (unix seconds) for the route, once seen
        self.created: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._polled = asyncio.Event()

    async def poll_once(self) -> bool:
        config = self._upstream.config
        try:
            async with asyncio.timeout(config.readiness_timeout_s):
                listing = await self._upstream.get_models(config.readiness_timeout_s)
            status = models_status(listing, config.route)
            entry = route_entry(listing, config.route)
            created = None if entry is None else entry.get("created")
            if type(created) is int:
                self.created = created
        except Exception as exc:  # any failure means "not ready", never a crash
            log.debug("readiness poll failed: %s", type(exc).__name__)
            status = None
        ready = status == "loaded"
        if ready != self.ready:
            log.info("upstream %s", "ready" if ready else f"not ready (status={status})")
        self.ready, self.status = ready, status
        self._metrics.upstream_ready.set(1 if ready else 0)
        self._polled.set()
        return ready

    async def _run(self) -> None:
        interval = self._upstream.config.readiness_poll_s
        while True:
            await self.poll_once()
            await asyncio.sleep(interval)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="readiness-poll")

    async def wait_first_poll(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._polled.wait()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
