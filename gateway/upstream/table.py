"""The route table: route → the worker serving it, resolved once per request (spec §16).

A :class:`Worker` is one configured upstream with its live parts: its
transport (``WorkerTransport``; ``Upstream`` in production), its admission
pool (``capacity``; a tenant's ``max_permits`` counts across all of them,
``admission.AdmissionGroup``) and its launch identity for receipts. The
pipeline resolves a request's route to its worker right after planning and
carries that worker to the end, so a policy reload that moves an alias to
another route applies to new requests only, while streams in flight finish
where they started.

An alias may name a release (``release:<name>``, spec §18): :meth:`RouteTable.resolve`
then picks the arm of the request's cohort (``gateway/upstream/releases.py``).
A canary that is not ready takes nothing: its cohorts go to stable, so the
release is ready exactly when stable is. With ``fallback``, the other arm
rides along as :attr:`Resolved.other` for one retry before the worker's head.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gateway.admission import Admission, AdmissionGroup
from gateway.config import GatewayConfig, RouteKind, UpstreamConfig
from gateway.config.agents import RouteAgents
from gateway.upstream.base import WorkerTransport
from gateway.upstream.client import Upstream
from gateway.upstream.confirm import MAX_METRICS_BYTES, CancelConfirmer
from gateway.upstream.launch import launch_kind, serve_identity
from gateway.upstream.releases import CANARY, STABLE, Release, Releases, other_arm


@dataclass(eq=False)
class Worker:
    config: UpstreamConfig
    client: WorkerTransport
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
    whether the route may take traffic now; for a release, its name, the arm
    and (with ``fallback``) the other arm to try once."""

    alias: str
    route: str
    worker: Worker
    ready: bool
    release: str | None = None
    arm: str | None = None
    other: Resolved | None = None
    #: what the route's model serves (spec §23; a release's arms share one kind)
    kind: RouteKind = "chat"


class RouteTable:
    def __init__(
        self, workers: list[Worker], admissions: AdmissionGroup, releases: Releases | None = None
    ) -> None:
        self.workers = {w.name: w for w in workers}
        self.admissions = admissions
        self._by_route = {route: w for w in workers for route in w.config.served_routes}
        self._kinds = {r: kind for w in workers for r, kind in w.config.route_kinds.items()}
        #: the configured releases; the runtime replaces it with one wired to the store
        self.releases = releases if releases is not None else Releases()

    @classmethod
    def build(cls, config: GatewayConfig, admissions: AdmissionGroup) -> RouteTable:
        workers = []
        for upstream in config.workers:
            admission = admissions[upstream.name]
            launch = upstream.launch
            identity = (
                serve_identity(launch, upstream.agents, launch_kind(upstream)) if launch else None
            )
            workers.append(
                Worker(
                    config=upstream,
                    client=Upstream(upstream, pool_size=admission.capacity + 8),
                    admission=admission,
                    serve_identity=identity,
                )
            )
        return cls(workers, admissions)

    @property
    def routes(self) -> list[str]:
        return list(self._by_route)

    def worker_for(self, route: str) -> Worker:
        """The worker of a configured route (policy routes are checked at load)."""
        return self._by_route[route]

    def agents_for(self, policy_route: str) -> RouteAgents | None:
        """The ``agents`` of the worker a policy route reaches (spec §22); for a
        release, its stable arm's when both arms' agree (else none: an agentic
        request must not depend on its cohort)."""
        worker = self._by_route.get(policy_route)
        if worker is not None:
            return worker.config.agents
        release = self.releases.for_route(policy_route)
        if release is None:
            return None
        stable = self._by_route.get(release.config.stable)
        canary = self._by_route.get(release.config.canary)
        if stable is None or canary is None or stable.config.agents != canary.config.agents:
            return None
        return stable.config.agents

    def readiness_route(self, policy_route: str) -> str:
        """The route whose readiness answers for what a policy names: a release's
        stable route (its canary only takes traffic when ready), else the route."""
        release = self.releases.for_route(policy_route)
        return policy_route if release is None else release.config.stable

    def resolve(
        self,
        models: Mapping[str, str],
        alias: str,
        readiness: RouteReadiness,
        *,
        tenant: str = "",
        subject: str = "",
        request_id: str = "",
    ) -> Resolved | None:
        """The one route resolver (spec §16, §18): a tenant's alias -> its route
        and worker, once per request; None when the policy no longer names the
        alias (or the release it names). Every caller that reaches a worker for
        an alias asks here. ``tenant``, ``subject`` and ``request_id`` are the
        cohort inputs of a release."""
        route = models.get(alias)
        if route is None:
            return None
        worker = self._by_route.get(route)
        if worker is not None:  # a plain route: no more work than two lookups
            return Resolved(alias, route, worker, readiness.ready(route), kind=self._kinds[route])
        release = self.releases.for_route(route)
        if release is None:
            return None
        return self._arm(alias, release, readiness, release.assign(tenant, subject, request_id))

    def _arm(self, alias: str, release: Release, readiness: RouteReadiness, arm: str) -> Resolved:
        config = release.config
        stable, canary = config.stable, config.canary
        canary_ready = (arm == CANARY or config.fallback) and readiness.ready(canary)
        if arm == CANARY and not canary_ready:
            arm = STABLE  # the canary gets nothing until its route is ready (and probed)
        if arm == CANARY:
            route, ready, other_route = canary, True, stable
        else:
            route, ready, other_route = stable, readiness.ready(stable), canary
        other = None
        if config.fallback:
            other_ready = canary_ready if arm == STABLE else readiness.ready(stable)
            other = Resolved(
                alias,
                other_route,
                self._by_route[other_route],
                other_ready,
                config.name,
                other_arm(arm),
                kind=self._kinds[other_route],
            )
        kind = self._kinds[route]
        return Resolved(alias, route, self._by_route[route], ready, config.name, arm, other, kind)

    def kind(self, route: str) -> RouteKind:
        """What a configured route serves (spec §23)."""
        return self._kinds[route]

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
