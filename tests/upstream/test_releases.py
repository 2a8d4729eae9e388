"""Releases in the request path (spec §18), with a fake clock and an in-memory
store: the cohort split, stickiness and monotonicity, following the store's
decisions, the gate's rollbacks (one log line, one count, persisted), store
outages, and a SIGHUP's rebuild."""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Mapping
from typing import Any

import pytest

from gateway.books.protocols import ArmCounts, ReleaseOverride
from gateway.config.releases import ReleaseConfig
from gateway.core.errors import GatewayError
from gateway.observe.metrics import GatewayMetrics
from gateway.upstream.releases import CANARY, STABLE, Release, Releases, is_failure
from tests.support.poll import eventually_async

STABLE_ROUTE, CANARY_ROUTE = "/srv/models/old", "/srv/models/new"
N = 10_000


class FakeStore:
    """A :class:`~gateway.books.protocols.ReleaseStore` in memory; ``down`` makes
    every call fail the way the real ones do."""

    def __init__(self) -> None:
        self.decisions: dict[str, ReleaseOverride] = {}
        self.published: list[tuple[str, dict[str, dict[str, ArmCounts]], float]] = []
        self.down = False
        self.decided: list[tuple[str, str, float]] = []

    def _check(self) -> None:
        if self.down:
            raise GatewayError("state_unavailable")

    async def overrides(self) -> dict[str, ReleaseOverride]:
        self._check()
        return dict(self.decisions)

    async def decide(self, name: str, state: str, percent: float, now: float) -> None:
        self._check()
        self.decided.append((name, state, percent))
        self.decisions[name] = ReleaseOverride(name, state, percent, now)

    async def clear(self, name: str) -> bool:
        self._check()
        return self.decisions.pop(name, None) is not None

    async def publish(
        self, replica: str, figures: Mapping[str, Mapping[str, ArmCounts]], now: float
    ) -> None:
        self._check()
        self.published.append((replica, {k: dict(v) for k, v in figures.items()}, now))

    async def figures(self, since: float) -> dict[str, dict[str, dict[str, ArmCounts]]]:
        return {}


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def release(**overrides: Any) -> ReleaseConfig:
    fields: dict[str, Any] = {
        "name": "chat",
        "stable": STABLE_ROUTE,
        "canary": CANARY_ROUTE,
        "canary_percent": 5,
        "cohort": "subject",
    }
    fields.update(overrides)
    return ReleaseConfig.model_validate(fields)


GATE = {"window_s": 60, "min_requests": 20, "max_failure_rate_delta": 0.05}


def build(
    *configs: ReleaseConfig, store: FakeStore | None = None, clock: Clock | None = None
) -> tuple[Releases, GatewayMetrics]:
    metrics = GatewayMetrics()
    releases = Releases(
        configs or (release(),),
        metrics,
        store=store,
        replica="r1",
        clock=clock or Clock(),
        wall=Clock(1_750_000_000.0),
    )
    return releases, metrics


def sample(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def entry(releases: Releases, name: str = "chat") -> Release:
    found = releases.get(name)
    assert found is not None
    return found


def canaries(releases: Releases, keys: range = range(N), tenant: str = "acme") -> set[int]:
    return {i for i in keys if releases.assign("chat", tenant, f"user-{i}", "req") == CANARY}


# -- assignment -------------------------------------------------------------------


@pytest.mark.parametrize("percent", [5, 50])
def test_the_split_holds_within_a_binomial_bound(percent: float) -> None:
    releases, _ = build(release(canary_percent=percent))
    got = len(canaries(releases))
    p = percent / 100
    sd = math.sqrt(N * p * (1 - p))
    assert abs(got - N * p) < 4 * sd, (got, N * p)


def test_assignment_is_the_specs_hash() -> None:
    releases, _ = build(release(canary_percent=50))
    for i in range(200):
        digest = hashlib.sha256(f"chat\nacme\nuser-{i}".encode()).digest()
        expected = CANARY if int.from_bytes(digest[:8], "big") % 10_000 < 5_000 else STABLE
        assert releases.assign("chat", "acme", f"user-{i}", "ignored") == expected


def test_a_subject_keeps_its_arm_and_each_tenant_is_its_own_cohort() -> None:
    releases, _ = build(release(canary_percent=50))
    first = [releases.assign("chat", "acme", f"user-{i}", f"req-{i}") for i in range(100)]
    again = [releases.assign("chat", "acme", f"user-{i}", f"other-{i}") for i in range(100)]
    assert first == again
    # The same sub under another tenant is another cohort.
    globex = [releases.assign("chat", "globex", f"user-{i}", "r") for i in range(100)]
    assert globex != first


def test_tenant_and_request_cohorts() -> None:
    by_tenant, _ = build(release(canary_percent=50, cohort="tenant"))
    arms = {by_tenant.assign("chat", "acme", f"user-{i}", f"req-{i}") for i in range(200)}
    assert len(arms) == 1, "a whole tenant shares one arm"
    tenants = {by_tenant.assign("chat", f"t{i}", "u", "r") for i in range(200)}
    assert tenants == {STABLE, CANARY}
    by_request, _ = build(release(canary_percent=50, cohort="request"))
    arms = {by_request.assign("chat", "acme", "user-1", f"req-{i}") for i in range(200)}
    assert arms == {STABLE, CANARY}, "no stickiness by subject"


async def test_raising_the_percent_only_moves_stable_cohorts() -> None:
    store = FakeStore()
    releases, _ = build(release(canary_percent=5), store=store)
    before = canaries(releases)
    for percent in (20.0, 50.0, 99.0):
        store.decisions["chat"] = ReleaseOverride("chat", "override", percent, 1.0)
        await releases.sync()
        after = canaries(releases)
        assert before <= after and len(after) > len(before)
        before = after


def test_zero_and_a_hundred_percent_need_no_hash() -> None:
    none, _ = build(release(canary_percent=0))
    every, _ = build(release(canary_percent=100))
    assert canaries(none) == set()
    assert len(canaries(every)) == N


# -- following the store ------------------------------------------------------------


async def test_override_rollback_and_clear_are_followed() -> None:
    store = FakeStore()
    releases, metrics = build(release(canary_percent=5), store=store)
    gauge = "gateway_release_canary_percent"
    assert releases.percent("chat") == 5 and sample(metrics, gauge, release="chat") == 5
    store.decisions["chat"] = ReleaseOverride("chat", "override", 40, 1.0)
    await releases.sync()
    assert releases.percent("chat") == 40 and entry(releases).state == "override"
    assert sample(metrics, gauge, release="chat") == 40
    store.decisions["chat"] = ReleaseOverride("chat", "rolled_back", 0, 2.0)
    await releases.sync()
    assert releases.percent("chat") == 0 and canaries(releases) == set()
    assert sample(metrics, gauge, release="chat") == 0
    del store.decisions["chat"]
    await releases.sync()
    assert releases.percent("chat") == 5 and entry(releases).state == "config"
    # An operator's rollback is not the gate's.
    assert sample(metrics, "gateway_release_rollbacks_total", release="chat") is None


async def test_each_sync_publishes_this_replicas_figures() -> None:
    store = FakeStore()
    releases, _ = build(store=store)
    releases.record("chat", STABLE, False, 0.1)
    releases.record("chat", CANARY, True, None)
    await releases.sync()
    replica, figures, _ = store.published[-1]
    assert replica == "r1"
    assert figures["chat"][STABLE].requests == 1 and figures["chat"][STABLE].failures == 0
    assert figures["chat"][CANARY] == ArmCounts(1, 1, None)
    p95 = figures["chat"][STABLE].ttft_p95_ms
    assert p95 is not None and 100 <= p95 <= 125


async def test_an_outage_keeps_the_last_decisions_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.releases")
    store = FakeStore()
    releases, _ = build(store=store)
    store.decisions["chat"] = ReleaseOverride("chat", "override", 30, 1.0)
    await releases.sync()
    store.down = True
    store.decisions.clear()
    for _ in range(3):
        await releases.sync()
    assert releases.percent("chat") == 30, "the last known decision stands"
    failed = [r for r in caplog.records if "state store failed" in r.getMessage()]
    assert len(failed) == 1 and "state_unavailable" in failed[0].getMessage()
    store.down = False
    await releases.sync()
    assert releases.percent("chat") == 5, "the store's word again: cleared"
    assert any("answers again" in r.getMessage() for r in caplog.records)


# -- the gate -------------------------------------------------------------------------


def _traffic(
    releases: Releases, arm: str, n: int, failures: int, ttft_s: float, *, spread: bool = False
) -> None:
    """``n`` requests of ``arm``, ``failures`` of them failed: the first ones,
    or (``spread``) evenly among them, so that every prefix has its share."""
    for i in range(n):
        failed = (i + 1) * failures // n > i * failures // n if spread else i < failures
        releases.record("chat", arm, failed, None if failed else ttft_s)


def _rollback_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "rolled back by its gate" in r.getMessage()
    ]


async def test_a_failing_canary_is_rolled_back_once_and_persisted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.releases")
    store = FakeStore()
    releases, metrics = build(release(canary_percent=50, gate=GATE), store=store)
    _traffic(releases, STABLE, 40, 0, 0.05)
    _traffic(releases, CANARY, 40, 10, 0.05)
    # Judged on each request: it tripped at the canary's 20th (10 of them failed).
    assert releases.percent("chat") == 0 and canaries(releases) == set()
    assert store.decided == []  # saved by the next sync
    await releases.sync()
    assert store.decided == [("chat", "rolled_back", 0.0)]
    assert sample(metrics, "gateway_release_rollbacks_total", release="chat") == 1
    assert sample(metrics, "gateway_release_canary_percent", release="chat") == 0
    [line] = _rollback_lines(caplog)
    assert "failure_rate" in line and "20 requests" in line and "0.500" in line
    assert "acme" not in line and "user-" not in line
    # Judged again and again: still one line, one count, one decision.
    _traffic(releases, CANARY, 40, 40, 0.05)
    await releases.sync()
    await releases.sync()
    assert len(_rollback_lines(caplog)) == 1
    assert sample(metrics, "gateway_release_rollbacks_total", release="chat") == 1
    assert store.decided == [("chat", "rolled_back", 0.0)]


async def test_the_gate_is_judged_on_each_finished_request_not_on_a_timer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Spec §24: with ``min_requests: 5``, a failing canary is rolled back by
    the request that gives it its 5th in the window, with no sync in between
    (on a one-second timer 12 of 12 failing canary requests passed first)."""
    caplog.set_level(logging.WARNING, logger="gateway.releases")
    gate = {"window_s": 60, "min_requests": 5, "max_failure_rate_delta": 0.05}
    releases, metrics = build(release(canary_percent=50, gate=gate), store=FakeStore())
    _traffic(releases, STABLE, 5, 0, 0.05)
    passed = 0
    for _ in range(12):
        if releases.percent("chat") == 0:
            break  # no canary request is assigned once rolled back
        releases.settled("chat", CANARY, "upstream_error", "upstream_unavailable", None,
                         reached_worker=True)  # fmt: skip
        passed += 1
    assert passed == 5
    assert releases.percent("chat") == 0 and canaries(releases) == set()
    assert sample(metrics, "gateway_release_rollbacks_total", release="chat") == 1
    [line] = _rollback_lines(caplog)
    assert "5 requests" in line and "1.000" in line


async def test_the_gate_waits_for_min_requests_on_both_arms() -> None:
    gate = {"window_s": 60, "min_requests": 5, "max_failure_rate_delta": 0.05}
    releases, _ = build(release(canary_percent=50, gate=gate), store=FakeStore())
    _traffic(releases, CANARY, 20, 20, 0.05)  # all failed, but stable has none yet
    _traffic(releases, STABLE, 4, 0, 0.05)
    assert releases.percent("chat") == 50
    _traffic(releases, STABLE, 1, 0, 0.05)  # stable's 5th: now it judges
    assert releases.percent("chat") == 0


async def test_a_slow_canary_is_rolled_back_by_its_ttft_gate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.releases")
    store = FakeStore()
    releases, _ = build(release(canary_percent=50, gate=GATE), store=store)
    _traffic(releases, STABLE, 30, 0, 0.05)
    _traffic(releases, CANARY, 30, 0, 0.5)
    await releases.sync()
    assert releases.percent("chat") == 0
    [line] = _rollback_lines(caplog)
    assert "ttft_p95" in line


async def test_no_verdict_before_min_requests_or_within_the_bounds() -> None:
    store = FakeStore()
    releases, _ = build(release(canary_percent=50, gate=GATE), store=store)
    _traffic(releases, STABLE, 40, 0, 0.05)
    _traffic(releases, CANARY, 19, 19, 0.05)  # every one failed, but too few to judge
    await releases.sync()
    assert releases.percent("chat") == 50
    fresh, _ = build(release(canary_percent=50, gate=GATE), store=store)
    # +4 % failures, TTFT x1.8: within the gate at every request it is judged on
    _traffic(fresh, STABLE, 100, 2, 0.05, spread=True)
    _traffic(fresh, CANARY, 100, 6, 0.09, spread=True)
    await fresh.sync()
    assert fresh.percent("chat") == 50 and store.decided == []


async def test_failures_leave_the_window_as_it_moves() -> None:
    clock = Clock()
    releases, _ = build(release(canary_percent=50, gate=GATE), store=FakeStore(), clock=clock)
    _traffic(releases, CANARY, 30, 30, 0.05)
    clock.now += 61  # a whole window later
    _traffic(releases, STABLE, 30, 0, 0.05)
    _traffic(releases, CANARY, 30, 0, 0.05)
    await releases.sync()
    assert releases.percent("chat") == 50


async def test_a_rollback_the_store_did_not_take_stands_and_is_retried() -> None:
    store = FakeStore()
    releases, _ = build(release(canary_percent=50, gate=GATE), store=store)
    _traffic(releases, STABLE, 20, 0, 0.05)
    _traffic(releases, CANARY, 20, 20, 0.05)
    store.down = True
    await releases.sync()
    assert releases.percent("chat") == 0, "effective on this replica at once"
    assert store.decided == []
    store.down = False
    await releases.sync()
    assert store.decided == [("chat", "rolled_back", 0.0)]
    assert releases.percent("chat") == 0 and store.decisions["chat"].state == "rolled_back"


async def test_after_a_clear_the_old_failures_do_not_trip_the_gate_again() -> None:
    store = FakeStore()
    releases, _ = build(release(canary_percent=50, gate=GATE), store=store)
    _traffic(releases, STABLE, 20, 0, 0.05)
    _traffic(releases, CANARY, 20, 20, 0.05)
    await releases.sync()
    assert releases.percent("chat") == 0
    await store.clear("chat")  # the operator: back to the config
    await releases.sync()
    await releases.sync()
    assert releases.percent("chat") == 50 and store.decided == [("chat", "rolled_back", 0.0)]


async def test_without_a_store_the_gate_still_rolls_back() -> None:
    releases, _ = build(release(canary_percent=50, gate=GATE))
    _traffic(releases, STABLE, 20, 0, 0.05)
    _traffic(releases, CANARY, 20, 20, 0.05)
    await releases.sync()
    assert releases.percent("chat") == 0 and entry(releases).state == "rolled_back"


# -- what counts ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "code", "failed"),
    [
        ("complete", None, False),
        ("protocol_error", "upstream_protocol_error", True),
        ("upstream_error", "upstream_error", True),
        ("incomplete", "upstream_unavailable", True),
        ("incomplete", "upstream_timeout", True),
        ("upstream_error", "upstream_rejected", False),  # the worker's 400
        ("rejected", "rate_limited", False),
        ("rejected", "upstream_not_ready", False),
        ("canceled", None, False),
    ],
)
def test_failures_are_worker_faults(outcome: str, code: str | None, failed: bool) -> None:
    assert is_failure(outcome, code) is failed


async def test_settled_counts_every_request_and_windows_only_those_sent() -> None:
    store = FakeStore()
    releases, metrics = build(store=store)
    releases.settled("chat", CANARY, "complete", None, 0.2, reached_worker=True)
    releases.settled("chat", CANARY, "upstream_error", "upstream_error", None, reached_worker=True)
    releases.settled("chat", STABLE, "rejected", "upstream_not_ready", None, reached_worker=False)
    releases.settled("gone", STABLE, "complete", None, None, reached_worker=True)  # no such release
    name = "gateway_release_requests_total"
    assert sample(metrics, name, release="chat", arm="canary", outcome="complete") == 1
    assert sample(metrics, name, release="chat", arm="canary", outcome="upstream_error") == 1
    assert sample(metrics, name, release="chat", arm="stable", outcome="rejected") == 1
    assert sample(metrics, "gateway_release_ttft_seconds_count", release="chat", arm="canary") == 1
    await releases.sync()
    figures = store.published[-1][1]["chat"]
    assert (figures[CANARY].requests, figures[CANARY].failures) == (2, 1)
    assert figures[STABLE].requests == 0


# -- SIGHUP ---------------------------------------------------------------------------


async def test_a_rebuild_keeps_decisions_and_the_windows_of_unchanged_routes() -> None:
    store = FakeStore()
    releases, metrics = build(
        release(canary_percent=5), release(name="embed", canary_percent=10), store=store
    )
    store.decisions["chat"] = ReleaseOverride("chat", "override", 25, 1.0)
    await releases.sync()
    releases.record("chat", CANARY, False, 0.1)
    releases.record("embed", CANARY, False, 0.1)
    releases.configure(
        [
            release(canary_percent=7),  # a new percent: routes unchanged
            release(name="embed", canary="/srv/models/newer", canary_percent=10),
        ]
    )
    chat, embed = releases.get("chat"), releases.get("embed")
    assert chat is not None and embed is not None
    assert chat.percent == 25, "the standing override outlives the reload"
    assert chat.figures(1_000.0)[CANARY].requests == 1
    assert embed.figures(1_000.0)[CANARY].requests == 0, "a new canary route starts afresh"
    releases.configure([release(canary_percent=7)])
    assert releases.get("embed") is None
    assert sample(metrics, "gateway_release_canary_percent", release="embed") is None
    del store.decisions["chat"]
    await releases.sync()
    assert releases.percent("chat") == 7


async def test_the_background_task_syncs_until_closed() -> None:
    store = FakeStore()
    releases = Releases([release()], GatewayMetrics(), store=store, sync_s=0.01)
    releases.start()
    try:
        await eventually_async(lambda: len(store.published) >= 2, "two syncs")
    finally:
        await releases.aclose()
    seen = len(store.published)
    await releases.sync()  # by hand still works; the task is gone
    assert len(store.published) == seen + 1


async def test_a_rollback_on_the_request_path_is_saved_without_waiting_for_the_tick() -> None:
    store = FakeStore()
    gate = {"window_s": 60, "min_requests": 5, "max_failure_rate_delta": 0.05}
    releases = Releases(
        [release(canary_percent=50, gate=gate)], GatewayMetrics(), store=store, sync_s=3600
    )
    releases.start()
    try:
        await eventually_async(lambda: len(store.published) == 1, "the first sync")
        _traffic(releases, STABLE, 5, 0, 0.05)
        _traffic(releases, CANARY, 5, 5, 0.05)
        await eventually_async(lambda: bool(store.decided), "the rollback saved", timeout_s=5)
    finally:
        await releases.aclose()
    assert store.decided == [("chat", "rolled_back", 0.0)]


async def test_no_releases_no_store_calls() -> None:
    store = FakeStore()
    releases = Releases([], GatewayMetrics(), store=store)
    await releases.sync()
    assert not releases and store.published == []
