"""The route table: which worker serves a route, resolved once per request
(spec §16), and each worker's admission capacity. No worker is contacted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from gateway.admission import AdmissionGroup
from gateway.config import GatewayConfig
from gateway.config.releases import ReleaseConfig
from gateway.upstream.client import Upstream
from gateway.upstream.launch import serve_identity
from gateway.upstream.releases import CANARY, STABLE, Releases
from gateway.upstream.table import Resolved, RouteTable, capacities
from tests.upstream.test_launch import LAUNCH

CHAT_A, CHAT_B, EMBED = "/srv/models/chat-a", "/srv/models/chat-b", "/srv/models/embed"


def _two_workers(**admission: Any) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "upstreams": [
                {
                    "name": "chat",
                    "base_url": "http://127.0.0.1:1234",
                    "routes": [CHAT_A, CHAT_B],
                    "capacity": 3,
                },
                {"name": "embed", "base_url": "http://127.0.0.1:1235", "routes": [EMBED]},
            ],
            "admission": {"capacity": 5, **admission},
        }
    )


def _one_worker(**upstream: Any) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {"upstream": {"base_url": "http://127.0.0.1:1234", "route": CHAT_A, **upstream}}
    )


@asynccontextmanager
async def _table(config: GatewayConfig) -> AsyncIterator[RouteTable]:
    table = RouteTable.build(config, AdmissionGroup(capacities(config), 16))
    try:
        yield table
    finally:
        await table.aclose()


@pytest.fixture
async def table() -> AsyncIterator[RouteTable]:
    async with _table(_two_workers()) as built:
        yield built


class _Readiness:
    """Readiness per route; records which routes were asked about."""

    def __init__(self, *ready: str) -> None:
        self._ready = set(ready)
        self.asked: list[str] = []

    def ready(self, route: str) -> bool:
        self.asked.append(route)
        return route in self._ready


MODELS = {"chat": CHAT_A, "chat-large": CHAT_B, "embed": EMBED}


# -- capacities ----------------------------------------------------------------


def test_capacities_take_each_workers_own_or_the_default() -> None:
    assert capacities(_two_workers()) == {"chat": 3, "embed": 5}


def test_capacities_of_the_one_worker_form_is_named_default() -> None:
    assert capacities(_one_worker()) == {"default": 8}
    assert capacities(_one_worker(capacity=2)) == {"default": 2}


# -- building ----------------------------------------------------------------------


async def test_build_makes_one_worker_per_upstream(table: RouteTable) -> None:
    assert sorted(table.workers) == ["chat", "embed"]
    chat = table.workers["chat"]
    assert chat.name == "chat" and chat.config.served_routes == [CHAT_A, CHAT_B]
    assert isinstance(chat.client, Upstream)
    assert chat.client.config is chat.config
    # The worker's admission pool is the group's, with its own capacity.
    assert chat.admission is table.admissions["chat"]
    assert chat.admission.capacity == 3
    assert table.workers["embed"].admission.capacity == 5


async def test_each_worker_gets_its_own_client(table: RouteTable) -> None:
    chat, embed = table.workers["chat"], table.workers["embed"]
    assert chat.client is not embed.client
    assert (chat.config.port, embed.config.port) == (1234, 1235)


async def test_a_worker_without_launch_has_no_serve_identity(table: RouteTable) -> None:
    assert all(w.serve_identity is None for w in table.workers.values())


async def test_a_launched_worker_carries_its_serve_identity() -> None:
    config = _one_worker(route=LAUNCH["model_dir"], launch=LAUNCH)
    assert config.upstream is not None and config.upstream.launch is not None
    async with _table(config) as table:
        worker = table.workers["default"]
        assert worker.serve_identity == serve_identity(config.upstream.launch)
        assert worker.serve_identity is not None and len(worker.serve_identity) == 64


async def test_routes_lists_every_served_route_in_config_order(table: RouteTable) -> None:
    assert table.routes == [CHAT_A, CHAT_B, EMBED]
    table.routes.append("/elsewhere")  # a copy: the table is not changed
    assert table.routes == [CHAT_A, CHAT_B, EMBED]


async def test_worker_for_maps_each_route_to_its_worker(table: RouteTable) -> None:
    assert table.worker_for(CHAT_A) is table.workers["chat"]
    assert table.worker_for(CHAT_B) is table.workers["chat"]
    assert table.worker_for(EMBED) is table.workers["embed"]
    with pytest.raises(KeyError):
        table.worker_for("/not/configured")


# -- resolve -----------------------------------------------------------------------


async def test_resolve_gives_alias_route_worker_and_readiness(table: RouteTable) -> None:
    readiness = _Readiness(CHAT_A, EMBED)
    resolved = table.resolve(MODELS, "chat", readiness)
    assert resolved is not None
    assert (resolved.alias, resolved.route) == ("chat", CHAT_A)
    assert resolved.worker is table.workers["chat"]
    assert resolved.ready is True
    assert readiness.asked == [CHAT_A]


async def test_resolve_consults_readiness_per_route_not_per_worker(table: RouteTable) -> None:
    # chat-a is ready, chat-b on the same worker is not: each route answers for itself.
    readiness = _Readiness(CHAT_A)
    large = table.resolve(MODELS, "chat-large", readiness)
    small = table.resolve(MODELS, "chat", readiness)
    assert large is not None and small is not None
    assert large.worker is small.worker
    assert (large.ready, small.ready) == (False, True)
    assert readiness.asked == [CHAT_B, CHAT_A]


async def test_resolve_of_an_alias_the_policy_no_longer_names_is_none(table: RouteTable) -> None:
    readiness = _Readiness(CHAT_A)
    assert table.resolve(MODELS, "gone", readiness) is None
    assert table.resolve({}, "chat", readiness) is None
    assert readiness.asked == []  # nothing to ask about


async def test_resolve_follows_the_policy_it_is_given(table: RouteTable) -> None:
    # A reload that moves the alias applies to the next resolve, not to a result held.
    readiness = _Readiness(CHAT_A, EMBED)
    before = table.resolve({"a": CHAT_A}, "a", readiness)
    after = table.resolve({"a": EMBED}, "a", readiness)
    assert before is not None and after is not None
    assert (before.route, before.worker.name) == (CHAT_A, "chat")
    assert (after.route, after.worker.name) == (EMBED, "embed")


async def test_resolved_is_immutable(table: RouteTable) -> None:
    resolved = table.resolve(MODELS, "embed", _Readiness())
    assert resolved is not None and resolved.ready is False
    with pytest.raises(AttributeError):
        resolved.ready = True  # type: ignore[misc]


# -- releases (spec §18) -----------------------------------------------------------


def _with_release(**release: Any) -> RouteTable:
    """A table whose ``chat`` release runs chat-a (stable) against embed's worker (canary)."""
    config = _two_workers()
    fields: dict[str, Any] = {"name": "chat", "stable": CHAT_A, "canary": EMBED}
    fields.update(release)
    table = RouteTable.build(config, AdmissionGroup(capacities(config), 16))
    table.releases = Releases([ReleaseConfig.model_validate(fields)])
    return table


RELEASED = {"chat": "release:chat", "plain": CHAT_B}


def _arm_of(table: RouteTable, readiness: _Readiness, subject: str) -> Resolved:
    resolved = table.resolve(RELEASED, "chat", readiness, tenant="acme", subject=subject)
    assert resolved is not None
    return resolved


async def test_a_release_alias_resolves_to_its_cohorts_arm() -> None:
    table = _with_release(canary_percent=50)
    readiness = _Readiness(CHAT_A, EMBED)
    arms = {}
    for i in range(40):
        resolved = _arm_of(table, readiness, f"user-{i}")
        expected = table.releases.assign("chat", "acme", f"user-{i}", "")
        assert (resolved.release, resolved.arm) == ("chat", expected)
        assert resolved.route == (EMBED if expected == CANARY else CHAT_A)
        assert resolved.worker is table.workers["embed" if expected == CANARY else "chat"]
        assert resolved.ready
        other = resolved.other
        assert other is not None and other.arm != resolved.arm and other.other is None
        assert other.route == (CHAT_A if expected == CANARY else EMBED)
        arms[expected] = True
    assert sorted(arms) == [CANARY, STABLE]
    await table.aclose()


async def test_an_unready_canary_sends_its_cohorts_to_stable() -> None:
    table = _with_release(canary_percent=100)
    resolved = _arm_of(table, _Readiness(CHAT_A), "user-1")
    assert (resolved.arm, resolved.route, resolved.ready) == (STABLE, CHAT_A, True)
    assert resolved.other is not None and resolved.other.ready is False
    # The release is not ready when stable is not, whatever the canary says.
    resolved = _arm_of(table, _Readiness(EMBED), "user-1")
    assert (resolved.arm, resolved.ready) == (CANARY, True)
    stable_cohort = _with_release(canary_percent=0)
    assert _arm_of(stable_cohort, _Readiness(EMBED), "user-1").ready is False
    await table.aclose()
    await stable_cohort.aclose()


async def test_without_fallback_there_is_no_other_arm() -> None:
    table = _with_release(canary_percent=50, fallback=False)
    readiness = _Readiness(CHAT_A, EMBED)
    assert all(_arm_of(table, readiness, f"u{i}").other is None for i in range(20))
    await table.aclose()


async def test_plain_routes_resolve_as_before_beside_a_release() -> None:
    table = _with_release(canary_percent=50)
    readiness = _Readiness(CHAT_B)
    plain = table.resolve(RELEASED, "plain", readiness, tenant="acme", subject="u")
    assert plain is not None and (plain.route, plain.release, plain.arm) == (CHAT_B, None, None)
    assert plain.other is None and readiness.asked == [CHAT_B]
    assert table.readiness_route("release:chat") == CHAT_A
    assert table.readiness_route(CHAT_B) == CHAT_B
    # A release a reload removed resolves to nothing.
    table.releases.configure([])
    assert table.resolve(RELEASED, "chat", readiness, tenant="acme", subject="u") is None
    await table.aclose()


async def test_aclose_closes_every_workers_client() -> None:
    async with _table(_two_workers()) as table:
        clients = [w.client for w in table.workers.values()]
        assert all(isinstance(c, Upstream) and not c.closed for c in clients)
        await table.aclose()
        assert all(isinstance(c, Upstream) and c.closed for c in clients)
