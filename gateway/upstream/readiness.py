"""Readiness per route (spec §11, §16): a background poll of each worker's ``GET /v1/models``.

A route is ready while the last poll of its worker found it listed exactly
once as ``loaded`` and, with ``probe`` configured, a one-token request for it
has passed the full stream validator since it last became ``loaded``
(:mod:`gateway.pipeline.probe`; run by the poll, never on a request's path,
bounded by ``probe.timeout_s``). Speech and image routes are never probed
(spec §23: an image or a voice is no cheap check): the listing alone decides.
Anything else is not ready, with a reason:

======================  ===================================================
``connection_refused``  the worker did not accept the connection
``timeout``             no answer within ``readiness_timeout_s``
``http_error``          an HTTP status other than 200 (or a broken answer)
``bad_body``            not a ``/v1/models`` listing, or an unknown status
``route_missing``       the route is not listed
``duplicate_route``     the route is listed more than once
``unloaded``            listed ``unloaded``
``reloading``           listed ``reloading``
``probe_failed``        ``loaded``, but the probe request failed
======================  ===================================================

Each worker has its own poll task (its own ``readiness_poll_s``). Every
change of a route's state is logged with its reason (the first poll's too)
and shown on ``gateway_upstream_ready{upstream,route}``. Inference handlers
read :meth:`Readiness.ready` and never touch a worker for a route that is
not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gateway.config import PROBED_KINDS
from gateway.observe.metrics import GatewayMetrics
from gateway.upstream.client import ListingError
from gateway.upstream.table import RouteTable, Worker

log = logging.getLogger("gateway.readiness")

Probe = Callable[[Worker, str], Awaitable[bool]]


@dataclass(slots=True)
class RouteState:
    upstream: str
    ready: bool = False
    #: why it is not ready (None when ready); "timeout" until a first answer
    reason: str | None = "timeout"
    status: str | None = None
    #: the worker's ``created`` (unix seconds) for the route, once seen
    created: int | None = None
    #: the probe passed since the route last became loaded
    probed: bool = False
    polled: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"upstream": self.upstream, "ready": self.ready, "reason": self.reason}


#: the listing statuses that are their own not-ready reason
_STATUS_REASONS = frozenset({"unloaded", "reloading"})


def classify(listing: Any, route: str) -> tuple[str | None, str | None, int | None]:
    """(status, reason or None when loaded, created) of a route in a listing. Pure."""
    if not isinstance(listing, dict) or not isinstance(listing.get("data"), list):
        return None, "bad_body", None
    entries = [e for e in listing["data"] if isinstance(e, dict) and e.get("id") == route]
    if not entries:
        return None, "route_missing", None
    if len(entries) > 1:
        return None, "duplicate_route", None
    entry = entries[0]
    status = entry.get("status")
    created = entry.get("created") if type(entry.get("created")) is int else None
    if status == "loaded":
        return status, None, created
    if isinstance(status, str) and status in _STATUS_REASONS:
        return status, status, created
    return status if isinstance(status, str) else None, "bad_body", created


class Readiness:
    def __init__(
        self, table: RouteTable, metrics: GatewayMetrics, probe: Probe | None = None
    ) -> None:
        self._table = table
        self._metrics = metrics
        self._probe = probe
        self.routes = {route: RouteState(table.worker_for(route).name) for route in table.routes}
        self._tasks: list[asyncio.Task[None]] = []
        self._polled: dict[str, asyncio.Event] = {name: asyncio.Event() for name in table.workers}

    def state(self, route: str) -> RouteState:
        return self.routes[route]

    def ready(self, route: str) -> bool:
        state = self.routes.get(route)
        return state is not None and state.ready

    async def poll_once(self, worker: Worker | None = None) -> None:
        """Poll one worker (or every worker) and update its routes."""
        workers = [worker] if worker is not None else list(self._table.workers.values())
        await asyncio.gather(*(self._poll(w) for w in workers))

    async def _poll(self, worker: Worker) -> None:
        config = worker.config
        try:
            async with asyncio.timeout(config.readiness_timeout_s):
                listing = await worker.client.get_models(config.readiness_timeout_s)
            failure = None
        except ListingError as exc:
            listing, failure = None, exc.reason
        except TimeoutError:
            listing, failure = None, "timeout"
        except Exception as exc:  # any other failure means "not ready", never a crash
            log.debug("readiness poll of %s failed: %s", worker.name, type(exc).__name__)
            listing, failure = None, "http_error"
        for route in config.served_routes:
            if failure is not None:
                self._set(route, None, failure, None)
                continue
            status, reason, created = classify(listing, route)
            state = self.routes[route]
            probed = config.probe is not None and config.route_kinds[route] in PROBED_KINDS
            if reason is None and probed and self._probe is not None:
                if not state.probed:
                    # Once per transition to loaded: the first request must not find
                    # a loaded route that cannot answer.
                    state.probed = await self._probe(worker, route)
                if not state.probed:
                    reason = "probe_failed"
            self._set(route, status, reason, created)
        self._polled[worker.name].set()

    def _set(self, route: str, status: str | None, reason: str | None, created: int | None) -> None:
        state = self.routes[route]
        if status != "loaded":
            state.probed = False
        ready = reason is None
        changed = not state.polled or ready != state.ready or reason != state.reason
        state.polled, state.ready, state.reason, state.status = True, ready, reason, status
        if created is not None:
            state.created = created
        self._metrics.child(self._metrics.upstream_ready, state.upstream, route).set(int(ready))
        if changed:
            shown = "ready" if ready else f"not ready: {reason}"
            log.info("route %s on upstream %s: %s", route, state.upstream, shown)

    async def _run(self, worker: Worker) -> None:
        interval = worker.config.readiness_poll_s
        while True:
            await self._poll(worker)
            await asyncio.sleep(interval)

    def start(self) -> None:
        for worker in self._table.workers.values():
            self._tasks.append(
                asyncio.create_task(self._run(worker), name=f"readiness-{worker.name}")
            )

    async def wait_first_poll(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(event.wait() for event in self._polled.values()))

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
