"""Releases in the request path (spec §18): which arm a request gets, what each
arm's window saw, and the decisions every replica follows.

Theory of operation:

- One :class:`Release` per configured release holds the **effective
  percent**: this replica's unsaved gate rollback (0), else the standing
  decision last read from the :class:`~gateway.books.protocols.ReleaseStore`
  (``override`` its percent, ``rolled_back`` 0), else the configured
  ``canary_percent``. It is a plain float, recomputed only when a decision
  changes, so :meth:`Release.assign` costs one SHA-256 of the cohort key
  (``gateway/core/release.py``) and nothing at 0 or 100 percent.
- Each arm has an :class:`~gateway.core.release.ArmWindow` (the gate's
  ``window_s``, else :data:`DEFAULT_WINDOW_S`, so ``release status`` has
  figures without a gate too). :meth:`Releases.record` is O(1); requests the
  worker never saw (refused before sending) are not recorded there.
- The gate is judged on every finished request of its release once each arm
  has ``min_requests`` in the window (:meth:`Releases.record`, spec §24: on
  a one-second timer, 12 of 12 failing canary requests passed a
  ``min_requests: 5`` gate before it tripped), and again by each sync as
  the window moves. A gate that fails takes effect at once (effective 0, one
  warning line with the figures, ``gateway_release_rollbacks_total``) and
  wakes the sync, which saves it with ``store.decide``.
- :meth:`Releases.sync` runs every :data:`SYNC_S` (:meth:`Releases.start`):
  it judges each gate, saves a rollback decided since, reads the standing
  decisions, publishes this replica's figures and sets
  ``gateway_release_canary_percent``; a store that is down keeps the last
  known decisions, is logged once per episode, and the save is retried on
  the next sync.
- A decision that leaves ``rolled_back`` (an operator's ``clear`` or ``set``)
  starts both windows afresh: the failures that tripped the gate must not trip
  it again at once.
- :meth:`Releases.configure` (SIGHUP) rebuilds the entries from the new config;
  decisions carry over by name (they live in the store) and so do the windows
  of a release whose routes and window are unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from gateway.books.protocols import ArmCounts, ReleaseOverride, ReleaseStore
from gateway.config.releases import RELEASE_PREFIX, ReleaseConfig
from gateway.core.errors import GatewayError
from gateway.core.release import ArmWindow, Figures, GateRule, is_canary, judge
from gateway.observe.metrics import GatewayMetrics

log = logging.getLogger("gateway.releases")

STABLE, CANARY = "stable", "canary"
ARMS = (STABLE, CANARY)
#: how often decisions are read, figures published and gates judged
SYNC_S = 1.0
#: the arms' window when no gate names one (``release status`` figures)
DEFAULT_WINDOW_S = 300.0
#: the longest one store call may hold a sync
STORE_TIMEOUT_S = 2.0
#: receipt outcomes and error codes that are worker faults (spec §18 "Failures")
_FAILED_OUTCOMES = frozenset({"protocol_error", "upstream_error"})
_FAILED_CODES = frozenset({"upstream_unavailable", "upstream_timeout"})
_NOT_FAILED_CODES = frozenset({"upstream_rejected"})


def is_failure(outcome: str, error_code: str | None) -> bool:
    """A worker fault: not a caller's cancel, not a 4xx (the worker's own 4xx,
    ``upstream_rejected``, is the request's fault though its outcome says
    ``upstream_error``)."""
    if outcome == "canceled" or error_code in _NOT_FAILED_CODES:
        return False
    return outcome in _FAILED_OUTCOMES or error_code in _FAILED_CODES


def other_arm(arm: str) -> str:
    return CANARY if arm == STABLE else STABLE


class Release:
    """One configured release on this replica: its effective percent, its windows."""

    def __init__(self, config: ReleaseConfig, windows: dict[str, ArmWindow] | None = None) -> None:
        self.config = config
        self.name = config.name
        gate = config.gate
        self.window_s = gate.window_s if gate is not None else DEFAULT_WINDOW_S
        self.rule = (
            GateRule(gate.min_requests, gate.max_failure_rate_delta, gate.max_ttft_p95_ratio)
            if gate is not None
            else None
        )
        self.windows = windows if windows is not None else self._fresh_windows()
        #: the standing decision as last read from the store (or saved by this replica)
        self.decision: ReleaseOverride | None = None
        #: this replica's gate rolled it back and the store has not taken it yet
        self.unsaved = False
        self.percent = config.canary_percent

    def _fresh_windows(self) -> dict[str, ArmWindow]:
        return {arm: ArmWindow(self.window_s) for arm in ARMS}

    @property
    def routes(self) -> dict[str, str]:
        return {STABLE: self.config.stable, CANARY: self.config.canary}

    @property
    def state(self) -> str:
        """``config`` | ``override`` | ``rolled_back`` (as ``release status`` names them)."""
        if self.unsaved or (self.decision is not None and self.decision.state == "rolled_back"):
            return "rolled_back"
        return "config" if self.decision is None else "override"

    def _update(self) -> None:
        state = self.state
        if state == "rolled_back":
            self.percent = 0.0
        elif state == "override" and self.decision is not None:
            self.percent = self.decision.percent
        else:
            self.percent = self.config.canary_percent

    def follow(self, decision: ReleaseOverride | None) -> None:
        """Take the store's standing decision (none: back to the config)."""
        if self.unsaved:
            return  # this replica's rollback replaces whatever stands, once saved
        was_rolled_back = self.state == "rolled_back"
        self.decision = decision
        if was_rolled_back and self.state != "rolled_back":
            self.windows = self._fresh_windows()
        self._update()

    def roll_back(self, saved_at: float | None) -> None:
        """The gate failed: 0 now; ``saved_at`` once the store holds it (None: not yet)."""
        if saved_at is None:
            self.unsaved = True
        else:
            self.unsaved = False
            self.decision = ReleaseOverride(self.name, "rolled_back", 0.0, saved_at)
        self._update()

    def cohort_key(self, tenant: str, subject: str, request_id: str) -> str:
        cohort = self.config.cohort
        if cohort == "subject":
            return f"{tenant}\n{subject}"
        return tenant if cohort == "tenant" else request_id

    def assign(self, tenant: str, subject: str, request_id: str) -> str:
        """The arm of this cohort at the effective percent (readiness aside)."""
        percent = self.percent
        if percent <= 0:
            return STABLE
        if percent >= 100:
            return CANARY
        key = self.cohort_key(tenant, subject, request_id)
        return CANARY if is_canary(self.name, key, percent) else STABLE

    def figures(self, now: float) -> dict[str, Figures]:
        return {arm: window.figures(now) for arm, window in self.windows.items()}


class Releases:
    """Every configured release of this replica, and the sync with the store."""

    def __init__(
        self,
        configs: Sequence[ReleaseConfig] = (),
        metrics: GatewayMetrics | None = None,
        *,
        store: ReleaseStore | None = None,
        replica: str = "replica",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sync_s: float = SYNC_S,
    ) -> None:
        self._metrics = metrics
        self._store = store
        self._replica = replica
        self._clock = clock
        self._wall = wall
        self._sync_s = sync_s
        self._entries: dict[str, Release] = {}
        self._task: asyncio.Task[None] | None = None
        #: set by a gate's rollback on the request path: the sync saves it now
        self._wake = asyncio.Event()
        #: the store failed on the last sync (logged once per episode)
        self._store_down = False
        self.configure(configs)

    # -- the request path ---------------------------------------------------------

    def __bool__(self) -> bool:
        return bool(self._entries)

    def get(self, name: str) -> Release | None:
        return self._entries.get(name)

    def for_route(self, policy_route: str) -> Release | None:
        """The release a policy's ``release:<name>`` names; None for a plain route."""
        if not policy_route.startswith(RELEASE_PREFIX):
            return None
        return self._entries.get(policy_route[len(RELEASE_PREFIX) :])

    def assign(self, release: str, tenant: str, subject: str, request_id: str) -> str:
        return self._entries[release].assign(tenant, subject, request_id)

    def percent(self, release: str) -> float:
        return self._entries[release].percent

    def record(self, release: str, arm: str, failed: bool, ttft_s: float | None) -> None:
        """One request that reached an arm's worker, into that arm's window, and
        the gate judged on it at once (spec §24): O(buckets + bins)."""
        entry = self._entries.get(release)
        if entry is None:  # a release a reload removed: its window went with it
            return
        now = self._clock()
        entry.windows[arm].record(now, failed, ttft_s)
        rule = entry.rule
        if rule is None or entry.state == "rolled_back":
            return
        windows = entry.windows
        if min(w.requests(now) for w in windows.values()) < rule.min_requests:
            return  # no verdict yet: the cheap count says so
        self._judge(entry, {side: window.figures(now) for side, window in windows.items()})

    def settled(
        self,
        release: str,
        arm: str,
        outcome: str,
        error_code: str | None,
        ttft_s: float | None,
        *,
        reached_worker: bool,
    ) -> None:
        """A request (or a fallen-back attempt) of ``arm`` ended: counted, and
        recorded in its window when its worker saw it."""
        metrics = self._metrics
        if metrics is not None:
            metrics.child(metrics.release_requests, release, arm, outcome).inc()
            if ttft_s is not None:
                metrics.child(metrics.release_ttft, release, arm).observe(ttft_s)
        if reached_worker:
            self.record(release, arm, is_failure(outcome, error_code), ttft_s)

    # -- config ---------------------------------------------------------------------

    def configure(self, configs: Sequence[ReleaseConfig]) -> None:
        """(Re)build from config: decisions carry over by name, and so do the
        windows of a release whose routes and window are unchanged."""
        old = self._entries
        entries: dict[str, Release] = {}
        for config in configs:
            before = old.get(config.name)
            kept = None
            if before is not None and _same_windows(before.config, config):
                kept = before.windows
            entry = Release(config, kept)
            if before is not None:
                entry.decision, entry.unsaved = before.decision, before.unsaved
                entry._update()
            entries[config.name] = entry
        self._entries = entries
        for name in old.keys() - entries.keys():
            self._forget_gauge(name)
        for entry in entries.values():
            self._show_percent(entry)

    # -- the background sync -------------------------------------------------------------

    async def sync(self) -> None:
        """Judge the gates, save this replica's rollbacks, follow the store,
        publish the figures (every :data:`SYNC_S`)."""
        if not self._entries:
            return
        entries = list(self._entries.values())
        now = self._clock()
        figures = {entry.name: entry.figures(now) for entry in entries}
        for entry in entries:
            self._judge(entry, figures[entry.name])
        store = self._store
        if store is not None:
            failure = await self._talk(store, entries, figures)
            self._note_store(failure)
        for entry in entries:
            self._show_percent(entry)

    def _judge(self, entry: Release, figures: Mapping[str, Figures]) -> None:
        if entry.rule is None or entry.state == "rolled_back":
            return
        stable, canary = figures[STABLE], figures[CANARY]
        why = judge(entry.rule, stable, canary)
        if why is None:
            return
        entry.roll_back(None if self._store is not None else self._wall())
        log.warning(
            "release %s: canary rolled back by its gate (%s): stable %s; canary %s",
            entry.name,
            why,
            _shown(stable),
            _shown(canary),
        )
        if self._metrics is not None:
            self._metrics.child(self._metrics.release_rollbacks, entry.name).inc()
        self._show_percent(entry)
        # Saved by a sync now, not at the next tick: the fleet follows sooner.
        self._wake.set()

    async def _talk(
        self,
        store: ReleaseStore,
        entries: list[Release],
        figures: Mapping[str, Mapping[str, Figures]],
    ) -> str | None:
        """One round with the store; why it failed (None: it answered)."""
        try:
            async with asyncio.timeout(STORE_TIMEOUT_S):
                for entry in entries:
                    if entry.unsaved:
                        at = self._wall()
                        await store.decide(entry.name, "rolled_back", 0.0, at)
                        entry.roll_back(at)
                standing = await store.overrides()
                for entry in entries:
                    entry.follow(standing.get(entry.name))
                counts = {
                    name: {arm: _counts(f) for arm, f in arms.items()}
                    for name, arms in figures.items()
                }
                await store.publish(self._replica, counts, self._wall())
        except TimeoutError:
            return "timeout"
        except GatewayError as exc:
            return exc.code
        except Exception as exc:  # a driver's own error: the store is unusable just the same
            return type(exc).__name__
        return None

    def _note_store(self, failure: str | None) -> None:
        if failure is not None and not self._store_down:
            log.warning(
                "releases: the state store failed (%s); keeping the last known decisions", failure
            )
        elif failure is None and self._store_down:
            log.info("releases: the state store answers again")
        self._store_down = failure is not None

    def _show_percent(self, entry: Release) -> None:
        # ``labels``, not the cached ``child``: a release a reload removes loses
        # its series (``_forget_gauge``), and a cached child would revive it.
        if self._metrics is not None:
            self._metrics.release_canary_percent.labels(entry.name).set(entry.percent)

    def _forget_gauge(self, name: str) -> None:
        if self._metrics is not None:
            with contextlib.suppress(KeyError):
                self._metrics.release_canary_percent.remove(name)

    async def _run(self) -> None:
        while True:
            try:
                await self.sync()
            except Exception:
                log.exception("releases: a sync failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._sync_s):
                    await self._wake.wait()
            self._wake.clear()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="releases")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _same_windows(before: ReleaseConfig, after: ReleaseConfig) -> bool:
    """Whether a reload keeps a release's windows: the same routes, the same width."""

    def width(config: ReleaseConfig) -> float:
        return config.gate.window_s if config.gate is not None else DEFAULT_WINDOW_S

    return (before.stable, before.canary, width(before)) == (
        after.stable,
        after.canary,
        width(after),
    )


def _counts(figures: Figures) -> ArmCounts:
    p95 = figures.ttft_p95_s
    return ArmCounts(figures.requests, figures.failures, None if p95 is None else p95 * 1000)


def _shown(figures: Figures) -> str:
    """One arm's figures for the rollback line (counts and times only, no tenant data)."""
    p95 = "-" if figures.ttft_p95_s is None else f"{figures.ttft_p95_s * 1000:.1f} ms"
    return f"{figures.requests} requests, failure rate {figures.failure_rate:.3f}, ttft p95 {p95}"
