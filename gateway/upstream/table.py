"""The route table: route → the worker serving it, resolved once per request (spec §16).

A :class:`Worker` is one configured upstream with its live parts: its
connection pool (``Upstream``), its admission pool (``capacity``; a tenant's
``max_permits`` counts across all of them, ``admission.AdmissionGroup``) and
its launch identity for receipts. The pipeline resolves a request's route to
its worker right after planning and carries that worker to the end, so a
policy reload that moves an alias to another route applies to new requests
only, while streams in flight finish where they started.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gateway.admission import Admission, AdmissionGroup
from gateway.config import GatewayConfig, UpstreamConfig
from gateway.upstream.client import Upstream
from gateway.upstream.confirm import MAX_METRICS_BYTES, CancelConfirmer
from gateway.upstream.launch import serve_identity


@dataclass(eq=False)
class Worker:
    config: UpstreamConfig
    client: Upstream
    admission: Admission
    serve_identity: str | None
    #: holds canceled requests' permits until the worker confirms (spec §20); None: off
    confirmer: CancelConfirmer | None = None
    #: requests sent to this worker and not yet ended (the confirmation's "live")
    live: int = 0

    @property
    def name(self) -> str:
        return self.config.name


class RouteReadiness(Protocol):
    def ready(self, route: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class Resolved:
    """Where one request goes: its alias's route, that route's worker, and
    whether the route may take traffic now."""

    alias: str
    route: str
    worker: Worker
    ready: bool


class RouteTable:
    def __init__(self, workers: list[Worker], admissions: AdmissionGroup) -> None:
        self.workers = {w.name: w for w in workers}
        self.admissions = admissions
        self._by_route = {route: w for w in workers for route in w.config.served_routes}

    @classmethod
    def build(cls, config: GatewayConfig, admissions: AdmissionGroup) -> RouteTable:
        workers = []
        for upstream in config.workers:
            admission = admissions[upstream.name]
            launch = upstream.launch
            workers.append(
                Worker(
                    config=upstream,
                    client=Upstream(upstream, pool_size=admission.capacity + 8),
                    admission=admission,
                    serve_identity=serve_identity(launch) if launch is not None else None,
                )
            )
        return cls(workers, admissions)

    @property
    def routes(self) -> list[str]:
        return list(self._by_route)

    def worker_for(self, route: str) -> Worker:
        """The worker of a configured route (policy routes are checked at load)."""
        return self._by_route[route]

    def resolve(
        self, models: Mapping[str, str], alias: str, readiness: RouteReadiness
    ) -> Resolved | None:
        """The one route resolver (spec §16): a tenant's alias -> its route and
        worker, once per request; None when the policy no longer names the alias.
        Every caller that reaches a worker for an alias asks here."""
        route = models.get(alias)
        if route is None:
            return None
        return Resolved(alias, route, self._by_route[route], readiness.ready(route))

    def confirm_cancels(
        self,
        on_confirmed: Callable[[str, float], None],
        on_unconfirmed: Callable[[str], None],
    ) -> None:
        """A :class:`CancelConfirmer` for each worker whose ``confirm_cancel``
        names a metrics path."""
        for worker in self.workers.values():
            confirm = worker.config.confirm_cancel
            if confirm.metrics_path is None:
                continue
            worker.confirmer = CancelConfirmer(
                worker.name,
                functools.partial(
                    worker.client.get_metrics,
                    confirm.metrics_path,
                    worker.config.readiness_timeout_s,
                    MAX_METRICS_BYTES,
                ),
                timeout_s=confirm.timeout_s,
                live=functools.partial(_live, worker),
                on_confirmed=functools.partial(on_confirmed, worker.name),
                on_unconfirmed=functools.partial(on_unconfirmed, worker.name),
            )

    async def release_held(self) -> None:
        """Give back every canceled request's permits still waiting for its worker."""
        for worker in self.workers.values():
            if worker.confirmer is not None:
                await worker.confirmer.aclose()

    async def aclose(self) -> None:
        for worker in self.workers.values():
            await worker.client.aclose()


def _live(worker: Worker) -> int:
    return worker.live


def capacities(config: GatewayConfig) -> dict[str, int]:
    return {u.name: u.capacity or config.admission.capacity for u in config.workers}
